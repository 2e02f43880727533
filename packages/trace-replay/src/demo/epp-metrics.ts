// The EPPs' own view, read from a replica's Prometheus /metrics: pick latency
// (`dynamo_epp_pick_duration_seconds`, complete body -> decision, in the EPP process) next to the
// gateway's round-trip figure, and the prefix overlap it predicted (`dynamo_epp_overlap_ratio`, the
// chosen worker's cached blocks / request blocks per pick) next to what the workers then reported.
// Histograms are cumulative per process, so each replica is scraped once, when it stops taking
// traffic (before it is killed, or at the end). Beside them its live routing quality: per response,
// the cached tokens it predicted minus those the worker reported (an error histogram), the responses
// it scored and mispredicted per worker, and the TTFT it observed per worker (decision -> first
// response body chunk, as the gateway passed the response through ext_proc).

export const PICK_HISTOGRAM = "dynamo_epp_pick_duration_seconds";
export const OVERLAP_HISTOGRAM = "dynamo_epp_overlap_ratio";
/** Tokenization per pick, from the EPP's tokenizer pool: fresh (uncached) tokens, and tokens cached only by reply warming. */
export const TOKENIZER_METRICS = {
  fresh: "dynamo_epp_tokenizer_fresh_tokens", warmed: "dynamo_epp_tokenizer_warmed_tokens_total", fallbacks: "dynamo_epp_tokenizer_budget_fallbacks_total",
  decided: "dynamo_epp_tokenizer_decided_early_total",
} as const;
/**
 * What a pick can wait for inside the EPP: its tokenization for a pool member (queued behind another job, or the
 * member waiting for a CPU), and the decision thread's event loop (any work or collector pause that holds it).
 */
export const WAIT_METRICS = { pool: "dynamo_epp_tokenizer_pool_wait_seconds", loop: "dynamo_epp_event_loop_lag_seconds" } as const;
export const QUALITY_METRICS = {
  error: "dynamo_epp_cached_tokens_prediction_error",
  predictions: "dynamo_epp_cached_tokens_predictions_total",
  mispredictions: "dynamo_epp_cached_tokens_mispredictions_total",
  ttft: "dynamo_epp_observed_ttft_seconds",
  inflight: "dynamo_epp_inflight_requests",
  releasedWithoutResponseBody: "dynamo_epp_released_without_response_body_total",
} as const;

/** A Prometheus histogram: cumulative counts per upper bound (seconds), +Inf last. */
export type Histogram = { buckets: { le: number; count: number }[]; count: number; sum: number };

type Sample = { suffix: string; labels: Record<string, string>; value: number };

/** The samples of metric family `name` in Prometheus text exposition (labels without escapes, as prom-client writes the EPP's). */
export function samples(text: string, name: string): Sample[] {
  const out: Sample[] = [];
  for (const line of text.split("\n")) {
    if (!line.startsWith(name)) continue;
    const m = /^([a-z_]*)(?:\{([^}]*)\})? (\S+)$/.exec(line.slice(name.length));
    if (!m) continue;
    const labels: Record<string, string> = {};
    for (const l of (m[2] ?? "").matchAll(/(\w+)="([^"]*)"/g)) labels[l[1]!] = l[2]!;
    out.push({ suffix: m[1]!, labels, value: Number(m[3]) });
  }
  return out;
}

/** Histogram `name` per value of label `by` ("" for a histogram without labels); ranks of one worker are summed. */
export function parseHistograms(text: string, name: string, by?: string): Map<string, Histogram> {
  const acc = new Map<string, { buckets: Map<number, number>; count?: number; sum: number }>();
  for (const s of samples(text, name)) {
    const key = by ? (s.labels[by] ?? "") : "";
    let h = acc.get(key);
    if (!h) acc.set(key, (h = { buckets: new Map(), sum: 0 }));
    if (s.suffix === "_bucket" && s.labels.le !== undefined) {
      const le = s.labels.le === "+Inf" ? Infinity : Number(s.labels.le);
      h.buckets.set(le, (h.buckets.get(le) ?? 0) + s.value);
    } else if (s.suffix === "_count") h.count = (h.count ?? 0) + s.value;
    else if (s.suffix === "_sum") h.sum += s.value;
  }
  const out = new Map<string, Histogram>();
  for (const [key, h] of acc) {
    if (h.count === undefined || h.buckets.size === 0) continue;
    const buckets = [...h.buckets].map(([le, count]) => ({ le, count })).sort((a, b) => a.le - b.le);
    out.set(key, { buckets, count: h.count, sum: h.sum });
  }
  return out;
}

/** Reads histogram `name` (without labels) from Prometheus text exposition; undefined when absent. */
export function parseHistogram(text: string, name: string): Histogram | undefined {
  return parseHistograms(text, name).get("");
}

/** Counter or gauge `name` summed per value of label `by` (all under "" without `by`). */
export function parseValues(text: string, name: string, by?: string): Map<string, number> {
  const out = new Map<string, number>();
  for (const s of samples(text, name)) {
    if (s.suffix !== "") continue;
    const key = by ? (s.labels[by] ?? "") : "";
    out.set(key, (out.get(key) ?? 0) + s.value);
  }
  return out;
}

/** The share of a histogram's observations above `bound` (one of its bucket bounds, else undefined). */
export function shareAbove(h: Histogram, bound: number): number | undefined {
  const b = h.buckets.find((x) => x.le === bound);
  return b === undefined || h.count === 0 ? undefined : (h.count - b.count) / h.count;
}

/** Sums histograms of the same buckets (one worker's TTFT across replicas). */
export function mergeHistograms(hs: readonly Histogram[]): Histogram | undefined {
  if (hs.length === 0) return undefined;
  const counts = new Map<number, number>();
  for (const h of hs) for (const b of h.buckets) counts.set(b.le, (counts.get(b.le) ?? 0) + b.count);
  return {
    buckets: [...counts].map(([le, count]) => ({ le, count })).sort((a, b) => a.le - b.le),
    count: hs.reduce((a, h) => a + h.count, 0),
    sum: hs.reduce((a, h) => a + h.sum, 0),
  };
}

/**
 * Quantile q of a histogram, in seconds, interpolated linearly inside the bucket it falls in (as
 * Prometheus' histogram_quantile does); in the +Inf bucket, the highest finite bound. NaN when empty.
 */
export function histogramQuantile(h: Histogram, q: number): number {
  if (h.count === 0) return Number.NaN;
  const rank = q * h.count;
  let prevLe = 0;
  let prevCount = 0;
  for (const b of h.buckets) {
    if (b.count >= rank) {
      if (b.le === Infinity) return prevLe;
      const inBucket = b.count - prevCount;
      return inBucket > 0 ? prevLe + ((b.le - prevLe) * (rank - prevCount)) / inBucket : b.le;
    }
    prevLe = b.le;
    prevCount = b.count;
  }
  return prevLe;
}

/** A replica's live routing quality, from the response path the gateway passes through ext_proc. */
export type RoutingQuality = {
  /** predicted minus reported cached tokens, one observation per scored response */
  error: Histogram;
  /** per worker: responses scored, and of those predicted more than one block off */
  predictions: Map<string, number>;
  mispredictions: Map<string, number>;
  /** per worker: decision -> first response body chunk, seconds */
  ttft: Map<string, Histogram>;
  /** routed requests whose load was released with no response body seen */
  releasedWithoutResponseBody: number;
};

/**
 * Fresh tokens per pick tokenized in full (absent without a tokenizer pool), the tokens those picks found cached only
 * because a reply was warmed, the picks routed on their known prefix because the budget ran out, and those routed
 * on a known prefix that settled their match (neither in `fresh`).
 */
export type Tokenization = { fresh: Histogram; warmedTokens: number; fallbacks: number; decided: number };

/** WAIT_METRICS as scraped (`pool` absent without a tokenizer pool). */
export type Waits = { pool?: Histogram; loop?: Histogram };

export type EppScrape =
  | { pick: Histogram; overlap: Histogram; quality: RoutingQuality; inflight: number; tokenization?: Tokenization; waits?: Waits }
  | { failed: string };

/** Scrapes one replica's pick and overlap histograms, or says why they could not be read. */
export async function scrapeEppMetrics(metricsUrl: string): Promise<EppScrape> {
  try {
    const res = await fetch(metricsUrl, { signal: AbortSignal.timeout(2000) });
    if (!res.ok) return { failed: `${metricsUrl}: HTTP ${res.status}` };
    const text = await res.text();
    const pick = parseHistogram(text, PICK_HISTOGRAM);
    const overlap = parseHistogram(text, OVERLAP_HISTOGRAM);
    if (!pick || !overlap) return { failed: `${metricsUrl}: no ${pick ? OVERLAP_HISTOGRAM : PICK_HISTOGRAM}` };
    const q = QUALITY_METRICS;
    const error = parseHistogram(text, q.error);
    if (!error) return { failed: `${metricsUrl}: no ${q.error}` };
    const quality: RoutingQuality = {
      error,
      predictions: parseValues(text, q.predictions, "worker"),
      mispredictions: parseValues(text, q.mispredictions, "worker"),
      ttft: parseHistograms(text, q.ttft, "worker"),
      releasedWithoutResponseBody: parseValues(text, q.releasedWithoutResponseBody).get("") ?? 0,
    };
    const fresh = parseHistogram(text, TOKENIZER_METRICS.fresh);
    const tokenization = fresh && {
      fresh, warmedTokens: parseValues(text, TOKENIZER_METRICS.warmed).get("") ?? 0, fallbacks: parseValues(text, TOKENIZER_METRICS.fallbacks).get("") ?? 0,
      decided: parseValues(text, TOKENIZER_METRICS.decided).get("") ?? 0,
    };
    const waits: Waits = {};
    for (const k of ["pool", "loop"] as const) {
      const h = parseHistogram(text, WAIT_METRICS[k]);
      if (h) waits[k] = h;
    }
    return { pick, overlap, quality, inflight: parseValues(text, q.inflight).get("") ?? 0, ...(tokenization ? { tokenization } : {}), waits };
  } catch (e) {
    return { failed: `${metricsUrl}: ${e instanceof Error ? e.message : String(e)}` };
  }
}
