// What the demo measures, in wall-clock time: picks, cache hits (from the workers' usage answers),
// TTFT, in-flight requests per worker.
import { percentile } from "../sim/recorder.ts";
import type { EppScrape } from "./epp-metrics.ts";

export type Outcome = "ok" | "routing-error" | "worker-error";

/** A served request as the load generator read it: the worker's usage, its TTFT, who routed it where. */
export type Served = { promptTokens: number; cachedTokens: number; detailed: boolean; ttftMs: number; epp: string; worker: string };

/** Per replica or per worker: what the workers' usage said about the requests served there. */
export type UsageTally = { served: number; cachedTokens: number; withoutDetails: number; ttftMs: number[] };

export class DemoStats {
  sent = 0;
  done = 0;
  readonly outcomes: Record<Outcome, number> = { ok: 0, "routing-error": 0, "worker-error": 0 };
  /** a routing attempt that failed on one replica and went to another */
  rerouted = 0;
  /** why routing attempts failed, by message */
  readonly routingErrors = new Map<string, number>();
  promptTokens = 0;
  cachedTokens = 0;
  /** sum over finished requests of cached / prompt tokens (the workers' per-request hit rate) */
  requestHitSum = 0;
  /** ext_proc request headers written -> routing answer, in the gateway process */
  readonly pickMs: number[] = [];
  /** arrival instant -> ext_proc request headers written by the gateway: how far behind the trace the requests went out */
  readonly sendLagMs: number[] = [];
  /** bodies that were not ready at their arrival instant (built then, delaying it) */
  lateBodies = 0;
  /**
   * Chat turns continuing an earlier one: those that resent the reply the client received, those sent before
   * it came (the trace's text in its place), and the bodies built again at their instant because it came.
   */
  replies = { resent: 0, stoodIn: 0, rebuilt: 0 };
  /** the body of the request that finished last, and its worker (for the /select check) */
  lastServed?: { body: Uint8Array; worker: string };
  /** each replica's own pick and overlap histograms, scraped when it stopped taking traffic */
  readonly eppScrapes = new Map<string, EppScrape>();
  readonly ttftMs: number[] = [];
  readonly picksByWorker = new Map<string, number>();
  readonly picksByEpp = new Map<string, number>();
  /** the workers' usage of the requests each replica routed, and of those each worker served */
  readonly usageByEpp = new Map<string, UsageTally>();
  readonly usageByWorker = new Map<string, UsageTally>();
  private readonly inflight = new Map<string, number>();
  /** per second since start, of the requests finished in it: [prompt tokens, cached tokens, sum of cached/prompt, requests] */
  private readonly hitBuckets: [number, number, number, number][] = [];
  /** per second since start, of the picks the replicas made in it (as far as scrapes tell): [sum of overlap ratios, picks] */
  private readonly predictedBuckets: [number, number][] = [];
  /** each replica's overlap histogram sum and count at its previous scrape */
  private readonly lastOverlap = new Map<string, { sum: number; count: number }>();
  /** per second since start: in-flight per worker, sampled */
  readonly loadSamples: { t: number; byWorker: Map<string, number> }[] = [];
  private readonly started = performance.now();
  /** moments worth marking on the charts, seconds since start */
  readonly marks: { x: number; label: string }[] = [];

  constructor(readonly workerIds: readonly string[]) {
    for (const w of workerIds) this.inflight.set(w, 0);
  }

  elapsedS(): number {
    return (performance.now() - this.started) / 1000;
  }

  picked(worker: string, epp: string, pickMs: number, sendLagMs: number): void {
    this.pickMs.push(pickMs);
    this.sendLagMs.push(sendLagMs);
    this.picksByWorker.set(worker, (this.picksByWorker.get(worker) ?? 0) + 1);
    this.picksByEpp.set(epp, (this.picksByEpp.get(epp) ?? 0) + 1);
    this.inflight.set(worker, (this.inflight.get(worker) ?? 0) + 1);
  }

  routingFailed(reason: string): void {
    this.routingErrors.set(reason, (this.routingErrors.get(reason) ?? 0) + 1);
  }

  released(worker: string): void {
    this.inflight.set(worker, (this.inflight.get(worker) ?? 1) - 1);
  }

  finished(outcome: Outcome, r?: Served): void {
    this.done++;
    this.outcomes[outcome]++;
    if (!r) return;
    for (const [m, key] of [[this.usageByEpp, r.epp], [this.usageByWorker, r.worker]] as const) {
      let t = m.get(key);
      if (!t) m.set(key, (t = { served: 0, cachedTokens: 0, withoutDetails: 0, ttftMs: [] }));
      t.served++;
      t.cachedTokens += r.cachedTokens;
      if (!r.detailed) t.withoutDetails++;
      t.ttftMs.push(r.ttftMs);
    }
    this.promptTokens += r.promptTokens;
    this.cachedTokens += r.cachedTokens;
    const ratio = r.promptTokens > 0 ? r.cachedTokens / r.promptTokens : 0;
    this.requestHitSum += ratio;
    this.ttftMs.push(r.ttftMs);
    const cell = (this.hitBuckets[Math.floor(this.elapsedS())] ??= [0, 0, 0, 0]);
    cell[0] += r.promptTokens;
    cell[1] += r.cachedTokens;
    cell[2] += ratio;
    cell[3]++;
  }

  /**
   * A replica's scrape: kept as its latest (the summary's figures), and the picks since its previous
   * scrape are placed in the current second (scraped every few seconds, so within that much of when
   * they were made).
   */
  eppScraped(replica: string, s: EppScrape): void {
    if (!("failed" in s) || !this.eppScrapes.has(replica)) this.eppScrapes.set(replica, s);
    if ("failed" in s) return;
    const prev = this.lastOverlap.get(replica) ?? { sum: 0, count: 0 };
    this.lastOverlap.set(replica, { sum: s.overlap.sum, count: s.overlap.count });
    if (s.overlap.count <= prev.count) return;
    const cell = (this.predictedBuckets[Math.floor(this.elapsedS())] ??= [0, 0]);
    cell[0] += s.overlap.sum - prev.sum;
    cell[1] += s.overlap.count - prev.count;
  }

  mark(label: string): void {
    this.marks.push({ x: Math.round(this.elapsedS() * 10) / 10, label });
  }

  sampleLoad(): void {
    this.loadSamples.push({ t: Math.round(this.elapsedS() * 10) / 10, byWorker: new Map(this.inflight) });
  }

  get hitRate(): number {
    return this.promptTokens > 0 ? this.cachedTokens / this.promptTokens : 0;
  }

  /** mean over requests of the workers' cached / prompt tokens */
  get requestHitMean(): number {
    return this.ttftMs.length > 0 ? this.requestHitSum / this.ttftMs.length : 0;
  }

  /** mean over the replicas' picks of the overlap they predicted (chosen worker's cached blocks / request blocks) */
  predictedHit(): { mean: number; picks: number } {
    let sum = 0;
    let picks = 0;
    for (const s of this.eppScrapes.values()) {
      if ("failed" in s) continue;
      sum += s.overlap.sum;
      picks += s.overlap.count;
    }
    return { mean: picks > 0 ? sum / picks : 0, picks };
  }

  pickP(q: number): number {
    return percentile(this.pickMs, q);
  }

  sendLagP(q: number): number {
    return percentile(this.sendLagMs, q);
  }

  ttftP(q: number): number {
    return percentile(this.ttftMs, q);
  }

  /** per 5-second window [seconds, rate]: the workers' cached / prompt tokens, over the window's tokens */
  hitSeries(windowS = 5): [number, number | null][] {
    return windowed(this.hitBuckets, windowS, (c) => [c[0], c[1]]);
  }

  /** per 5-second window: the workers' cached / prompt tokens, mean over the window's requests */
  requestHitSeries(windowS = 5): [number, number | null][] {
    return windowed(this.hitBuckets, windowS, (c) => [c[3], c[2]]);
  }

  /** per 5-second window: the overlap the replicas predicted, mean over the window's picks */
  predictedSeries(windowS = 5): [number, number | null][] {
    return windowed(this.predictedBuckets, windowS, (c) => [c[1], c[0]]);
  }
}

/** Sums `[denominator, numerator]` of per-second cells over windows: [window middle, numerator / denominator]. */
function windowed<C>(cells: readonly (C | undefined)[], windowS: number, part: (c: C) => [number, number]): [number, number | null][] {
  const out: [number, number | null][] = [];
  for (let s = 0; s < cells.length; s += windowS) {
    let d = 0;
    let n = 0;
    for (let b = s; b < s + windowS; b++) {
      const c = cells[b];
      if (c === undefined) continue;
      const [x, y] = part(c);
      d += x;
      n += y;
    }
    out.push([s + windowS / 2, d > 0 ? Math.round((n / d) * 1000) / 1000 : null]);
  }
  return out;
}
