// The assistant's reply, read from a chat completion's response body (a JSON body or an SSE stream) by the pool
// member that warms the conversation's next turn with it (BodyJob.reply), not by the thread that routes.
import type { ChatMessage } from "../types";

/**
 * The reply as the next turn will send it back (`{role: "assistant", content}`), or undefined when there is none
 * to warm with: not a chat completion, several choices, or tool calls (whose arguments the client re-sends in its
 * own form).
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

type Choice = { index?: number; message?: Delta; delta?: Delta };
type Delta = { content?: string | null; tool_calls?: unknown[] };

function fromJson(body: { choices?: Choice[] }): ChatMessage | undefined {
  const choices = body.choices ?? [];
  const m = choices[0]?.message;
  if (choices.length !== 1 || m === undefined || (m.tool_calls?.length ?? 0) > 0 || typeof m.content !== "string") return undefined;
  return { role: "assistant", content: m.content };
}

function fromStream(text: string): ChatMessage | undefined {
  let content = "";
  for (const line of text.split("\n")) {
    if (!line.startsWith("data:")) continue;
    const data = line.slice(5).trim();
    if (data === "[DONE]") break;
    const chunk = JSON.parse(data) as { choices?: Choice[] };
    for (const c of chunk.choices ?? []) {
      if ((c.index ?? 0) !== 0) return undefined;
      if ((c.delta?.tool_calls?.length ?? 0) > 0) return undefined;
      if (typeof c.delta?.content === "string") content += c.delta.content;
    }
  }
  return content.length > 0 ? { role: "assistant", content } : undefined;
}
