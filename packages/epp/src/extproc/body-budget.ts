// Request-body bytes held across every ext_proc stream of the process, against one bound. Each body is
// capped on its own (MAX_BODY_BYTES), but a client with many streams open, or an overloaded gateway,
// decides how many bodies wait for their route at once: without a bound on the sum, it decides this
// process's memory. Two kinds of holders share it: a stream that cannot take its next chunk of a body routes
// on what it has (server.ts), and the transport counts the part of a gRPC message still arriving, reading no
// more of it while the bound is passed (grpc-h2.ts, ReceiveBudget).
import type { ReceiveBudget } from "./grpc-h2.ts";

export class BodyBudget implements ReceiveBudget {
  private held = 0;
  private readonly listeners = new Set<() => void>();

  constructor(readonly maxBytes: number) {}

  /** Bytes taken and not yet given back. */
  get usedBytes(): number {
    return this.held;
  }

  /**
   * Takes `n` bytes when they fit under the bound, or when the taker's own `held` bytes are all the process holds
   * (one body alone is always held, up to its own cap: a bound below a body's size must not refuse it forever);
   * false (nothing taken) otherwise.
   */
  take(n: number, held = 0): boolean {
    if (this.held + n > this.maxBytes && this.held > held) return false;
    this.held += n;
    return true;
  }

  /** Counts `n` bytes whatever the bound: bytes that have arrived (the caller stops reading more). */
  hold(n: number): void {
    this.held += n;
  }

  give(n: number): void {
    if (n === 0) return;
    this.held -= n;
    for (const l of this.listeners) l();
  }

  onGive(listener: () => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }
}
