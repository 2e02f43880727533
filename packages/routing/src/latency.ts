// Predicted TTFT on a worker: the prefill ahead of the request plus its own, at the pool's prefill
// rate, plus a wait per queued request nobody told us about; calibrated online from what the EPP
// observes (a streamed response's first body chunk marks its first token, so every routed request gives
// one sample).
//
// Why "ahead": vLLM's scheduler serves running requests before waiting ones and shares one token
// budget per step among them, so a new prompt's first token comes after the prefill already routed
// there and not yet done (the load's prefill blocks: requests with no first byte back yet, this
// replica's and, over replica-agg, its peers'). Exponentially weighted least squares fits
// TTFT = base + rate x (ahead + uncached) over the samples that found no unexplained queue, and the
// excess of the queued ones over that line, per waiting request, is the queue term. A waiting request
// counts only beyond those the load already holds as prefilling on that worker (TtftInput.waiting):
// scraped queues then add what other routers sent, not a second copy of the prefill ahead.
//
// One line for the pool, not one per worker: an InferencePool's workers serve one base model on one
// kind of accelerator, and a per-worker fit locks in its errors, since a worker whose line came out
// slow is avoided and gets no samples to correct it (bench:trace, two replicas: per-worker fits held
// 0.87-0.93 of the pooled LRU's hit rate where the pool's line holds 0.94-0.97, at the same TTFT p50).
// Until the samples have enough spread the priors stand (vLLM-like: a step's fixed cost plus 0.1 ms
// per token, what an 8B model prefills on one modern GPU, and mock-worker's defaults).

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
export const DEFAULT_FOLLOWER_WEIGHT_MAX = 12;

/**
 * The latency cost's charge on a worker outside this replica's home share (home.ts), in units of
 * the request's whole prefill time: about the chance that the peer whose home it is sends a request of
 * its own there in the same instant, times that request's prefill (taken as this one's size). Scaled by
 * the request, so it weighs the same against a cached prefix on short prompts as on long ones.
 */
export const DEFAULT_AWAY_WEIGHT = 0.5;

/** Weight of the newest sample: ~50 samples of memory, so a pool that slows down is seen within seconds of traffic. */
const ALPHA = 0.02;
/** Effective samples before the fit replaces the priors' line. */
const MIN_WEIGHT = 8;

type Fit = { w: number; x: number; y: number; xx: number; xy: number; queue: number; queueW: number };

/** What a TTFT is predicted from: the request's own prefill, the prefill ahead of it, the scraped queue. */
export type TtftInput = {
  /** prompt tokens the worker computes for this request (uncachedTokens) */
  uncachedTokens: number;
  /** prefill tokens of the requests routed to the worker before it that have no first token yet */
  aheadTokens: number;
  /** waiting requests scraped from the worker beyond the ones the load holds as still prefilling there */
  waiting: number;
};

export type TtftSample = TtftInput & { ttftMs: number };

/** What the latency cost also reads: the request's whole prompt (the away charge). */
export type CostInput = TtftInput & { promptTokens: number };

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
  private readonly f: Fit = { w: 0, x: 0, y: 0, xx: 0, xy: 0, queue: 0, queueW: 0 };
  private line: LatencyPriors & { samples: number };

  constructor(
    private readonly priors: LatencyPriors = DEFAULT_LATENCY_PRIORS,
    private readonly followerWeight: FollowerWeightSource = DEFAULT_FOLLOWER_WEIGHT,
    private readonly awayWeight = DEFAULT_AWAY_WEIGHT,
  ) {
    this.line = { ...priors, samples: 0 };
  }

  /** The follower weight the next cost uses. */
  get follower(): number {
    const w = this.followerWeight;
    return typeof w === "number" ? w : w.value;
  }

  /** The pool's current line: base ms, ms per uncached token, ms per waiting request. */
  params(): Readonly<LatencyPriors & { samples: number }> {
    // Refitted on each observation, so a pick reads it without allocating.
    return this.line;
  }

  private fit(): LatencyPriors & { samples: number } {
    const p = this.priors;
    const f = this.f;
    const msPerWaiting = f.queueW >= 1 ? Math.max(0, f.queue / f.queueW) : p.msPerWaiting;
    if (f.w < MIN_WEIGHT) return { ...p, msPerWaiting, samples: Math.round(f.w) };
    const mx = f.x / f.w;
    const my = f.y / f.w;
    const varX = f.xx / f.w - mx * mx;
    // Too little spread in the uncached sizes to tell the slope from the intercept: keep the prior slope.
    const msPerToken = varX > 1 ? Math.max(0, (f.xy / f.w - mx * my) / varX) : p.msPerToken;
    const baseMs = Math.max(0, my - msPerToken * mx);
    return { baseMs, msPerToken, msPerWaiting, samples: Math.round(f.w) };
  }

  predictTtftMs(t: TtftInput): number {
    return ttftOn(this.line, t);
  }

  /**
   * The latency cost: the predicted TTFT plus the follower weight x this request's own prefill time,
   * plus, on a worker `away` from this replica's home share, the away weight x its whole prompt's.
   */
  costMs(t: CostInput, away = false): number {
    const p = this.line;
    const cost = ttftOn(p, t) + this.follower * p.msPerToken * t.uncachedTokens;
    return away ? cost + this.awayWeight * p.msPerToken * t.promptTokens : cost;
  }

  observe(s: TtftSample): void {
    if (!Number.isFinite(s.ttftMs) || s.ttftMs < 0) return;
    const f = this.f;
    if (s.waiting > 0) {
      // The wait is what the line does not explain, shared among the requests ahead.
      const p = this.line;
      const excess = Math.max(0, s.ttftMs - p.baseMs - p.msPerToken * (s.uncachedTokens + s.aheadTokens)) / s.waiting;
      f.queue = (1 - ALPHA) * f.queue + excess;
      f.queueW = (1 - ALPHA) * f.queueW + 1;
      this.line = this.fit();
      return;
    }
    const d = 1 - ALPHA;
    const x = s.uncachedTokens + s.aheadTokens;
    f.w = d * f.w + 1;
    f.x = d * f.x + x;
    f.y = d * f.y + s.ttftMs;
    f.xx = d * f.xx + x * x;
    f.xy = d * f.xy + x * s.ttftMs;
    this.line = this.fit();
  }
}
