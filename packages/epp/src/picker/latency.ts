// Predicted TTFT per worker: the prefill ahead of the request plus its own, at that worker's prefill
// rate, plus a wait per queued request; calibrated online from what the EPP observes (a streamed
// response's first body chunk marks its first token, so every routed request gives one sample for its
// worker).
//
// Why "ahead": vLLM's scheduler serves running requests before waiting ones and shares one token
// budget per step among them, so a new prompt's first token comes after the prefill already routed
// there and not yet done (the load's prefill blocks: requests with no first byte back yet, this
// replica's and, over replica-agg, its peers'). Per worker, exponentially weighted least squares fits
// TTFT = base + rate x (ahead + uncached) over the samples that found no scraped queue, and the excess
// of the queued ones over that line, per waiting request, is the queue term (what other routers sent).
// Until a worker has enough spread in its samples the priors stand (vLLM-like: a step's fixed cost
// plus 0.1 ms per token, what an 8B model prefills on one modern GPU, and mock-worker's defaults).

export type LatencyPriors = { baseMs: number; msPerToken: number; msPerWaiting: number };

export const DEFAULT_LATENCY_PRIORS: LatencyPriors = { baseMs: 10, msPerToken: 0.1, msPerWaiting: 50 };

/**
 * The latency cost's weight of the delay a request's own prefill adds to each request queued behind it
 * on the worker, in units of that prefill's time. 0 is greedy: the lowest TTFT for this request alone,
 * which sends a conversation's next turn away from its cache whenever that worker is busier and leaves
 * the prefill to slow everyone after it. 1 counts the delay once, what a request behind it at moderate
 * load pays: the weight where caches hold their working set. Where they evict what is asked for again
 * a recompute elsewhere also costs the blocks it evicts, and the weight rises towards
 * DEFAULT_FOLLOWER_WEIGHT_MAX with the eviction regret (eviction-regret.ts; bench:trace figures in
 * packages/epp/README.md "Latency-aware cost").
 */
export const DEFAULT_FOLLOWER_WEIGHT = 1;
export const DEFAULT_FOLLOWER_WEIGHT_MAX = 6;

/** Weight of the newest sample: ~50 samples of memory, so a worker that slows down is seen within a minute. */
const ALPHA = 0.02;
/** Effective samples before a worker's fit replaces the priors. */
const MIN_WEIGHT = 8;

type Fit = { w: number; x: number; y: number; xx: number; xy: number; queue: number; queueW: number; line: LatencyPriors & { samples: number } };

/** What a TTFT is predicted from: the request's own prefill, the prefill ahead of it, the scraped queue. */
export type TtftInput = {
  /** prompt tokens the worker computes for this request (uncachedTokens) */
  uncachedTokens: number;
  /** prefill tokens of the requests routed to the worker before it that have no first token yet */
  aheadTokens: number;
  /** waiting requests scraped from the worker */
  waiting: number;
};

export type TtftSample = TtftInput & { workerKey: string; ttftMs: number };

/**
 * The leading blocks of a prompt vLLM can serve from its cache: its hit stops at prompt length - 1 in
 * whole blocks (get_computed_blocks: the last token is always computed, for its logits), so a prompt of
 * whole blocks all cached still prefills its last block.
 */
export function hittableBlocks(promptTokens: number, blockSize: number): number {
  return Math.floor(Math.max(promptTokens - 1, 0) / blockSize);
}

/** The prompt tokens a worker holding `overlap` of its leading blocks still prefills (at least one of a non-empty prompt). */
export function uncachedTokens(promptTokens: number, overlap: number, blockSize: number): number {
  return promptTokens - Math.min(overlap, hittableBlocks(promptTokens, blockSize)) * blockSize;
}

function ttftOn(p: LatencyPriors, t: TtftInput): number {
  return t.waiting * p.msPerWaiting + p.baseMs + p.msPerToken * (t.uncachedTokens + t.aheadTokens);
}

/** A follower weight: fixed, or read per cost (FollowerWeight: moved by the caches' eviction regret). */
export type FollowerWeightSource = number | { readonly value: number };

export class LatencyModel {
  private readonly fits = new Map<string, Fit>();

  constructor(
    private readonly priors: LatencyPriors = DEFAULT_LATENCY_PRIORS,
    private readonly followerWeight: FollowerWeightSource = DEFAULT_FOLLOWER_WEIGHT,
  ) {}

  /** The follower weight the next cost uses. */
  get follower(): number {
    const w = this.followerWeight;
    return typeof w === "number" ? w : w.value;
  }

  /** The worker's current line: base ms, ms per uncached token, ms per waiting request. */
  params(workerKey: string): Readonly<LatencyPriors & { samples: number }> {
    // Refitted on each observation, so a pick reads it without allocating.
    return this.fits.get(workerKey)?.line ?? { ...this.priors, samples: 0 };
  }

  private fit(f: Fit): LatencyPriors & { samples: number } {
    const p = this.priors;
    if (f.w < MIN_WEIGHT) return { ...p, samples: Math.round(f.w) };
    const mx = f.x / f.w;
    const my = f.y / f.w;
    const varX = f.xx / f.w - mx * mx;
    // Too little spread in the uncached sizes to tell the slope from the intercept: keep the prior slope.
    const msPerToken = varX > 1 ? Math.max(0, (f.xy / f.w - mx * my) / varX) : p.msPerToken;
    const baseMs = Math.max(0, my - msPerToken * mx);
    const msPerWaiting = f.queueW >= 1 ? Math.max(0, f.queue / f.queueW) : p.msPerWaiting;
    return { baseMs, msPerToken, msPerWaiting, samples: Math.round(f.w) };
  }

  predictTtftMs(workerKey: string, t: TtftInput): number {
    return ttftOn(this.line(workerKey), t);
  }

  /** The latency cost of the worker: the predicted TTFT plus the follower weight x this request's own prefill time. */
  costMs(workerKey: string, t: TtftInput): number {
    const p = this.line(workerKey);
    return ttftOn(p, t) + this.follower * p.msPerToken * t.uncachedTokens;
  }

  private line(workerKey: string): LatencyPriors {
    return this.fits.get(workerKey)?.line ?? this.priors;
  }

  observe(s: TtftSample): void {
    if (!Number.isFinite(s.ttftMs) || s.ttftMs < 0) return;
    let f = this.fits.get(s.workerKey);
    if (!f) this.fits.set(s.workerKey, (f = { w: 0, x: 0, y: 0, xx: 0, xy: 0, queue: 0, queueW: 0, line: { ...this.priors, samples: 0 } }));
    if (s.waiting > 0) {
      // The wait is what the line does not explain, shared among the requests ahead.
      const p = f.line;
      const excess = Math.max(0, s.ttftMs - p.baseMs - p.msPerToken * (s.uncachedTokens + s.aheadTokens)) / s.waiting;
      f.queue = (1 - ALPHA) * f.queue + excess;
      f.queueW = (1 - ALPHA) * f.queueW + 1;
      f.line = this.fit(f);
      return;
    }
    const d = 1 - ALPHA;
    const x = s.uncachedTokens + s.aheadTokens;
    f.w = d * f.w + 1;
    f.x = d * f.x + x;
    f.y = d * f.y + s.ttftMs;
    f.xx = d * f.xx + x * x;
    f.xy = d * f.xy + x * s.ttftMs;
    f.line = this.fit(f);
  }

  forget(workerKey: string): void {
    this.fits.delete(workerKey);
  }
}
