// The assistant's reply, read from a chat completion's response body (a JSON body or an SSE stream) by the pool
// member that warms the conversation's next turn with it (BodyJob.reply), not by the thread that routes.
import type { ChatMessage } from "../types";

/**
 * The reply as the next turn will send it back (`{role: "assistant", content}`), or undefined when there is none
 * to warm with: not a chat completion, several choices, tool calls (whose arguments the client re-sends in its
 * own form), an empty reply, or one that did not finish (see WARMED_FINISH; a stream must also end in `[DONE]`
 * and carry no error).
 */
export function readChatReply(body: Uint8Array): ChatMessage | undefined {
  if (body.length === 0) return undefined;
  const text = decoder.decode(body);
  try {
    return text.trimStart().startsWith("{") ? fromJson(JSON.parse(text)) : fromStream(text);
  } catch {
    return undefined; // not a body we can read: nothing to warm
  }
}

const decoder = new TextDecoder();

/**
 * The finish reasons whose reply the client resends as it got it: a reply that stopped, or ran out of tokens (its
 * text so far is the message). Not "abort" or "error" (vLLM's engine gave up on it; a client retries the turn
 * rather than continue from it), nor a reply whose choice never said it finished (cut off on the way).
 */
const WARMED_FINISH = new Set(["stop", "length"]);

type Choice = { index?: number; message?: Delta; delta?: Delta; finish_reason?: string | null };
type Delta = { content?: string | null; tool_calls?: unknown[] };
/** A JSON body or a stream's chunk; vLLM sends `{error}` in place of a chunk when the generation fails midway. */
type Chunk = { choices?: Choice[]; error?: unknown };

function fromJson(body: Chunk): ChatMessage | undefined {
  const choices = body.choices ?? [];
  const c = choices[0];
  if (choices.length !== 1 || c?.message === undefined) return undefined;
  return warmable(c.message.content, c.message.tool_calls?.length ?? 0, c.finish_reason);
}

function fromStream(text: string): ChatMessage | undefined {
  let content = "";
  let calls = 0;
  let finish: string | null | undefined;
  for (const line of text.split("\n")) {
    if (!line.startsWith("data:")) continue;
    const data = line.slice(5).trim();
    if (data === "[DONE]") return warmable(content, calls, finish);
    const chunk = JSON.parse(data) as Chunk;
    // The content before an error is no reply the client keeps.
    if (chunk.error !== undefined) return undefined;
    for (const c of chunk.choices ?? []) {
      if ((c.index ?? 0) !== 0) return undefined;
      calls += c.delta?.tool_calls?.length ?? 0;
      if (typeof c.delta?.content === "string") content += c.delta.content;
      finish = c.finish_reason ?? finish;
    }
  }
  return undefined; // no [DONE]: the stream was cut
}

function warmable(content: string | null | undefined, calls: number, finish: string | null | undefined): ChatMessage | undefined {
  if (calls > 0 || !WARMED_FINISH.has(finish ?? "")) return undefined;
  // An empty reply leaves the next turn nothing worth warming: its prefix is the request's own, cached already.
  if (typeof content !== "string" || content.length === 0) return undefined;
  return { role: "assistant", content };
}
