// Request-body bytes held across every ext_proc stream of the process, against one bound. Each body is
// capped on its own (MAX_BODY_BYTES), but a client with many streams open, or an overloaded gateway,
// decides how many bodies wait for their route at once: without a bound on the sum, it decides this
// process's memory. Two kinds of holders share it: a stream that cannot take its next chunk of a body routes
// on what it has (server.ts), and the transport counts the parts of gRPC messages still arriving, which are
// bounded by the same number on their own (grpc-h2.ts, ReceiveBudget): held bodies and arriving parts
// together stay under twice the bound, plus the one body and the one message always let through.
import type { ReceiveBudget } from "./grpc-h2.ts";

export class BodyBudget implements ReceiveBudget {
  private held = 0;
  /** Of `held`, the transport's: parts of messages still arriving. */
  private arriving = 0;

  constructor(readonly maxBytes: number) {}

  /** Bytes taken and not yet given back. */
  get usedBytes(): number {
    return this.held;
  }

  /** Of usedBytes, parts of messages still arriving. */
  get arrivingBytes(): number {
    return this.arriving;
  }

  /**
   * Takes `n` bytes when they fit under the bound, or when the taker's own `held` bytes are all the bodies the
   * process holds (one body alone is always held, up to its own cap: a bound below a body's size must not refuse
   * it forever; messages still arriving do not count here, or the body that arrived first, over the bound, would
   * be refused for those behind it); false (nothing taken) otherwise.
   */
  take(n: number, held = 0): boolean {
    if (this.held + n > this.maxBytes && this.held - this.arriving > held) return false;
    this.held += n;
    return true;
  }

  give(n: number): void {
    this.held -= n;
  }

  /** Counts `n` bytes of messages still arriving, whatever the bound (they are here). */
  hold(n: number): void {
    this.held += n;
    this.arriving += n;
  }

  unhold(n: number): void {
    this.held -= n;
    this.arriving -= n;
  }
}
