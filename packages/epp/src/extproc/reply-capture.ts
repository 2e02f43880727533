// The assistant's reply, read from a chat completion's response body (a JSON body or an SSE stream), so
// that the tokenizer pool can warm the conversation's next turn (TokenizerPool.warmReply). Bounded: a reply
// longer than MAX_REPLY_BYTES is not captured (its next turn tokenizes it as it would have anyway).
import type { ChatMessage } from "@kv-epp/tokenizer";

const MAX_REPLY_BYTES = 1 << 20;

export class ReplyCapture {
  private readonly chunks: Uint8Array[] = [];
  private bytes = 0;
  private overflow = false;

  /** Past MAX_REPLY_BYTES: nothing is held, and there is no reply to warm with. */
  get overflowed(): boolean {
    return this.overflow;
  }

  add(chunk: Uint8Array): void {
    if (this.overflow) return;
    this.bytes += chunk.length;
    if (this.bytes > MAX_REPLY_BYTES) {
      this.overflow = true;
      this.chunks.length = 0;
      return;
    }
    this.chunks.push(chunk.slice());
  }

  /**
   * The reply as the next turn will send it back (`{role: "assistant", content}`), or undefined when there is
   * none to warm with: too long, not a chat completion, several choices, or tool calls (whose arguments the
   * client re-sends in its own form).
   */
  message(): ChatMessage | undefined {
    if (this.overflow || this.bytes === 0) return undefined;
    const text = Buffer.concat(this.chunks).toString("utf8");
    try {
      return text.trimStart().startsWith("{") ? fromJson(JSON.parse(text)) : fromStream(text);
    } catch {
      return undefined; // not a body we can read: nothing to warm
    }
  }
}

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
