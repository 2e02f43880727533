import type { ChatMessage } from "./types";

// vLLM's "string" content format: the text parts of a multi-part content joined with "\n"; non-text parts
// (images, audio) contribute nothing to the text a text-only tokenizer sees.
export function messageText(m: ChatMessage): string {
  const c = m.content;
  if (c === undefined || c === null) return "";
  if (typeof c === "string") return c;
  return c.filter((p) => p.type === "text" && typeof p.text === "string").map((p) => p.text as string).join("\n");
}

/** A chat the request's input cannot render (the template raised, or continue_final_message cannot apply): a 400, as vLLM answers. */
export class ChatTemplateError extends Error {
  override name = "ChatTemplateError";
}

/**
 * Messages as vLLM hands them to the chat template: content flattened to a string, and an
 * assistant's tool calls with their `arguments` as objects (vLLM parses the JSON string, empty -> {},
 * so templates print them with `tojson`); an empty `tool_calls` list is dropped. Other fields untouched.
 */
export function templateMessages(messages: readonly ChatMessage[]): ChatMessage[] {
  return messages.map((m) => {
    let out: ChatMessage = typeof m.content === "string" ? m : { ...m, content: messageText(m) };
    if (m.role === "assistant" && Array.isArray(m.tool_calls)) {
      if (m.tool_calls.length === 0) {
        const { tool_calls: _drop, ...rest } = out;
        out = rest as ChatMessage;
      } else out = { ...out, tool_calls: m.tool_calls.map(toolCallForTemplate) };
    }
    return out;
  });
}

function toolCallForTemplate(call: unknown): unknown {
  const fn = (call as { function?: { arguments?: unknown } } | null)?.function;
  if (typeof fn !== "object" || fn === null) return call;
  const args = fn.arguments;
  if (typeof args === "object" && args !== null) return call;
  let parsed: unknown = {};
  if (typeof args === "string" && args !== "") {
    try {
      parsed = JSON.parse(args);
    } catch {
      throw new ChatTemplateError("a tool call's function.arguments is not valid JSON");
    }
  }
  return { ...(call as object), function: { ...fn, arguments: parsed } };
}

/**
 * `tools` as vLLM passes them to the template (its pydantic model_dump): `{type, function: {name,
 * description, parameters}}` in that order, absent fields as null.
 */
export function templateTools(tools: readonly unknown[]): unknown[] {
  return tools.map((t) => {
    const tool = (t ?? {}) as { type?: unknown; function?: { name?: unknown; description?: unknown; parameters?: unknown } };
    const fn = tool.function ?? {};
    return { type: tool.type ?? "function", function: { name: fn.name, description: fn.description ?? null, parameters: fn.parameters ?? null } };
  });
}

/**
 * continue_final_message as transformers' apply_chat_template does it: find the last occurrence of the
 * final message's text stripped; cut after the text as written when the template kept it (leading
 * whitespace aside), else after the stripped text (the template trimmed trailing whitespace).
 */
export function continueFinalMessage(rendered: string, messages: readonly ChatMessage[]): string {
  const last = messages.at(-1);
  if (last === undefined) return rendered;
  const text = messageText(last);
  const stripped = text.trim();
  const at = rendered.lastIndexOf(stripped);
  if (at < 0) throw new ChatTemplateError("continue_final_message is set but the final message does not appear in the rendered chat");
  const kept = text.trimStart().length;
  return rendered.slice(0, rendered.slice(at, at + kept) === text ? at + kept : at + stripped.length);
}
