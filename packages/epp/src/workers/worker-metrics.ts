// Load scraped from each worker's vLLM or SGLang Prometheus endpoint: an extra signal next to the load the EPP
// tracks itself (which misses requests that did not come through this replica).

import type { LoraAdapters } from "@kv-epp/routing";
import { LORA_INFO, NewestLoraInfo } from "./lora-metrics.ts";
import { SglangGauges } from "./sglang-metrics.ts";

/**
 * `gpuBlocks`: num_gpu_blocks per engine (= DP rank), from `vllm:cache_config_info`; `poolTokens`: SGLang's
 * max_total_num_tokens per DP rank, its pool in tokens (each empty when not exported). Both absent where the
 * metrics do not come from a scrape (a simulation).
 */
export type WorkerMetrics = {
  running: number;
  /** Waiting requests of every engine behind this API server, summed. */
  waiting: number;
  /** Waiting requests per engine (= DP rank), from the series' `engine` (SGLang: `dp_rank`) label (empty when none carries one). */
  waitingByEngine: Map<number, number>;
  kvUsage: number;
  gpuBlocks?: Map<number, number>;
  poolTokens?: Map<number, number>;
  /** The adapters the API server's engine runs and queues (vllm:lora_requests_info); absent when not exported. */
  lora?: LoraAdapters;
  at: number;
};

const LABEL = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g;

/**
 * vLLM's cache config info gauge carries the KV cache configuration as labels (every CacheConfig field as a
 * string, plus `engine`), value 1. `num_gpu_blocks` is "None" until the engine has profiled its memory.
 */
function cacheConfigInfo(line: string, into: Map<number, number>): void {
  const blocks = Number(labelOf(line, "num_gpu_blocks") ?? NaN);
  if (Number.isInteger(blocks) && blocks > 0) into.set(engineOf(line) ?? 0, blocks);
}

/** A label's value in a series line (unescaped as written), undefined when absent. */
function labelOf(line: string, label: string): string | undefined {
  const open = line.indexOf("{");
  const close = line.lastIndexOf("}");
  if (open < 0 || close < open) return undefined;
  for (const m of line.slice(open + 1, close).matchAll(LABEL)) if (m[1] === label) return m[2];
  return undefined;
}

/** A label holding an index (vLLM's `engine`, SGLang's `dp_rank`, `tp_rank`, `pp_rank`), when it is one. */
function indexLabel(line: string, label: string): number | undefined {
  const e = labelOf(line, label);
  return e !== undefined && /^\d+$/.test(e) ? Number(e) : undefined;
}

/** The series' `engine` label (vLLM labels each engine's series with its index, its DP rank), when a number. */
const engineOf = (line: string): number | undefined => indexLabel(line, "engine");

type Pools = { gpuBlocks: Map<number, number>; poolTokens: Map<number, number> };

/**
 * Reads the gauges vLLM exposes (`vllm:num_requests_running`, `..._waiting`, KV usage), summing label sets,
 * the waiting requests per engine too, each engine's `num_gpu_blocks` from `vllm:cache_config_info` and the
 * adapters it runs and queues from `vllm:lora_requests_info` (lora-metrics.ts); and SGLang's (see
 * SglangGauges), its KV pool in tokens.
 */
export function parseVllmMetrics(text: string, at = Date.now()): WorkerMetrics & Pools {
  const gpuBlocks = new Map<number, number>();
  const waitingByEngine = new Map<number, number>();
  const out = { running: 0, waiting: 0, waitingByEngine, kvUsage: 0, gpuBlocks, poolTokens: new Map<number, number>(), at };
  const sglang = new SglangGauges();
  const lora = new NewestLoraInfo();
  for (const line of text.split("\n")) {
    if (line.length === 0 || line.charCodeAt(0) === 35 /* # */) continue;
    const name = line.slice(0, line.search(/[{\s]/));
    if (name === "vllm:cache_config_info") {
      cacheConfigInfo(line, gpuBlocks);
      continue;
    }
    const v = Number(line.slice(line.lastIndexOf(" ") + 1));
    if (!Number.isFinite(v)) continue;
    if (name === LORA_INFO) {
      lora.add(line, v);
      continue;
    }
    if (sglang.add(name, v, (label) => indexLabel(line, label))) continue;
    switch (name) {
      case "vllm:num_requests_running":
        out.running += v;
        break;
      case "vllm:num_requests_waiting": {
        out.waiting += v;
        const engine = engineOf(line);
        if (engine !== undefined) waitingByEngine.set(engine, (waitingByEngine.get(engine) ?? 0) + v);
        break;
      }
      case "vllm:gpu_cache_usage_perc":
      case "vllm:kv_cache_usage_perc":
        out.kvUsage = Math.max(out.kvUsage, v);
        break;
    }
  }
  sglang.addTo(out);
  const adapters = lora.adapters(labelOf);
  return adapters ? { ...out, lora: adapters } : out;
}

/** One API server's /metrics: `endpoint` is the address the gateway is told for its ranks. */
export type ScrapeTarget = { workerId: string; endpoint: string; url: string };

/**
 * A worker's scrape targets: one per API server, as GAIE scrapes every target port of a pod as an
 * endpoint of its own (its datastore gives each port's endpoint the metrics host podIP:port). A worker
 * with one API server is scraped at its metrics URL (which may name another port).
 */
export function scrapeTargets(spec: { id: string; address: string; servers?: readonly { address: string }[]; metricsUrl: string }): ScrapeTarget[] {
  if (!spec.servers || spec.servers.length <= 1) return [{ workerId: spec.id, endpoint: spec.address, url: spec.metricsUrl }];
  return spec.servers.map((s) => ({ workerId: spec.id, endpoint: s.address, url: `http://${s.address}/metrics` }));
}

/** The rank's series, or the only one when a worker exports one (one engine per pod, whatever its DP rank). */
function rankSeries(byRank: Map<number, number>, dpRank: number): number | undefined {
  return byRank.get(dpRank) ?? (byRank.size === 1 ? byRank.values().next().value : undefined);
}

export class WorkerMetricsScraper {
  /** By endpoint: each API server's own queue. */
  private readonly latest = new Map<string, WorkerMetrics>();
  /**
   * Each worker's pools by engine (from all its API servers), kept across failed scrapes: vLLM's in blocks,
   * fixed for its life; SGLang's in tokens, fixed too, but counted in blocks only when read (gpuBlocks), as
   * the index's block size may change under it (events or a recovered dump adopting the workers' size).
   */
  private readonly poolsByWorker = new Map<string, Pools>();
  private targets: ScrapeTarget[] = [];
  private timer: ReturnType<typeof setInterval> | undefined;
  private running = false;

  constructor(
    private readonly opts: {
      intervalMs: number;
      timeoutMs?: number;
      /** The KV block size in tokens, to count an SGLang worker's token pool in blocks (asked at each read: the workers' events may set it). */
      blockSize?: () => number;
      onError: (workerId: string, err: unknown) => void;
      onSuccess?: (workerId: string) => void;
      /** After every round of scrapes, failed or not. */
      onRound?: () => void;
    },
  ) {}

  setTargets(targets: ScrapeTarget[]): void {
    this.targets = targets;
    const endpoints = new Set(targets.map((t) => t.endpoint));
    const ids = new Set(targets.map((t) => t.workerId));
    for (const e of this.latest.keys()) if (!endpoints.has(e)) this.latest.delete(e);
    for (const id of this.poolsByWorker.keys()) if (!ids.has(id)) this.poolsByWorker.delete(id);
  }

  /** The last good scrape of the API server at `endpoint` (a candidate's endpoint). */
  get(endpoint: string): WorkerMetrics | undefined {
    return this.latest.get(endpoint);
  }

  /**
   * The KV blocks a worker rank can hold (its series, rankSeries): as its vLLM reported them, or its SGLang's
   * token pool in blocks of the block size now. Undefined until scraped (SGLang: or without a block size).
   */
  gpuBlocks(workerId: string, dpRank: number): number | undefined {
    const pools = this.poolsByWorker.get(workerId);
    if (pools === undefined) return undefined;
    const blocks = rankSeries(pools.gpuBlocks, dpRank);
    if (blocks !== undefined) return blocks;
    const tokens = rankSeries(pools.poolTokens, dpRank);
    const blockSize = this.opts.blockSize?.() ?? 0;
    return tokens !== undefined && blockSize > 0 && tokens >= blockSize ? Math.floor(tokens / blockSize) : undefined;
  }

  start(): void {
    if (this.opts.intervalMs <= 0 || this.timer) return;
    this.timer = setInterval(() => void this.scrapeOnce(), this.opts.intervalMs);
    this.timer.unref?.();
    void this.scrapeOnce();
  }

  async scrapeOnce(): Promise<void> {
    if (this.running) return; // a slow worker must not pile up overlapping rounds
    this.running = true;
    try {
      await Promise.all(
        this.targets.map(async (t) => {
          try {
            const res = await fetch(t.url, { signal: AbortSignal.timeout(this.opts.timeoutMs ?? 2000) });
            if (!res.ok) throw new Error(`HTTP ${res.status}`);
            const m = parseVllmMetrics(await res.text(), Date.now());
            this.latest.set(t.endpoint, m);
            if (m.gpuBlocks.size > 0 || m.poolTokens.size > 0) {
              const pools = this.poolsByWorker.get(t.workerId) ?? { gpuBlocks: new Map(), poolTokens: new Map() };
              for (const [engine, blocks] of m.gpuBlocks) pools.gpuBlocks.set(engine, blocks);
              for (const [rank, tokens] of m.poolTokens) pools.poolTokens.set(rank, tokens);
              this.poolsByWorker.set(t.workerId, pools);
            }
            this.opts.onSuccess?.(t.workerId);
          } catch (err) {
            this.latest.delete(t.endpoint);
            this.opts.onError(t.workerId, err);
          }
        }),
      );
    } finally {
      this.running = false;
    }
    this.opts.onRound?.();
  }

  stop(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = undefined;
  }
}
