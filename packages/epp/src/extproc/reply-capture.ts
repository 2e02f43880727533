// A chat completion's response body, kept as it streams back so that the tokenizer pool can warm the conversation's
// next turn with its reply. Only the bytes are kept here: the member that warms reads the reply from them
// (readChatReply), off the decision thread. Bounded: a reply longer than MAX_REPLY_BYTES is not kept (its next
// turn tokenizes it as it would have anyway).
import { joinBody } from "@kv-epp/tokenizer";

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
    // A copy: the chunk is a view of its gRPC message, which would otherwise stay alive whole.
    this.chunks.push(chunk.slice());
  }

  /** The response body as received (joined in shared memory, for the pool member to read), or undefined: none, or too long. */
  body(): Uint8Array | undefined {
    if (this.overflow || this.bytes === 0) return undefined;
    return joinBody(this.chunks, this.bytes);
  }
}
