// What an HTML report shows; the benchmark and the demo both fill it.

/** [x, y] points; y null = no data in that bucket. */
export type Points = [number, number | null][];

export type ReportData = {
  title: string;
  subtitle: string;
  /** label → value lines under the title (options, environment) */
  facts: [string, string][];
  table: { columns: string[]; rows: string[][] };
  /** x-axis name of the time series */
  timeAxis: string;
  /** moments marked on the time charts (x in the time axis' unit), e.g. a replica killed */
  marks?: { x: number; label: string }[];
  /** the main chart: prefix-cache hit rate over time, one line per run */
  hitRate: { name: string; points: Points }[];
  /** x-axis name of the TTFT chart (simulated or measured) */
  ttftAxis: string;
  /** TTFT distribution per run: [ttft ms, fraction of requests <= it] */
  ttftCdf: { name: string; points: [number, number][] }[];
  /** per run: hit rate / the pooled-LRU bound and TTFT p50 / the TTFT oracle's (1 = at the limit) */
  limits?: { name: string; hitVsPooled: number; hitVsBound: number; ttftVsOracle: number; ttftVsBound: number }[];
  /**
   * The same requests routed several ways, one bar per way in each panel (hit rate; TTFT p50 and p99):
   * what a reader compares first. `note` says where each figure comes from (simulated or measured).
   */
  comparison?: { title: string; note: string; runs: { name: string; hitRate: number; ttftP50Ms: number; ttftP99Ms: number }[] };
  /** per run, per worker: in-flight requests over time */
  workerLoad: { name: string; workers: { name: string; points: Points }[] }[];
};

/** The CDF of a sample at `steps` quantiles (plus the minimum), for a compact distribution chart. */
export function cdfPoints(values: readonly number[], steps = 100): [number, number][] {
  if (values.length === 0) return [];
  const sorted = Float64Array.from(values).sort();
  const out: [number, number][] = [[round(sorted[0]!), 0]];
  for (let s = 1; s <= steps; s++) {
    const q = s / steps;
    out.push([round(sorted[Math.min(sorted.length - 1, Math.ceil(q * sorted.length) - 1)]!), q]);
  }
  return out;
}

const round = (x: number) => Math.round(x * 10) / 10;
