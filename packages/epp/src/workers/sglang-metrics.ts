// SGLang's scheduler gauges (sglang/srt/metrics/collector.py), read beside vLLM's. Each scheduler labels its
// series with model_name, engine_type, tp_rank and pp_rank, and dp_rank only when the server runs several DP
// ranks. Only a DP group's attention-TP rank 0 exports them unless --enable-metrics-for-all-schedulers, when
// every TP (and PP) rank writes its own copy of the same numbers: a DP rank's lowest (pp_rank, tp_rank) series
// is kept so they are not counted twice.

type Gauge = "running" | "queue" | "usage" | "tokens";

const GAUGES: Readonly<Record<string, Gauge>> = {
  "sglang:num_running_reqs": "running",
  "sglang:num_queue_reqs": "queue",
  "sglang:token_usage": "usage",
  "sglang:max_total_num_tokens": "tokens",
};

type Rank = { pp: number; tp: number; values: Partial<Record<Gauge, number>> };

/** What the SGLang gauges add to a scrape's signals. */
export type SglangSignals = {
  running: number;
  waiting: number;
  waitingByEngine: Map<number, number>;
  kvUsage: number;
  poolTokens: Map<number, number>;
};

export class SglangGauges {
  /** By dp_rank (undefined: the server's only DP rank, which SGLang leaves unlabelled). */
  private readonly ranks = new Map<number | undefined, Rank>();

  /** Takes a series of one of the gauges read here; false for any other name. `rank`: a rank label's index, if one. */
  add(name: string, value: number, rank: (label: string) => number | undefined): boolean {
    const gauge = GAUGES[name];
    if (gauge === undefined) return false;
    const dp = rank("dp_rank");
    const pp = rank("pp_rank") ?? 0;
    const tp = rank("tp_rank") ?? 0;
    const r = this.ranks.get(dp);
    if (r === undefined || pp < r.pp || (pp === r.pp && tp < r.tp)) this.ranks.set(dp, { pp, tp, values: { [gauge]: value } });
    else if (pp === r.pp && tp === r.tp) r.values[gauge] = value;
    return true;
  }

  /**
   * Adds the kept ranks into `out`: requests summed (the queue per labelled DP rank too, as vLLM's per-engine
   * waiting), the highest token usage, and each rank's KV pool in tokens, as SGLang reports it (counted in
   * blocks when read, at the index's block size then: it may change, see WorkerMetricsScraper.gpuBlocks).
   */
  addTo(out: SglangSignals): void {
    for (const [dp, { values: v }] of this.ranks) {
      out.running += v.running ?? 0;
      if (v.queue !== undefined) {
        out.waiting += v.queue;
        if (dp !== undefined) out.waitingByEngine.set(dp, (out.waitingByEngine.get(dp) ?? 0) + v.queue);
      }
      if (v.usage !== undefined) out.kvUsage = Math.max(out.kvUsage, v.usage);
      if (v.tokens !== undefined && v.tokens > 0) out.poolTokens.set(dp ?? 0, v.tokens);
    }
  }
}
