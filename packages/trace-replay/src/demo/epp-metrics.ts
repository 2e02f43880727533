// The EPPs' own view, read from a replica's Prometheus /metrics: pick latency
// (`dynamo_epp_pick_duration_seconds`, complete body -> decision, in the EPP process) next to the
// gateway's round-trip figure, and the prefix overlap it predicted (`dynamo_epp_overlap_ratio`, the
// chosen worker's cached blocks / request blocks per pick) next to what the workers then reported.
// Histograms are cumulative per process, so each replica is scraped once, when it stops taking
// traffic (before it is killed, or at the end).

export const PICK_HISTOGRAM = "dynamo_epp_pick_duration_seconds";
export const OVERLAP_HISTOGRAM = "dynamo_epp_overlap_ratio";

/** A Prometheus histogram: cumulative counts per upper bound (seconds), +Inf last. */
export type Histogram = { buckets: { le: number; count: number }[]; count: number; sum: number };

/** Reads histogram `name` (without labels) from Prometheus text exposition; undefined when absent. */
export function parseHistogram(text: string, name: string): Histogram | undefined {
  const buckets: { le: number; count: number }[] = [];
  let count: number | undefined;
  let sum = 0;
  for (const line of text.split("\n")) {
    if (!line.startsWith(name)) continue;
    const rest = line.slice(name.length);
    const value = Number(rest.slice(rest.lastIndexOf(" ") + 1));
    const le = /^_bucket\{le="([^"]+)"\}/.exec(rest)?.[1];
    if (le !== undefined) buckets.push({ le: le === "+Inf" ? Infinity : Number(le), count: value });
    else if (rest.startsWith("_count ")) count = value;
    else if (rest.startsWith("_sum ")) sum = value;
  }
  if (count === undefined || buckets.length === 0) return undefined;
  buckets.sort((a, b) => a.le - b.le);
  return { buckets, count, sum };
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

export type EppScrape = { pick: Histogram; overlap: Histogram } | { failed: string };

/** Scrapes one replica's pick and overlap histograms, or says why they could not be read. */
export async function scrapeEppMetrics(metricsUrl: string): Promise<EppScrape> {
  try {
    const res = await fetch(metricsUrl, { signal: AbortSignal.timeout(2000) });
    if (!res.ok) return { failed: `${metricsUrl}: HTTP ${res.status}` };
    const text = await res.text();
    const pick = parseHistogram(text, PICK_HISTOGRAM);
    const overlap = parseHistogram(text, OVERLAP_HISTOGRAM);
    if (!pick || !overlap) return { failed: `${metricsUrl}: no ${pick ? OVERLAP_HISTOGRAM : PICK_HISTOGRAM}` };
    return { pick, overlap };
  } catch (e) {
    return { failed: `${metricsUrl}: ${e instanceof Error ? e.message : String(e)}` };
  }
}
