// Request-body bytes held across every ext_proc stream of the process, against one bound. Each body is
// capped on its own (MAX_BODY_BYTES), but a client with many streams open, or an overloaded gateway,
// decides how many bodies wait for their route at once: without a bound on the sum, it decides this
// process's memory. Two kinds of holders share it: a stream that cannot take its next chunk of a body routes
// on what it has (server.ts), and the transport counts the parts of gRPC messages still arriving, which are
// bounded by the same number on their own (grpc-h2.ts, ReceiveBudget): held bodies and arriving parts
// together stay under twice the bound, plus the one body and the one message always let through. A third
// holder, reply warming, keeps a routed chat's body and reply within a share of the bound of its own (keep).
import type { ReceiveBudget } from "./grpc-h2.ts";

/** The share of the bound that bodies and replies kept for warming may hold. */
export const KEPT_SHARE = 0.25;

export class BodyBudget implements ReceiveBudget {
  private held = 0;
  /** Of `held`, the transport's: parts of messages still arriving. */
  private arriving = 0;
  /** Of `held`, what routed chats keep to warm their next turn from the reply: at most KEPT_SHARE of the bound. */
  private kept = 0;

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
   * Takes `n` bytes of a body waiting for its route when they fit under the bound with the bodies and arriving
   * parts held (what warming keeps has its own share, see keep, and never refuses a body its route), or when the
   * taker's own `held` bytes are all the bodies the process holds (one body alone is always held, up to its own
   * cap: a bound below a body's size must not refuse it forever; arriving parts do not count here, or the body
   * that arrived first, over the bound, would be refused for those behind it); false (nothing taken) otherwise.
   */
  take(n: number, held = 0): boolean {
    const bodies = this.held - this.arriving - this.kept;
    if (this.held - this.kept + n > this.maxBytes && bodies > held) return false;
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

  /**
   * Keeps `n` bytes of a routed chat (its body, then its reply as it streams back) to warm the next turn, while
   * all that is kept so stays within KEPT_SHARE of the bound: warming is worth less than routing, which keeps
   * the rest. False (nothing kept) otherwise.
   */
  keep(n: number): boolean {
    if (this.kept + n > this.maxBytes * KEPT_SHARE) return false;
    this.kept += n;
    this.held += n;
    return true;
  }

  unkeep(n: number): void {
    this.kept -= n;
    this.held -= n;
  }
}
