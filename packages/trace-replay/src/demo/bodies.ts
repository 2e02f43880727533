// Request bodies prepared ahead of their arrival. Building one (`recordTokens` + `JSON.stringify` +
// encode) takes 0.4 ms at p50 and up to 11 ms for a 546 KB prompt; the trace's records arrive in bursts
// of up to 16 at one instant, so building them at the instant held the event loop for up to 32 ms while
// the burst's first streams waited to go out (measured with packages/epp/bench/ext-proc-timeline.ts).
// Built in the idle time before each arrival instead, one body per event-loop turn, so streams already
// running are never held up by more than one body.
import { recordTokens } from "../tokens.ts";
import type { TraceRecord } from "../trace.ts";
import { Conversations } from "./chat.ts";

const enc = new TextEncoder();

/** What the demo sends: OpenAI chat messages (text, tokenized by the EPP and the workers) or token ids. */
export type PromptKind = "chat" | "tokens";

export type RequestBody = { path: "/v1/chat/completions" | "/v1/completions"; body: Uint8Array };

const streamed = (rec: TraceRecord) => ({ max_tokens: Math.max(1, rec.outputLength), stream: true, stream_options: { include_usage: true } });

/** The `/v1/completions` body of a record: its prompt as token ids, streamed with usage. */
export function completionBody(rec: TraceRecord, model: string): Uint8Array {
  return enc.encode(JSON.stringify({ model, prompt: Array.from(recordTokens(rec)), ...streamed(rec) }));
}

/** The request of record `i`, by prompt kind; chats must be asked for in record order (see Conversations). */
export function requestBuilder(records: readonly TraceRecord[], model: string, kind: PromptKind): (i: number) => RequestBody {
  if (kind === "tokens") return (i) => ({ path: "/v1/completions", body: completionBody(records[i]!, model) });
  const chats = new Conversations(records);
  return (i) => ({
    path: "/v1/chat/completions",
    body: enc.encode(JSON.stringify({ model, messages: chats.messagesOf(i), ...streamed(records[i]!) })),
  });
}

/** Builds the requests of records 0..count-1 in order, at most `depth` ahead of the one taken last. */
export class BodyLookahead {
  private readonly ready = new Map<number, RequestBody>();
  private next = 0;
  private taken = 0;
  /** bodies built at their arrival instant because the idle time before it was too short */
  late = 0;

  constructor(
    private readonly count: number,
    private readonly build: (i: number) => RequestBody,
    private readonly depth = 64,
  ) {}

  /**
   * Builds bodies until `until()` is false or `depth` are ready, yielding to the event loop after
   * each one (a macrotask, so pending socket I/O of running requests goes first).
   */
  async fill(until: () => boolean): Promise<void> {
    while (this.next < this.count && this.next - this.taken < this.depth && until()) {
      this.ready.set(this.next, this.build(this.next));
      this.next++;
      await new Promise<void>((r) => setImmediate(r));
    }
  }

  /** The body of record `i` (taken in order); built now only if the lookahead had no time to. */
  take(i: number): RequestBody {
    this.taken = i + 1;
    if (!this.ready.has(i)) {
      this.late++;
      // In order up to i: a chat continues an earlier record's conversation.
      while (this.next <= i) this.ready.set(this.next, this.build(this.next++));
    }
    const body = this.ready.get(i)!;
    this.ready.delete(i);
    return body;
  }
}
