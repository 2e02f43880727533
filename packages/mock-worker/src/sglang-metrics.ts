import { Counter, Gauge, Histogram, type Registry } from "prom-client";
import type { RankEngine } from "./engine/rank-engine.ts";

/**
 * SGLang's series, named and labelled as its python/sglang/srt/metrics/collector.py writes them, for a
 * worker whose --event-encoding is an SGLang one: scrapers written for SGLang read the mock unchanged.
 *
 * Scheduler gauges: one series per DP rank (each rank's scheduler exports its own numbers), labelled
 * model_name, engine_type, tp_rank, pp_rank, moe_ep_rank, and dp_rank only when the server runs several
 * DP ranks (a server of one has no data-parallel controller and passes no dp_rank). The mock is a TP 1 /
 * PP 1 engine without DP attention, so tp_rank, pp_rank and moe_ep_rank are 0. SGLang refreshes them at
 * its log intervals (each prefill batch, every decode_log_interval decode steps); the mock reads them at
 * scrape time.
 *
 * Tokenizer-manager series (one per server, labelled model_name): tokens and requests counted, and the
 * time to first token.
 */
export type SglangMetricsOptions = {
  /** SGLang's engine_type: its --disaggregation-mode (prefill, decode), else unified. */
  engineType: "unified" | "prefill" | "decode";
  /** dp_rank labels the scheduler series: the server runs several DP ranks. */
  dpRankLabel: boolean;
};

export type EngineSeries = { firstToken(rank: number, seconds: number): void; finished(rank: number, outputTokens: number): void };

// TokenizerMetricsCollector's default bucket_time_to_first_token.
const TTFT_BUCKETS = [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400];

export function sglangSeries(registry: Registry, model: string, engines: () => readonly RankEngine[], o: SglangMetricsOptions): EngineSeries {
  const labelNames = ["model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank", ...(o.dpRankLabel ? ["dp_rank"] : [])];
  // Key order is the exposition's label order: SGLang's labels dict order.
  const labels = (rank: number): Record<string, string> => ({
    model_name: model, engine_type: o.engineType, tp_rank: "0", pp_rank: "0", moe_ep_rank: "0", ...(o.dpRankLabel ? { dp_rank: String(rank) } : {}),
  });
  const gauge = (name: string, help: string, read: (e: RankEngine) => number) =>
    new Gauge({
      name, help, labelNames, registers: [registry],
      collect() {
        for (const e of engines()) this.set(labels(e.rank), read(e));
      },
    });
  // SGLang's pool is counted in tokens; the mock's in blocks of --block-size tokens (SGLang's page size).
  const usedTokens = (e: RankEngine) => Math.round(e.cache.usage * e.cache.capacityBlocks) * e.cache.blockSize;
  gauge("sglang:num_running_reqs", "The number of running requests.", (e) => e.running);
  gauge("sglang:num_used_tokens", "The number of used tokens.", usedTokens);
  // num_used / max_total_num_tokens, where cached tokens no request holds count as free (evictable).
  gauge("sglang:token_usage", "The token usage.", (e) => e.cache.usage);
  gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", (e) => e.waiting);
  gauge("sglang:max_total_num_tokens", "Maximum total number of tokens in the KV cache pool.", (e) => e.cache.capacityBlocks * e.cache.blockSize);

  const serverLabels = { model_name: model };
  const promptCounter = (name: string, help: string, read: (e: RankEngine) => number) =>
    new Counter({
      name, help, labelNames: ["model_name"], registers: [registry],
      collect() {
        this.reset();
        this.inc(serverLabels, engines().reduce((n, e) => n + read(e), 0));
      },
    });
  promptCounter("sglang:prompt_tokens_total", "Number of prefill tokens processed.", (e) => e.promptTokens.local_compute + e.promptTokens.local_cache_hit + e.promptTokens.external_kv_transfer);
  promptCounter("sglang:cached_tokens_total", "Number of cached prompt tokens.", (e) => e.promptTokens.local_cache_hit);
  const generated = new Counter({ name: "sglang:generation_tokens_total", help: "Number of generation tokens processed.", labelNames: ["model_name"], registers: [registry] });
  const requests = new Counter({ name: "sglang:num_requests_total", help: "Number of requests processed.", labelNames: ["model_name"], registers: [registry] });
  const ttft = new Histogram({
    name: "sglang:time_to_first_token_seconds", help: "Histogram of time to first token in seconds.",
    labelNames: ["model_name"], buckets: TTFT_BUCKETS, registers: [registry],
  });
  return {
    firstToken: (_rank, s) => ttft.observe(serverLabels, s),
    finished: (_rank, n) => {
      requests.inc(serverLabels);
      generated.inc(serverLabels, n);
    },
  };
}
