// What a replay measures, in virtual time: cache hits, TTFT, in-flight requests per worker.

/** Per-bucket series and whole-run totals for one policy run. */
export type RunSeries = {
  /** bucket width, virtual ms */
  bucketMs: number;
  /** cached / prompt tokens of the requests admitted in each bucket (null: none admitted) */
  hitRate: (number | null)[];
  /** time-averaged in-flight requests (running + waiting) per worker, per bucket: [worker][bucket] */
  workerLoad: number[][];
};

export class Recorder {
  promptTokens = 0;
  cachedTokens = 0;
  readonly ttftMs: number[] = [];
  private readonly bucketPrompt: number[] = [];
  private readonly bucketCached: number[] = [];
  /** ∫ in-flight dt per worker per bucket */
  private readonly loadArea: number[][];
  private readonly inflight: number[];
  private readonly since: number[];
  /** Σ over arrivals of max/mean in-flight (when any is in flight), for the instantaneous imbalance */
  private instantSum = 0;
  private instantCount = 0;

  constructor(
    workers: number,
    readonly bucketMs: number,
  ) {
    this.loadArea = Array.from({ length: workers }, () => []);
    this.inflight = new Array(workers).fill(0);
    this.since = new Array(workers).fill(0);
  }

  firstToken(now: number, promptTokens: number, cachedTokens: number, ttftMs: number): void {
    this.promptTokens += promptTokens;
    this.cachedTokens += cachedTokens;
    this.ttftMs.push(ttftMs);
    const b = Math.floor(now / this.bucketMs);
    this.bucketPrompt[b] = (this.bucketPrompt[b] ?? 0) + promptTokens;
    this.bucketCached[b] = (this.bucketCached[b] ?? 0) + cachedTokens;
  }

  /** In-flight count of `worker` changes by `delta` at `now`. */
  inflightChange(worker: number, now: number, delta: number): void {
    this.accrue(worker, now);
    this.inflight[worker]! += delta;
  }

  /** Samples the instantaneous max/mean in-flight (called at every arrival, before routing it). */
  sampleInstant(): void {
    let max = 0;
    let sum = 0;
    for (const n of this.inflight) {
      sum += n;
      if (n > max) max = n;
    }
    if (sum === 0) return;
    this.instantSum += max / (sum / this.inflight.length);
    this.instantCount++;
  }

  /** Closes the load integrals at the end of the run. */
  finish(now: number): void {
    for (let w = 0; w < this.inflight.length; w++) this.accrue(w, now);
  }

  /**
   * Load imbalance, time-weighted: max over workers of ∫ in-flight dt, divided by the mean over
   * workers of the same integral (1 = perfectly even; the worst possible is the number of workers).
   */
  imbalance(): number {
    const totals = this.loadArea.map((a) => a.reduce((s, v) => s + (v ?? 0), 0));
    const mean = totals.reduce((s, v) => s + v, 0) / totals.length;
    return mean > 0 ? Math.max(...totals) / mean : 1;
  }

  /** Mean over arrivals of the instantaneous max/mean in-flight (noisier: few requests are in flight). */
  instantImbalance(): number {
    return this.instantCount > 0 ? this.instantSum / this.instantCount : 1;
  }

  series(): RunSeries {
    const buckets = Math.max(this.bucketPrompt.length, ...this.loadArea.map((a) => a.length));
    const hitRate: (number | null)[] = [];
    for (let b = 0; b < buckets; b++) {
      const p = this.bucketPrompt[b] ?? 0;
      hitRate.push(p > 0 ? (this.bucketCached[b] ?? 0) / p : null);
    }
    const workerLoad = this.loadArea.map((a) =>
      Array.from({ length: buckets }, (_, b) => round3((a[b] ?? 0) / this.bucketMs)),
    );
    return { bucketMs: this.bucketMs, hitRate: hitRate.map((h) => (h === null ? null : round3(h))), workerLoad };
  }

  private accrue(worker: number, now: number): void {
    let t = this.since[worker]!;
    const n = this.inflight[worker]!;
    const area = this.loadArea[worker]!;
    while (t < now) {
      const b = Math.floor(t / this.bucketMs);
      const end = Math.min(now, (b + 1) * this.bucketMs);
      if (end <= t) break;
      area[b] = (area[b] ?? 0) + n * (end - t);
      t = end;
    }
    this.since[worker] = now;
  }
}

const round3 = (x: number) => Math.round(x * 1000) / 1000;

/** Nearest-rank percentile of an unsorted sample (0 < q <= 1). */
export function percentile(values: readonly number[], q: number): number {
  if (values.length === 0) return Number.NaN;
  const sorted = Float64Array.from(values).sort();
  return sorted[percentileRank(sorted.length, q)]!;
}

/** The position in sorted order of the q-quantile of n values (nearest rank). */
export function percentileRank(n: number, q: number): number {
  return Math.min(n - 1, Math.max(0, Math.ceil(q * n) - 1));
}
