// SGLang's scheduler gauges (sglang/srt/metrics/collector.py), read beside vLLM's. Each scheduler labels its
// series with model_name, engine_type, tp_rank and pp_rank, and dp_rank only when the server runs several DP
// ranks. Only a DP group's attention-TP rank 0 exports them unless --enable-metrics-for-all-schedulers, when
// every TP (and PP) rank writes its own copy of the same numbers: a DP rank's lowest (pp_rank, tp_rank) series
// is kept so they are not counted twice.

type Gauge = "running" | "usage" | "tokens" | Queue;

/**
 * The queues whose requests wait on this rank for their turn, each beside the others (a request is in one at a time,
 * and in none of them once running): all of them are ahead of a request routed here.
 * - `num_queue_reqs`: the scheduler's waiting queue, ready to be scheduled.
 * - `num_grammar_queue_reqs`: requests whose grammar (structured output) is still compiling; they enter the waiting
 *   queue once it is.
 * - `num_prefill_prealloc_queue_reqs` (a prefill server): the bootstrap queue, requests waiting for their decode
 *   server's handshake and its KV memory before they may be prefilled.
 * - `num_decode_prealloc_queue_reqs` (a decode server): requests waiting for KV memory to receive their prompt's KV into.
 * - `num_decode_transfer_queue_reqs` (a decode server): requests whose KV is still arriving from their prefill
 *   server; they join the waiting queue once it has.
 * Not `num_prefill_inflight_queue_reqs`: a prefill server's requests whose prompt is computed and whose KV is being
 * sent; they wait for nothing of this rank's compute.
 */
const QUEUES = {
  "sglang:num_queue_reqs": "queue",
  "sglang:num_grammar_queue_reqs": "grammar",
  "sglang:num_prefill_prealloc_queue_reqs": "prefillPrealloc",
  "sglang:num_decode_prealloc_queue_reqs": "decodePrealloc",
  "sglang:num_decode_transfer_queue_reqs": "decodeTransfer",
} as const;
type Queue = (typeof QUEUES)[keyof typeof QUEUES];

const GAUGES: Readonly<Record<string, Gauge>> = {
  "sglang:num_running_reqs": "running",
  "sglang:token_usage": "usage",
  "sglang:max_total_num_tokens": "tokens",
  ...QUEUES,
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
   * Adds the kept ranks into `out`: requests summed (those waiting in any of QUEUES per labelled DP rank too, as
   * vLLM's per-engine waiting), the highest token usage, and each rank's KV pool in tokens, as SGLang reports it (counted in
   * blocks when read, at the index's block size then: it may change, see WorkerMetricsScraper.gpuBlocks).
   */
  addTo(out: SglangSignals): void {
    for (const [dp, { values: v }] of this.ranks) {
      out.running += v.running ?? 0;
      const queued = Object.values(QUEUES).filter((q) => v[q] !== undefined);
      if (queued.length > 0) {
        const waiting = queued.reduce((sum, q) => sum + v[q]!, 0);
        out.waiting += waiting;
        if (dp !== undefined) out.waitingByEngine.set(dp, (out.waitingByEngine.get(dp) ?? 0) + waiting);
      }
      if (v.usage !== undefined) out.kvUsage = Math.max(out.kvUsage, v.usage);
      if (v.tokens !== undefined && v.tokens > 0) out.poolTokens.set(dp ?? 0, v.tokens);
    }
  }
}
