// Request bodies prepared ahead of their arrival. Building one (`recordTokens` + `JSON.stringify` +
// encode) takes 0.4 ms at p50 and up to 11 ms for a 546 KB prompt; the trace's records arrive in bursts
// of up to 16 at one instant, so building them at the instant held the event loop for up to 32 ms while
// the burst's first streams waited to go out (measured with packages/epp/bench/ext-proc-timeline.ts).
// Built in the idle time before each arrival instead, one body per event-loop turn, so streams already
// running are never held up by more than one body.
import { recordTokens } from "../tokens.ts";
import type { TraceRecord } from "../trace.ts";

const enc = new TextEncoder();

/** The `/v1/completions` body of a record: its prompt as token ids, streamed with usage. */
export function completionBody(rec: TraceRecord, model: string): Uint8Array {
  return enc.encode(
    JSON.stringify({
      model,
      prompt: Array.from(recordTokens(rec)),
      max_tokens: Math.max(1, rec.outputLength),
      stream: true,
      stream_options: { include_usage: true },
    }),
  );
}

/** Builds the bodies of `records` in order, at most `depth` ahead of the one taken last. */
export class BodyLookahead {
  private readonly ready = new Map<number, Uint8Array>();
  private next = 0;
  private taken = 0;
  /** bodies built at their arrival instant because the idle time before it was too short */
  late = 0;

  constructor(
    private readonly records: readonly TraceRecord[],
    private readonly model: string,
    private readonly depth = 64,
  ) {}

  /**
   * Builds bodies until `until()` is false or `depth` are ready, yielding to the event loop after
   * each one (a macrotask, so pending socket I/O of running requests goes first).
   */
  async fill(until: () => boolean): Promise<void> {
    while (this.next < this.records.length && this.next - this.taken < this.depth && until()) {
      this.ready.set(this.next, completionBody(this.records[this.next]!, this.model));
      this.next++;
      await new Promise<void>((r) => setImmediate(r));
    }
  }

  /** The body of record `i` (taken in order); built now only if the lookahead had no time to. */
  take(i: number): Uint8Array {
    this.taken = i + 1;
    const body = this.ready.get(i);
    if (body) {
      this.ready.delete(i);
      return body;
    }
    this.late++;
    if (this.next <= i) this.next = i + 1;
    return completionBody(this.records[i]!, this.model);
  }
}
