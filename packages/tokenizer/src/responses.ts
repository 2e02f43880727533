// A /v1/responses body as the chat it is rendered from. vLLM builds the chat messages from `instructions` and
// `input` (vllm/entrypoints/openai/responses/utils.py: construct_input_messages,
// _construct_message_from_response_item, should_continue_final_message) and renders them through the chat
// template like a /v1/chat/completions request. The EPP routes by these tokens and the mock worker
// caches them, so both build the chat here.
import type { ChatMessage } from "./types";

/** A /v1/responses body vLLM would refuse (a 400): the message says why. */
export class ResponsesInputError extends Error {}

type Item = Record<string, unknown>;
type ToolCall = { id: unknown; type: "function"; function: { name: unknown; arguments: unknown } };

export type ResponsesChat = { messages: ChatMessage[]; tools?: unknown[]; continueFinalMessage: boolean };

export function responsesChat(instructions: unknown, input: unknown, tools: unknown): ResponsesChat {
  const messages: ChatMessage[] = [];
  if (instructions !== undefined && instructions !== null && typeof instructions !== "string") throw new ResponsesInputError("instructions must be a string");
  if (instructions) messages.push({ role: "system", content: instructions });
  if (typeof input === "string") messages.push({ role: "user", content: input });
  else if (Array.isArray(input)) {
    for (const item of input) {
      if (typeof item !== "object" || item === null || Array.isArray(item)) throw new ResponsesInputError("input items must be objects");
      const m = messageFrom(item as Item, messages.at(-1));
      if (m !== undefined) messages.push(m);
    }
  } else throw new ResponsesInputError("input must be a string or an array of items");
  return { messages, tools: chatTools(tools), continueFinalMessage: continuesLast(input) };
}

/** A new message for `item`, or undefined when it was merged into the previous assistant message. */
function messageFrom(item: Item, prev: ChatMessage | undefined): ChatMessage | undefined {
  const assistant = prev?.role === "assistant" ? prev : undefined;
  const call = toolCallOf(item);
  if (call !== undefined) {
    if (assistant !== undefined) {
      if (assistant.tool_calls === undefined || assistant.tool_calls === null) assistant.tool_calls = [call];
      else (assistant.tool_calls as ToolCall[]).push(call);
      return undefined;
    }
    return { role: "assistant", tool_calls: [call] };
  }
  switch (item.type) {
    case "reasoning": {
      if (item.encrypted_content) throw new ResponsesInputError("Encrypted content is not supported.");
      const reasoning = firstText(item.content) ?? firstText(item.summary) ?? "";
      if (assistant !== undefined && (assistant.reasoning === undefined || assistant.reasoning === null)) {
        assistant.reasoning = reasoning;
        return undefined;
      }
      return { role: "assistant", reasoning };
    }
    case "function_call_output":
    case "custom_tool_call_output":
      return { role: "tool", content: item.output as string, tool_call_id: item.call_id };
  }
  if (item.role === "assistant") {
    const text = typeof item.content === "string" ? item.content : firstText(item.content);
    if (text !== undefined) {
      if (assistant !== undefined && (assistant.content === undefined || assistant.content === null)) {
        assistant.content = text;
        return undefined;
      }
      return { role: "assistant", content: text };
    }
  }
  if (typeof item.role === "string") return item as ChatMessage;
  throw new ResponsesInputError(`Unsupported input item type: ${String(item.type)}`);
}

function toolCallOf(item: Item): ToolCall | undefined {
  if (item.type === "function_call") {
    return { id: item.call_id, type: "function", function: { name: item.name, arguments: item.arguments } };
  }
  if (item.type === "custom_tool_call") {
    return { id: item.call_id, type: "function", function: { name: item.name, arguments: JSON.stringify({ input: item.input }) } };
  }
  return undefined;
}

function firstText(parts: unknown): string | undefined {
  const first = Array.isArray(parts) ? (parts[0] as { text?: unknown } | undefined) : undefined;
  return typeof first?.text === "string" ? first.text : undefined;
}

/** The final item is an assistant message or reasoning still in progress: vLLM continues it. */
function continuesLast(input: unknown): boolean {
  if (!Array.isArray(input) || input.length === 0) return false;
  const last = input.at(-1) as Item;
  if (!["message", "reasoning", undefined].includes(last.type as string | undefined)) return false;
  return last.status === "in_progress" || last.status === "incomplete";
}

/** Responses function tools ({type, name, description, parameters}) in the chat shape the template gets. */
function chatTools(tools: unknown): unknown[] | undefined {
  if (tools === undefined || tools === null) return undefined;
  if (!Array.isArray(tools)) throw new ResponsesInputError("tools must be an array");
  const fns = tools.filter((t) => (t as Item | null)?.type === "function") as Item[];
  if (fns.length === 0) return undefined;
  return fns.map(({ type: _type, ...fn }) => ({ type: "function", function: fn }));
}
