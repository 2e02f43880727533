// One request's routing life, the same for the EPP (driven by ext_proc's messages, in wall time) and
// the trace simulation (driven by its event queue, in virtual time): route -> the decision and a lease
// on the chosen rank's load; first byte -> its prefill is over; served by another endpoint -> the load
// moves there; end -> the lease is released and what the response told calibrates the latency model.
// A disaggregated request (decision.pd.prefill) holds two leases: the prefill rank's, for the prompt it
// computes, released at the first response byte (the decode side answers only once the remote prefill
// is done), and the decode rank's, for the blocks it holds, released at the end.
import { prefillBlocksOf } from "./decide.ts";
import { explanation } from "./explain.ts";
import type { LatencyModel } from "./latency.ts";
import type { ActiveLoad, Lease } from "./load.ts";
import type { Decision, Picker, PickRequest, ScoredCandidate } from "./picker.ts";
import type { Candidate, Clock, RoutingMetrics, UnscoredReason } from "./ports.ts";
import { calibrationSample, predictionOf, type ResponseWatch, type RoutingQuality } from "./quality.ts";
import { UsageScan, type ReportedUsage } from "./usage-scan.ts";

/**
 * The least time a disaggregated request's prefill lease is held when no response byte shows: its first
 * byte also waits for the KV transfer and the sidecar's two hops, which the latency line does not model.
 */
export const REMOTE_PREFILL_MIN_DEADLINE_MS = 5_000;

/** What every request a replica routes shares. */
export type RoutingContext = {
  picker: Picker;
  /** This replica's own load: each routed request holds a lease on it until it ends. */
  load: ActiveLoad;
  /** Calibrated from each response's TTFT. */
  latency: LatencyModel;
  metrics: RoutingMetrics;
  clock: Clock;
  /** Watches responses for the cached tokens and TTFT they report (absent: the runner reports them at end). */
  quality?: RoutingQuality;
  /** The routable ranks, to find the one a served endpoint names. */
  candidates: () => readonly Candidate[];
};

export type RouteOptions = {
  /** Explain the decision (the explanation header). */
  explain?: boolean;
  /** Nothing is compared with the prediction, and why (a batch's usage adds up its prompts; a namespace the pick did not see). */
  unscored?: UnscoredReason;
};

type Picked = Extract<Decision, { kind: "picked" }>;

export type Routing = { kind: "routed"; request: RoutedRequest } | Extract<Decision, { kind: "no_endpoint" }>;

/** What the response of a request the runner watches itself tells at its end (the simulation). */
export type Reported = { ttftMs: number; cachedTokens: number };

export class RoutedRequest {
  /** Where its load is counted now: the pick, or the rank the data plane reports served it. */
  private at: Candidate;
  private lease: Lease;
  /** Disaggregated: the prefill rank's lease, until the first byte. */
  private readonly prefillLease: Lease | undefined;
  /** The rank whose prefill the first token waits on: the prefill rank, else the pick. */
  private readonly prefilling: ScoredCandidate;
  private prefilled = false;
  private ended = false;
  /** Cancels the timer that ends its prefill at the deadline, if no byte comes first (see the constructor). */
  private cancelDeadline: (() => void) | undefined;
  private readonly watch: ResponseWatch | undefined;
  /** Its response's usage, read once for the watch and for usage(). */
  private readonly scan = new UsageScan();
  /** The decision as one header value, when asked for. */
  readonly explanation: string | undefined;

  /** Decides where `req` goes and takes its lease there; no_endpoint when no rank is eligible. */
  static route(ctx: RoutingContext, req: PickRequest, o: RouteOptions = {}): Routing {
    const decision = ctx.picker.pick(req);
    if (decision.kind === "no_endpoint") return decision;
    return { kind: "routed", request: new RoutedRequest(ctx, decision, o) };
  }

  private constructor(
    private readonly ctx: RoutingContext,
    readonly decision: Picked,
    o: RouteOptions,
  ) {
    const { chosen, requestBlocks } = decision;
    const prefill = decision.pd?.prefill?.chosen;
    this.at = chosen.candidate;
    // Where the prefill runs is what the first token waits on: those blocks count as ahead there.
    const prefilling = (this.prefilling = prefill ?? chosen);
    const ahead = prefill ? prefillBlocksOf(requestBlocks, prefill.overlap) : this.prefillBlocks;
    // Both leases carry the prefix: the prefill rank computes those blocks, the decode rank receives them.
    this.lease = ctx.load.acquire(chosen.candidate.key, requestBlocks, this.prefillBlocks, decision.prefix);
    if (prefill) this.prefillLease = ctx.load.acquire(prefill.candidate.key, requestBlocks, ahead, decision.prefix);
    // A response that is not streamed (or a data plane that buffers it) shows no byte until it ends, so
    // its prefill would count as ahead of every later request for its whole decode: it stops counting
    // at twice its predicted TTFT if no byte came before. A prefill rank's lease counts the request itself
    // there too, so it is released by then even when the rank held every block (nothing ahead).
    if (ahead > 0 || prefill) {
      const deadline = 2 * prefilling.predictedTtftMs;
      this.cancelDeadline = ctx.clock.after?.(prefill ? Math.max(deadline, REMOTE_PREFILL_MIN_DEADLINE_MS) : deadline, () => this.firstByte());
    }
    ctx.metrics.inflight(ctx.load.inflight);
    ctx.metrics.routed(requestBlocks > 0 ? prefilling.overlap / requestBlocks : undefined);
    if (decision.pd) ctx.metrics.disaggregation(decision.pd.disagg.disaggregate, decision.pd.disagg.reason);
    // A batch's usage adds up all its prompts, its first token is any prompt's: nothing to compare with
    // the prediction made for the first prompt; nor for a request routed by load into a cache namespace the index
    // does not see. A disaggregated request's TTFT and cached tokens are its prefill rank's: the prediction
    // compared is that rank's.
    if (o.unscored === undefined) this.watch = ctx.quality?.watch(predictionOf(decision, prefilling), ctx.clock.now(), this.scan);
    else if (ctx.quality) ctx.metrics.unscored(o.unscored);
    this.explanation = o.explain ? explanation(decision) : undefined;
  }

  /** The rank its load is counted on. */
  get candidate(): Candidate {
    return this.at;
  }

  /**
   * The blocks the destination still prefills (request blocks - overlap, see stillToPrefill): what its lease
   * counts as ahead until its first byte. None when a prefill rank computes them (disaggregated).
   */
  private get prefillBlocks(): number {
    return this.decision.pd?.prefill ? 0 : this.stillToPrefill(this.decision.chosen);
  }

  /**
   * The blocks `c` prefills for the request: those past its overlap. Where `c` alone holds the whole known prefix
   * the pick was made on (Picker.settles' second rule, or a fallback's), it most likely holds the conversation up
   * to its new turn: then only that turn is counted (Decision.newTurnBlocks), not a history that would make `c`
   * look busy with a phantom prefill until its first byte, steering the conversation's next requests away. Where
   * several hold the prefix (a fallback on a short one: a system prompt), nothing says which holds the rest: all
   * of it counts.
   */
  private stillToPrefill(c: ScoredCandidate): number {
    const past = prefillBlocksOf(this.decision.requestBlocks, c.overlap);
    const turn = this.decision.newTurnBlocks;
    if (!c.openEnded || turn === undefined) return past;
    const holders = this.decision.scored.reduce((n, s) => n + (s.openEnded ? 1 : 0), 0);
    return holders === 1 ? Math.min(past, turn) : past;
  }

  /** The prefill rank named in `x-prefiller-host-port`, when disaggregated. */
  get prefillCandidate(): Candidate | undefined {
    return this.decision.pd?.prefill?.chosen.candidate;
  }

  /**
   * The pick's endpoint, then up to `n` next-best distinct endpoints, cheapest first (for the gateway's retries):
   * when the pick has a rank header, those with a rank it names (the gateway sends one `x-data-parallel-rank` with
   * them all; vLLM refuses a rank past its own). Without one, any (each server balances its own ranks).
   */
  endpoints(n: number): string[] {
    const picked = this.decision.chosen.candidate;
    const out = [picked.endpoint];
    if (n <= 0) return out;
    for (const s of [...this.decision.scored].sort((a, b) => a.cost - b.cost)) {
      if (picked.rankHeader !== undefined && s.candidate.rankHeader !== picked.rankHeader) continue;
      const ep = s.candidate.endpoint;
      if (!out.includes(ep)) out.push(ep);
      if (out.length === n + 1) break;
    }
    return out;
  }

  /** The response's headers, for its watch (`chunked`: the data plane passes the body on as it comes). */
  responseHeaders(contentType: string | undefined, chunked: boolean): void {
    this.watch?.headers(contentType, chunked);
  }

  /** A response body chunk: the first one means the rank has finished this request's prefill. */
  responseBody(chunk: Uint8Array): void {
    this.firstByte();
    // The watch puts the chunk into the scan it shares.
    if (this.watch) this.watch.body(chunk, this.ctx.clock.now());
    else this.scan.add(chunk);
  }

  /** What its response's body has reported of its usage so far (a batch's: all its prompts together). */
  usage(): ReportedUsage {
    return this.scan.usage();
  }

  /**
   * Its prefill is over (first response byte, or its deadline): its load stops counting it as ahead, and
   * a prefill rank's lease is released (idempotent).
   */
  firstByte(): void {
    this.dropDeadline();
    this.lease.prefilled();
    this.prefillLease?.release();
    this.prefilled = true;
  }

  /**
   * The endpoint the data plane reports served the request (a retry or fallback may land elsewhere):
   * its load moves to the rank there, so it is charged where the work is. `unknown_endpoint`: no rank
   * this replica routes to is there, and the load stays on the pick.
   */
  servedBy(endpoint: string | undefined): "moved" | "unknown_endpoint" | undefined {
    if (!endpoint || this.ended || endpoint === this.at.endpoint) return undefined;
    const there = this.ctx.candidates().filter((c) => c.endpoint === endpoint);
    // The rank there that the request's rank header names (the header numbers a rank among its server's).
    const next = there.find((c) => c.rankHeader === this.at.rankHeader) ?? there[0];
    if (!next) {
      this.ctx.metrics.servedElsewhere("unknown_endpoint");
      return "unknown_endpoint";
    }
    // Its prefill as far as it got, as much as that rank holds of the prompt (all of it, unscored).
    const scored = this.decision.scored.find((s) => s.candidate.key === next.key);
    const prefill = this.prefilled || this.decision.pd?.prefill ? 0 : scored ? this.stillToPrefill(scored) : this.decision.requestBlocks;
    this.lease.release();
    this.lease = this.ctx.load.acquire(next.key, this.decision.requestBlocks, prefill, this.decision.prefix);
    this.at = next;
    // The response tells about the rank that served it: compared with what was predicted for that one
    // (disaggregated, the prefill rank's prediction stands: the decode rank did not prefill).
    if (!this.prefillLease) this.watch?.servedBy(scored && predictionOf(this.decision, scored));
    this.ctx.metrics.servedElsewhere("moved");
    return "moved";
  }

  private dropDeadline(): void {
    this.cancelDeadline?.();
    this.cancelDeadline = undefined;
  }

  /**
   * The response ended, or its stream broke (idempotent): the lease is released, and its TTFT (from the
   * watch, or `reported` by a runner that watches responses itself) calibrates the latency model.
   */
  end(reported?: Reported): void {
    if (this.ended) return;
    this.ended = true;
    this.dropDeadline();
    const seen = this.watch ? this.watch.end() : reported && { prediction: predictionOf(this.decision, this.prefilling), ...reported };
    const sample = seen && calibrationSample(seen);
    if (sample) this.ctx.latency.observe(sample);
    this.lease.release();
    this.prefillLease?.release();
    this.ctx.metrics.inflight(this.ctx.load.inflight);
  }
}
