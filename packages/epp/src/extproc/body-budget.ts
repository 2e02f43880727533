// Request-body bytes held across every ext_proc stream of the process, against one bound. Each body is
// capped on its own (MAX_BODY_BYTES), but a client with many streams open, or an overloaded gateway,
// decides how many bodies wait for their route at once: without a bound on the sum, it decides this
// process's memory. Two kinds of holders share it: a stream that cannot take its next chunk of a body routes
// on what it has (server.ts), and the transport counts the parts of gRPC messages still arriving, which are
// bounded by the same number on their own (grpc-h2.ts, ReceiveBudget), and so are the answers the transport
// has not yet sent (a body handed back in full duplex moves here from the held bodies), and the messages a
// stream sends while its route is pending, deferred until it is known (server.ts, defer): each kind stays under
// the bound, bar the one body, message, answer and deferred message always let through. Reply warming keeps a
// routed chat's body and reply within a share of the bound of its own (keep). All count in usedBytes, and a body
// is held only while the others leave it room: memory they fill is memory a body would take.
import type { ReceiveBudget } from "./grpc-h2.ts";

/** The share of the bound that bodies and replies kept for warming may hold. */
export const KEPT_SHARE = 0.25;

/** What `held` holds besides bodies waiting for their route, each counted apart. */
type Part = "arriving" | "kept" | "output" | "deferred";

export class BodyBudget implements ReceiveBudget {
  private held = 0;
  /**
   * Of `held`: the transport's parts of messages still arriving (`arriving`) and answers not yet sent (`output`);
   * what routed chats keep to warm their next turn from the reply (`kept`: at most KEPT_SHARE of the bound); and
   * messages deferred while their stream's route is pending (`deferred`).
   */
  private readonly parts: Record<Part, number> = { arriving: 0, kept: 0, output: 0, deferred: 0 };

  constructor(readonly maxBytes: number) {}

  /** Bytes taken and not yet given back. */
  get usedBytes(): number {
    return this.held;
  }

  /** Of usedBytes, parts of messages still arriving. */
  get arrivingBytes(): number {
    return this.parts.arriving;
  }

  /** Of usedBytes, answers not yet sent. */
  get outputBytes(): number {
    return this.parts.output;
  }

  /**
   * Takes `n` bytes of a body waiting for its route when they fit under the bound with the bodies, arriving
   * parts, unsent answers and deferred messages held (what warming keeps has its own share, see keep, and never
   * refuses a body its route), or when the taker's own `held` bytes are all the bodies the process holds (one body
   * alone is always held, up to its own cap: a bound below a body's size must not refuse it forever; the other
   * kinds do not count here, or the body that arrived first, over the bound, would be refused for those behind
   * it); false (nothing taken) otherwise.
   */
  take(n: number, held = 0): boolean {
    const { arriving, kept, output, deferred } = this.parts;
    const bodies = this.held - arriving - kept - output - deferred;
    if (this.held - kept + n > this.maxBytes && bodies > held) return false;
    this.held += n;
    return true;
  }

  give(n: number): void {
    this.held -= n;
  }

  /** Counts `n` bytes of messages still arriving, whatever the bound (they are here). */
  hold(n: number): void {
    this.count("arriving", n);
  }

  unhold(n: number): void {
    this.count("arriving", -n);
  }

  /** Counts `n` bytes of answers not yet sent, whatever the bound (they are here). */
  holdOutput(n: number): void {
    this.count("output", n);
  }

  unholdOutput(n: number): void {
    this.count("output", -n);
  }

  /**
   * Takes `n` bytes for a message deferred until its stream's route is known, when deferred messages stay within
   * the bound, or when none is deferred (one is always let through); false (nothing taken) otherwise. Bodies
   * filling the bound do not refuse it: they route by load, and an Envoy's trailers behind them must not fail.
   */
  defer(n: number): boolean {
    const deferred = this.parts.deferred;
    if (deferred > 0 && deferred + n > this.maxBytes) return false;
    this.count("deferred", n);
    return true;
  }

  undefer(n: number): void {
    this.count("deferred", -n);
  }

  /**
   * Keeps `n` bytes of a routed chat (its body, then its reply as it streams back) to warm the next turn, while
   * all that is kept so stays within KEPT_SHARE of the bound: warming is worth less than routing, which keeps
   * the rest. False (nothing kept) otherwise.
   */
  keep(n: number): boolean {
    if (this.parts.kept + n > this.maxBytes * KEPT_SHARE) return false;
    this.count("kept", n);
    return true;
  }

  unkeep(n: number): void {
    this.count("kept", -n);
  }

  private count(part: Part, n: number): void {
    this.parts[part] += n;
    this.held += n;
  }
}
