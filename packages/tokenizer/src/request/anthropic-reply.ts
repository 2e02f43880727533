// The assistant's reply to a /v1/messages request, read from the response vLLM's Anthropic server writes (a JSON
// message, or the SSE stream of content_block_* events), for warming the conversation's next turn. An Anthropic
// client sends the reply back as the content blocks it received (thinking, text, tool_use: the API asks for the
// thinking blocks back in a tool loop), which the next request's conversion turns into a chat message: the reply
// is that message, built by the same conversion (anthropic-body.ts).
import type { ChatReply } from "./chat-reply";
import { assistantChatMessage } from "./anthropic-body";
import { isPyDict, parseJsonKeepingFloats } from "../py-values";

type Block = Record<string, unknown> & { type: string };
type Event = { type?: unknown; index?: unknown; content_block?: Block; delta?: Record<string, unknown>; message?: { role?: unknown } };

/** Whether a response body is vLLM's Anthropic message (a JSON one with `type: "message"`) rather than a chat completion. */
export const isAnthropicMessage = (doc: unknown): doc is MessageDoc => (doc as { type?: unknown } | null)?.type === "message";

/** Whether a response body is an Anthropic event stream: vLLM names each event on an `event:` line before its data. */
export const isAnthropicStream = (text: string): boolean => text.trimStart().startsWith("event:");

type MessageDoc = { type: "message"; content?: unknown; stop_reason?: unknown; role?: unknown };

/** A JSON Messages response's reply (see warmable), or undefined. */
export function anthropicReply(doc: MessageDoc): ChatReply | undefined {
  if (!Array.isArray(doc.content)) return undefined;
  return warmable(doc.content as Block[], doc.stop_reason, doc.role);
}

/**
 * A streamed Messages response's reply: each block opened by content_block_start and grown by its deltas (a
 * tool_use's input arrives as pieces of JSON text, parsed as the client parses it once whole), the stop reason from
 * message_delta; only a stream that reached message_stop with no error event.
 */
export function anthropicStreamReply(text: string): ChatReply | undefined {
  const blocks = new Map<number, Block>();
  const json = new Map<number, string>();
  let stop: unknown;
  let role: unknown;
  for (const line of text.split("\n")) {
    if (!line.startsWith("data:")) continue;
    const data = line.slice(5).trim();
    // A block's opening may hold a tool's input (vLLM's comes in deltas), read as the next request's is (see warmable).
    const e = (data.includes('"content_block_start"') ? parseJsonKeepingFloats(data) : JSON.parse(data)) as Event;
    switch (e.type) {
      case "message_start":
        role = e.message?.role;
        break;
      case "content_block_start":
        if (typeof e.index !== "number" || e.content_block === undefined) return undefined;
        blocks.set(e.index, { ...e.content_block });
        break;
      case "content_block_delta": {
        const b = typeof e.index === "number" ? blocks.get(e.index) : undefined;
        const d = e.delta;
        if (b === undefined || d === undefined) return undefined;
        if (d.type === "text_delta" && typeof d.text === "string") b.text = `${(b.text as string | undefined) ?? ""}${d.text}`;
        else if (d.type === "thinking_delta" && typeof d.thinking === "string") b.thinking = `${(b.thinking as string | undefined) ?? ""}${d.thinking}`;
        else if (d.type === "input_json_delta" && typeof d.partial_json === "string") json.set(e.index as number, (json.get(e.index as number) ?? "") + d.partial_json);
        break;
      }
      case "message_delta":
        stop = e.delta?.stop_reason ?? stop;
        break;
      case "error":
        return undefined;
      case "message_stop": {
        for (const [i, args] of json) {
          const b = blocks.get(i)!;
          b.input = parseJsonKeepingFloats(args);
        }
        return warmable([...blocks.values()], stop, role);
      }
    }
  }
  return undefined; // no message_stop: the stream was cut
}

/**
 * The reply as its next turn sends it back, when the client keeps it: text that ended its turn or ran out of tokens,
 * tool calls that ended in tool_use (or end_turn), as a chat completion's reply is warmed (chat-reply.ts). Not a
 * reply vLLM gave no stop reason (aborted), nor one without text or calls. A tool's input must have been read with
 * Python's numbers (parseJsonKeepingFloats), as vLLM reads it in the next request, whose arguments print it.
 */
function warmable(blocks: Block[], stop: unknown, role: unknown): ChatReply | undefined {
  const calls = blocks.some((b) => b.type === "tool_use");
  if (calls ? stop !== "tool_use" && stop !== "end_turn" : stop !== "end_turn" && stop !== "max_tokens" && stop !== "stop_sequence") return undefined;
  if (calls && blocks.some((b) => b.type === "tool_use" && !isPyDict(b.input))) return undefined;
  const message = assistantChatMessage(blocks);
  if (message === undefined || (!calls && message.content === undefined)) return undefined;
  // In the role the response names (always the assistant's): under another --response-role nextTurnJob warms nothing.
  return { ...message, role: typeof role === "string" ? role : "assistant" };
}
