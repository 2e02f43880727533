// Request bodies prepared ahead of their arrival. Building one (`recordTokens` + `JSON.stringify` +
// encode) takes 0.4 ms at p50 and up to 11 ms for a 546 KB prompt; the trace's records arrive in bursts
// of up to 16 at one instant, so building them at the instant held the event loop for up to 32 ms while
// the burst's first streams waited to go out (measured with packages/epp/bench/ext-proc-timeline.ts).
// Built in the idle time before each arrival instead, one body per event-loop turn, so streams already
// running are never held up by more than one body.
import { recordTokens } from "../tokens.ts";
import type { TraceRecord } from "../trace.ts";
import { Conversations, type ReceivedReply } from "./chat.ts";

const enc = new TextEncoder();

/** What the demo sends: OpenAI chat messages (text, tokenized by the EPP and the workers) or token ids. */
export type PromptKind = "chat" | "tokens";

export type RequestBody = { path: "/v1/chat/completions" | "/v1/completions"; body: Uint8Array };

const streamed = (rec: TraceRecord) => ({ max_tokens: Math.max(1, rec.outputLength), stream: true, stream_options: { include_usage: true } });

/** The `/v1/completions` body of a record: its prompt as token ids, streamed with usage. */
export function completionBody(rec: TraceRecord, model: string): Uint8Array {
  return enc.encode(JSON.stringify({ model, prompt: Array.from(recordTokens(rec)), ...streamed(rec) }));
}

/**
 * The request of record `i`, by prompt kind; chats must be asked for in record order (see Conversations). A
 * chat's earlier turns carry the trace's text as replies (the same bodies every time: for benchmarks).
 */
export function requestBuilder(records: readonly TraceRecord[], model: string, kind: PromptKind): (i: number) => RequestBody {
  return requestSource(records, model, kind).build;
}

/**
 * Requests of the trace's records as a client sends them. `replied(i, reply)` tells a chat's reply, which
 * the turns continuing it then resend; `stale(i)`: a body built before is out of date (a reply it stood in for
 * has come since).
 */
export type RequestSource = {
  build(i: number): RequestBody;
  replied(i: number, reply: ReceivedReply): void;
  stale(i: number): boolean;
  /** Chat turns continuing an earlier one built so far: resending its reply, or the trace's text in its place. */
  replyCounts(): { resent: number; stoodIn: number };
};

export function requestSource(records: readonly TraceRecord[], model: string, kind: PromptKind): RequestSource {
  if (kind === "tokens") {
    return {
      build: (i) => ({ path: "/v1/completions", body: completionBody(records[i]!, model) }),
      replied: () => {},
      stale: () => false,
      replyCounts: () => ({ resent: 0, stoodIn: 0 }),
    };
  }
  const chats = new Conversations(records);
  return {
    build: (i) => ({
      path: "/v1/chat/completions",
      body: enc.encode(JSON.stringify({ model, messages: chats.messagesOf(i), ...streamed(records[i]!) })),
    }),
    replied: (i, reply) => chats.replied(i, reply),
    stale: (i) => chats.stale(i),
    replyCounts: () => chats.replyCounts(),
  };
}

/** Builds the requests of records 0..count-1 in order, at most `depth` ahead of the one taken last. */
export class BodyLookahead {
  private readonly ready = new Map<number, RequestBody>();
  private next = 0;
  private taken = 0;
  /** bodies built at their arrival instant because the idle time before it was too short */
  late = 0;
  /** bodies built again at their arrival instant: a reply they stood in for had come meanwhile */
  rebuilt = 0;

  constructor(
    private readonly count: number,
    private readonly build: (i: number) => RequestBody,
    private readonly depth = 64,
    private readonly stale: (i: number) => boolean = () => false,
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

  /** The body of record `i` (taken in order); built now if the lookahead had no time to, or again if stale. */
  take(i: number): RequestBody {
    this.taken = i + 1;
    if (!this.ready.has(i)) {
      this.late++;
      // In order up to i: a chat continues an earlier record's conversation.
      while (this.next <= i) this.ready.set(this.next, this.build(this.next++));
    }
    const built = this.ready.get(i)!;
    this.ready.delete(i);
    if (!this.stale(i)) return built;
    this.rebuilt++;
    return this.build(i);
  }
}
