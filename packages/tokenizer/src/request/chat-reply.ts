// The assistant's reply, read from a chat completion's response body (a JSON body or an SSE stream) by the pool
// member that warms the conversation's next turn with it (BodyJob.reply), not by the thread that routes.
import type { ChatMessage } from "../types";
import { anthropicReply, anthropicStreamReply, isAnthropicMessage, isAnthropicStream } from "./anthropic-reply";
import { parseJsonKeepingFloats } from "../py-values";

/**
 * A reply's message. The next turn sends it back in the role the server answered with, which nextTurnJob gives it
 * from the server's flags; `role`, the one the response said (vLLM always says it), tells a flag that differs from
 * the workers' own, and then nothing is warmed.
 */
export type ChatReply = { content?: ChatMessage["content"]; tool_calls?: unknown; role?: string; [field: string]: unknown };

/**
 * The reply as the next turn will send it back (its `content`, with its `tool_calls` if it made any; `role`, the one
 * the response named), or undefined
 * when there is none to warm with: not a chat completion, several choices, an empty reply, or one that did not
 * finish (see warmable; a stream must also end in `[DONE]` and carry no error). Reasoning is left out: clients
 * differ in whether they send it back. A /v1/messages response (vLLM's Anthropic message or event stream) is read
 * as the chat message its next request's conversion makes of it (anthropic-reply.ts).
 */
export function readChatReply(body: Uint8Array): ChatReply | undefined {
  if (body.length === 0) return undefined;
  const text = decoder.decode(body);
  try {
    if (!text.trimStart().startsWith("{")) return isAnthropicStream(text) ? anthropicStreamReply(text) : fromStream(text);
    // Python's numbers, where a Messages reply's tool input is printed from them (anthropic-reply.ts warmable); any
    // other reply (logprobs: thousands of floats) is read by plain JSON.parse, a callback per value cheaper.
    const doc = text.includes('"tool_use"') ? parseJsonKeepingFloats(text) : JSON.parse(text);
    return isAnthropicMessage(doc) ? anthropicReply(doc) : fromJson(doc as Chunk);
  } catch {
    return undefined; // not a body we can read: nothing to warm
  }
}

const decoder = new TextDecoder();

type Choice = { index?: number; message?: Message; delta?: Message; finish_reason?: string | null };
type Message = { role?: unknown; content?: string | null; tool_calls?: ToolCall[] };
type ToolCall = { index?: number; id?: string; type?: string; function?: { name?: string; arguments?: string } };
type StreamedCall = { id?: string; type: string; function: { name: string; arguments: string } };
/** A JSON body or a stream's chunk; vLLM sends `{error}` in place of a chunk when the generation fails midway. */
type Chunk = { choices?: Choice[]; error?: unknown; object?: unknown };

function fromJson(body: Chunk): ChatReply | undefined {
  const choices = body.choices ?? [];
  const c = choices[0];
  if (choices.length !== 1 || c?.message === undefined) return undefined;
  const calls = c.message.tool_calls;
  return withRole(warmable(c.message.content, Array.isArray(calls) ? calls : [], c.finish_reason), c.message.role);
}

function fromStream(text: string): ChatReply | undefined {
  let content = "";
  const calls = new Map<number, StreamedCall>();
  let finish: string | null | undefined;
  // vLLM sends the role with the first delta.
  let role: unknown;
  for (const line of text.split("\n")) {
    if (!line.startsWith("data:")) continue;
    const data = line.slice(5).trim();
    if (data === "[DONE]") return withRole(warmable(content, [...calls.values()], finish), role);
    const chunk = JSON.parse(data) as Chunk;
    // The content before an error is no reply the client keeps: `{"error": {...}}`, or an error response itself
    // (`"object": "error"`, as vLLM's streams sent it before they wrapped it).
    if (chunk.error !== undefined || chunk.object === "error") return undefined;
    for (const c of chunk.choices ?? []) {
      if ((c.index ?? 0) !== 0) return undefined;
      role ??= c.delta?.role;
      for (const d of c.delta?.tool_calls ?? []) addCallDelta(calls, d);
      if (typeof c.delta?.content === "string") content += c.delta.content;
      finish = c.finish_reason ?? finish;
    }
  }
  return undefined; // no [DONE]: the stream was cut
}

function withRole(reply: ChatReply | undefined, role: unknown): ChatReply | undefined {
  return reply !== undefined && typeof role === "string" ? { ...reply, role } : reply;
}

/**
 * A tool call's delta joined to the call of its `index`: vLLM sends the id, type and name with the call's first
 * delta and its arguments in pieces.
 */
function addCallDelta(calls: Map<number, StreamedCall>, d: ToolCall): void {
  const call = calls.get(d.index ?? 0) ?? { type: "function", function: { name: "", arguments: "" } };
  calls.set(d.index ?? 0, call);
  if (call.id === undefined && typeof d.id === "string") call.id = d.id;
  if (typeof d.type === "string") call.type = d.type;
  if (call.function.name === "" && typeof d.function?.name === "string") call.function.name = d.function.name;
  if (typeof d.function?.arguments === "string") call.function.arguments += d.function.arguments;
}

/**
 * A reply the client resends as it got it. Text that stopped or ran out of tokens (its text so far is the
 * message); tool calls that finished ("tool_calls", or "stop" when the request named the tool or required one),
 * not cut off by the token limit mid-arguments. Not "abort" or "error" (the engine gave up on it; a client retries
 * the turn rather than continue from it), nor a reply whose choice never said it finished.
 */
function warmable(content: string | null | undefined, calls: ToolCall[], finish: string | null | undefined): ChatReply | undefined {
  if (calls.length > 0) {
    if (finish !== "tool_calls" && finish !== "stop") return undefined;
    // The content as sent, null or "" too: the template renders either before the calls.
    return { content: content ?? null, tool_calls: calls };
  }
  if (finish !== "stop" && finish !== "length") return undefined;
  // An empty reply leaves the next turn nothing worth warming: its prefix is the request's own, cached already.
  if (typeof content !== "string" || content.length === 0) return undefined;
  return { content };
}
