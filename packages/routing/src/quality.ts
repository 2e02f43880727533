// Live routing quality: does what the picker predicted hold on the worker? Per routed request it keeps
// the predicted cached tokens (the chosen worker's overlap in the index x block size); the response
// says the actual ones (vLLM's usage.prompt_tokens_details.cached_tokens, in the final SSE usage chunk
// or the JSON body), and in a streamed response the first body chunk marks the first token, so the
// EPP sees each request's TTFT per worker. A growing gap between prediction and truth is the sign that
// the index has drifted from the caches (a reset or lost events behind the EPP's back).
import { hittableBlocks, type TtftSample } from "./latency.ts";
import type { Decision, ScoredCandidate } from "./picker.ts";
import { workerKey, type WorkerRef } from "@kv-epp/protocol";
import type { RoutingMetrics } from "./ports.ts";
import { UsageScan } from "./usage-scan.ts";

export type Prediction = {
  workerKey: string;
  workerId: string;
  dpRank: number;
  /** Overlap x block size, at most what vLLM can hit: what the index says the worker will find cached. */
  predictedCachedTokens: number;
  /**
   * The pick saw only a known prefix of the prompt and the worker holds all of it (ScoredCandidate.openEnded):
   * it may find more cached than predicted, which is then no misprediction.
   */
  lowerBound: boolean;
  /** Prompt tokens the prediction was made for (the uncached part sets the prefill). */
  promptTokens: number;
  blockSize: number;
  /** Waiting requests scraped from the worker at the pick beyond those the load held as prefilling there. */
  waiting: number;
  /** Prefill tokens ahead of the request on the worker at the pick. */
  aheadTokens: number;
};

/** What a routing decision predicts about its worker (or another candidate it scored). */
export function predictionOf(d: Extract<Decision, { kind: "picked" }>, c: ScoredCandidate = d.chosen): Prediction {
  const hittable = Math.min(d.requestBlocks, hittableBlocks(d.promptTokens, d.blockSize));
  return {
    workerKey: c.candidate.key,
    workerId: c.candidate.workerId,
    dpRank: c.candidate.dpRank,
    predictedCachedTokens: Math.min(c.overlap, hittable) * d.blockSize,
    lowerBound: c.openEnded,
    promptTokens: d.promptTokens,
    blockSize: d.blockSize,
    waiting: c.unexplainedWaiting,
    aheadTokens: c.aheadTokens,
  };
}

/** What a response told of the rank that served it: its TTFT, and its cached tokens when it reported them. */
export type Observed = { prediction: Prediction; ttftMs: number; cachedTokens: number | undefined };

/**
 * The latency model's calibration sample from a response: the prefill it did is the prompt less what
 * it reported cached (the prediction's cached tokens where it reported none), after what was ahead of it
 * at the pick; none when it reported none and the prediction was only a lower bound.
 */
export function calibrationSample(o: Observed): TtftSample | undefined {
  const p = o.prediction;
  if (p.lowerBound && o.cachedTokens === undefined) return undefined; // the prefill it did is not known
  const uncachedTokens = Math.max(p.promptTokens - (o.cachedTokens ?? p.predictedCachedTokens), 0);
  return { ttftMs: o.ttftMs, uncachedTokens, aheadTokens: p.aheadTokens, waiting: p.waiting };
}

/** A worker's recent predictions, for GET /workers. */
export type WorkerAccuracy = {
  /** Responses that reported cached tokens, in the window. */
  samples: number;
  /** Of those, predictions off by more than one block. */
  mispredicted: number;
  /** 1 - mispredicted / samples (null without samples). */
  accuracy: number | null;
  /** Mean |predicted - actual| cached tokens. */
  meanAbsErrorTokens: number | null;
  /** Mean observed TTFT, ms, over the streamed responses in the window. */
  meanTtftMs: number | null;
};

type Sample = { absError: number; mispredicted: boolean };

// Responses kept per worker for /workers: enough to smooth, few enough to show a reset within a minute.
const WINDOW = 64;

class Ring<T> {
  readonly items: T[] = [];
  private next = 0;
  push(v: T): void {
    if (this.items.length < WINDOW) this.items.push(v);
    else this.items[this.next] = v;
    this.next = (this.next + 1) % WINDOW;
  }
}

export class RoutingQuality {
  private readonly samples = new Map<string, Ring<Sample>>();
  private readonly ttfts = new Map<string, Ring<number>>();
  /** Workers that have reported prompt_tokens_details at least once (vLLM's --enable-prompt-tokens-details). */
  private readonly detailed = new Set<string>();

  constructor(private readonly metrics: RoutingMetrics) {}

  /**
   * Starts watching the response of a routed request; `decidedAt` is performance.now() at the pick. `usage`: the
   * scan its body chunks go into (body()), when another reader shares it.
   */
  watch(p: Prediction, decidedAt: number, usage = new UsageScan()): ResponseWatch {
    return new ResponseWatch(this, p, decidedAt, usage);
  }

  accuracy(workerKey: string): WorkerAccuracy {
    const s = this.samples.get(workerKey)?.items ?? [];
    const t = this.ttfts.get(workerKey)?.items ?? [];
    const mis = s.filter((x) => x.mispredicted).length;
    return {
      samples: s.length,
      mispredicted: mis,
      accuracy: s.length > 0 ? 1 - mis / s.length : null,
      meanAbsErrorTokens: s.length > 0 ? s.reduce((a, x) => a + x.absError, 0) / s.length : null,
      meanTtftMs: t.length > 0 ? t.reduce((a, x) => a + x, 0) / t.length : null,
    };
  }

  /** The rank left the pool: what was learnt of it goes, and its figures (pods churn: nothing would prune them). */
  forget(rank: WorkerRef): void {
    const key = workerKey(rank);
    this.samples.delete(key);
    this.ttfts.delete(key);
    this.detailed.delete(key);
    this.metrics.forgetRank(rank);
  }

  /** The worker has reported prompt_tokens_details at least once. */
  reportsDetails(workerKey: string): boolean {
    return this.detailed.has(workerKey);
  }

  /** The worker's response said how many prompt tokens it found cached (or, by a null, none). */
  recordActual(p: Prediction, actual: number | "none"): void {
    if (actual !== "none") this.detailed.add(p.workerKey);
    // vLLM releases before cached_tokens 0 write prompt_tokens_details only when they found something
    // cached (a miss: null in a JSON body, absent from the streamed usage chunk), and none at all
    // without --enable-prompt-tokens-details: a miss counts as 0 only from a worker that has shown it
    // reports the details.
    else if (!this.detailed.has(p.workerKey)) return;
    const cached = actual === "none" ? 0 : actual;
    const error = p.predictedCachedTokens - cached;
    // A lower bound found (or passed) is what it predicted: only finding less tells of the index drifting.
    const mispredicted = p.lowerBound ? error > p.blockSize : Math.abs(error) > p.blockSize;
    this.metrics.cachedTokens(p, error, mispredicted);
    ring(this.samples, p.workerKey).push({ absError: Math.abs(error), mispredicted });
  }

  recordTtft(p: Prediction, ttftMs: number): void {
    this.metrics.observedTtft(p, ttftMs / 1000);
    ring(this.ttfts, p.workerKey).push(ttftMs);
  }
}

function ring<T>(m: Map<string, Ring<T>>, key: string): Ring<T> {
  let r = m.get(key);
  if (!r) m.set(key, (r = new Ring<T>()));
  return r;
}

/** One response's watch: its bodies are scanned as they pass (UsageScan), none of it kept. */
export class ResponseWatch {
  private streamed = false;
  /** The first body chunk is the first token: an SSE stream the data plane passes on as it comes. */
  private timed = false;
  private firstBodyAt: number | undefined;
  private done = false;

  constructor(
    private readonly quality: RoutingQuality,
    private prediction: Prediction,
    private readonly decidedAt: number,
    private readonly usage: UsageScan,
  ) {}

  /**
   * Another rank served the request (a retry or fallback the data plane reports): what the decision
   * predicted for that one, or undefined when it was not scored (then the response is not counted).
   */
  servedBy(p: Prediction | undefined): void {
    if (p) this.prediction = p;
    else this.done = true;
  }

  /**
   * Response headers. An SSE stream's first body chunk is its first token (a JSON body comes whole),
   * if the data plane sends the chunks as they arrive (`chunked`: not a buffered body mode).
   */
  headers(contentType: string | undefined, chunked: boolean): void {
    this.streamed = contentType?.startsWith("text/event-stream") === true;
    this.timed = this.streamed && chunked;
  }

  /** A response body chunk, as the data plane passed it. */
  body(chunk: Uint8Array, now = performance.now()): void {
    if (this.firstBodyAt === undefined && chunk.length > 0) this.firstBodyAt = now;
    this.usage.add(chunk);
  }

  /** The response ended (or the stream broke): record what it told (idempotent); its TTFT, when it was timed. */
  end(): Observed | undefined {
    if (this.done) return undefined;
    this.done = true;
    const p = this.prediction;
    // vLLM's OpenAI names: what its chat and text completions report.
    const cached = this.usage.field("cached_tokens");
    // Only a response that carried its usage says anything about the cache: a JSON body's, or a
    // stream's final usage chunk (one cut before it says nothing).
    const usageEnded = this.usage.field("prompt_tokens") !== undefined && (!this.streamed || this.usage.finalUsage);
    if (cached !== undefined) this.quality.recordActual(p, cached);
    else if (usageEnded) this.quality.recordActual(p, "none");
    if (this.timed && this.firstBodyAt !== undefined) {
      // A miss is 0 cached tokens only from a worker known to report them; else the prediction stands.
      const cachedTokens = cached ?? (usageEnded && this.quality.reportsDetails(p.workerKey) ? 0 : undefined);
      const ttftMs = this.firstBodyAt - this.decidedAt;
      this.quality.recordTtft(p, ttftMs);
      return { prediction: p, ttftMs, cachedTokens };
    }
    return undefined;
  }
}
