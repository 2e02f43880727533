import { Counter, Gauge, Histogram, Registry } from "prom-client";
import type { RankEngine, StepAdapters } from "./engine/rank-engine.ts";
import type { MockNixlConnector } from "./kv-transfer/connector.ts";
import type { MockSglangConnector } from "./kv-transfer/sglang-connector.ts";
import type { MockMooncakeConnector } from "./kv-transfer/mooncake-connector.ts";
import { sglangSeries, type EngineSeries, type SglangMetricsOptions } from "./sglang-metrics.ts";

/**
 * The engine's metrics as the engine the worker stands for names and labels them, so scrapers written for
 * it read the mock unchanged: vLLM v1's (`model_name`, and `engine` = the DP rank), or SGLang's
 * (`sglang-metrics.ts`); plus the mock's own `mock_worker_*` series. One registry per worker: several
 * workers can run in one process (the trace benchmark).
 */
export type WorkerMetrics = {
  registry: Registry;
  firstToken(rank: number, seconds: number): void;
  finished(rank: number, outputTokens: number): void;
  eventsPublished(rank: number, events: number): void;
  publishFailed(rank: number): void;
  /** Records an engine step's LoRA adapters (RankObserver.onStep); absent without the LoRA series. */
  loraStep?: (adapters: StepAdapters) => void;
};

const TTFT_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80];

export type MetricsOptions = {
  model: string;
  engines: () => readonly RankEngine[];
  connector?: MockNixlConnector;
  /** With --disaggregation-mode prefill|decode: SGLang's disaggregation stand-in. */
  sglangConnector?: MockSglangConnector;
  /** With --kv-connector mooncake: vLLM's MooncakeConnector stand-in. */
  mooncake?: MockMooncakeConnector;
  /** SGLang's series in place of vLLM's (a worker with an SGLang --event-encoding). */
  sglang?: SglangMetricsOptions;
  /** With LoRA adapters served: the most a batch may hold, vLLM's max_lora (absent: no LoRA, no series). */
  maxLora?: number;
};

/** Series per rank labelled as vLLM's (`model_name`, `engine`), read from the engines at scrape time (level, not event counting). */
function perRank(registry: Registry, model: string, engines: () => readonly RankEngine[]) {
  const labelNames = ["model_name", "engine"] as const;
  const labels = (rank: number) => ({ model_name: model, engine: String(rank) });
  const gauge = (name: string, help: string, read: (e: RankEngine) => number) =>
    new Gauge({
      name, help, labelNames, registers: [registry],
      collect() {
        for (const e of engines()) this.set(labels(e.rank), read(e));
      },
    });
  const counter = (name: string, help: string, read: (e: RankEngine) => number) =>
    new Counter({
      name, help, labelNames, registers: [registry],
      collect() {
        this.reset();
        for (const e of engines()) this.inc(labels(e.rank), read(e));
      },
    });
  return { labelNames, labels, gauge, counter };
}

export function createMetrics(o: MetricsOptions): WorkerMetrics {
  const { model, engines, connector } = o;
  const registry = new Registry();
  const { labelNames, labels, gauge, counter } = perRank(registry, model, engines);
  const series = o.sglang ? sglangSeries(registry, model, engines, o.sglang) : vllmSeries(registry, model, engines, o.maxLora);
  const workerCounter = (name: string, help: string, read: () => number) =>
    new Counter({
      name, help, labelNames: ["model_name"], registers: [registry],
      collect() {
        this.reset();
        this.inc({ model_name: model }, read());
      },
    });
  if (connector || o.sglangConnector || o.mooncake) counter("mock_worker_kv_transfer_pulled_blocks_total", "KV blocks read from prefill workers (decode side).", (e) => e.pulledBlocks);
  const sglang = o.sglangConnector;
  if (sglang) {
    new Gauge({
      name: "mock_worker_sglang_held_rooms", help: "Computed bootstrap rooms whose blocks wait for their decode server (prefill mode).", labelNames: ["model_name"], registers: [registry],
      collect() {
        this.set({ model_name: model }, sglang.heldRooms);
      },
    });
    workerCounter("mock_worker_sglang_transfers_total", "Bootstrap rooms handed to (prefill mode) or taken from (decode mode) a peer.", () => sglang.transferred);
    workerCounter("mock_worker_sglang_transfer_failures_total", "Bootstrap rooms that failed: not taken in time, never received, or no prefill server (500s).", () => sglang.failed);
  }
  // vLLM's connectors (NIXL or Mooncake) share what they both do.
  const vllmConnector = connector ?? o.mooncake;
  if (vllmConnector) {
    gauge("mock_worker_kv_transfer_held_requests", "Finished prefills whose blocks wait for their decode worker (prefill side).", (e) => e.heldRequests);
    workerCounter("mock_worker_kv_transfer_invalid_params_total", "Requests whose kv_transfer_params the connector warns about and ignores: run without a transfer.", () => vllmConnector.invalidParams);
    workerCounter("mock_worker_kv_transfer_expired_total", "Held prefills freed at the abort timeout, never read.", () => vllmConnector.expired);
  }
  if (connector) workerCounter("mock_worker_kv_transfer_notify_errors_total", "Notifications to a prefill worker that failed.", () => connector.notifyFailures);
  const mooncake = o.mooncake;
  if (mooncake) {
    workerCounter("mock_worker_mooncake_bootstrap_queries_total", "GET /query answered by this worker's Mooncake bootstrap server.", () => mooncake.queries);
    workerCounter("mock_worker_mooncake_transfers_total", "Transfers handed to (prefill side) or taken from (decode side) a peer.", () => mooncake.transferred);
    workerCounter("mock_worker_mooncake_load_failures_total", "KV loads that failed (decode side): the request failed with a 500.", () => mooncake.failed);
  }
  const published = new Counter({
    name: "mock_worker_kv_events_published_total", help: "KV events published.", labelNames, registers: [registry],
  });
  const failed = new Counter({
    name: "mock_worker_kv_publish_errors_total", help: "KV-event batches that failed to publish.", labelNames, registers: [registry],
  });
  return {
    registry,
    ...series,
    eventsPublished: (rank, n) => published.inc(labels(rank), n),
    publishFailed: (rank) => failed.inc(labels(rank)),
  };
}

/**
 * vLLM's vllm:lora_requests_info as its engine writes it with --enable-lora: no model or engine label, the state
 * in the labels (max_lora, the running and the waiting requests' adapters joined by ","), the time it was
 * recorded as the value. vLLM records after each engine step, never at a scrape, and never drops a label set:
 * before its first step there is no sample, an idle engine keeps the state of its last step, and every state
 * it passed through stays exported with its last time. Several ranks on one server share the gauge, as vLLM's
 * DP engines do: the newest series is whichever engine stepped last.
 */
function loraInfo(registry: Registry, maxLora: number): (adapters: StepAdapters) => void {
  const gauge = new Gauge({
    name: "vllm:lora_requests_info", help: "Running stats on lora requests.", registers: [registry],
    labelNames: ["max_lora", "running_lora_adapters", "waiting_lora_adapters"],
  });
  return (a) => gauge.set({ max_lora: String(maxLora), running_lora_adapters: a.running.join(","), waiting_lora_adapters: a.waiting.join(",") }, Date.now() / 1000);
}

/** vLLM v1's series. */
function vllmSeries(registry: Registry, model: string, engines: () => readonly RankEngine[], maxLora: number | undefined): EngineSeries & Pick<WorkerMetrics, "loraStep"> {
  const { labelNames, labels, gauge, counter } = perRank(registry, model, engines);
  gauge("vllm:num_requests_running", "Requests in the running batch.", (e) => e.running);
  gauge("vllm:num_requests_waiting", "Requests waiting to be admitted.", (e) => e.waiting);
  gauge("vllm:gpu_cache_usage_perc", "KV-cache usage, 1 = full (legacy name).", (e) => e.cache.usage);
  gauge("vllm:kv_cache_usage_perc", "KV-cache usage, 1 = full.", (e) => e.cache.usage);
  // vLLM's info metric, shaped as vLLM writes it: CacheConfig fields as string labels (the ones that mean
  // something here, in vLLM's field order, Python's str() of each value), then `engine`, value 1. GAIE reads
  // block_size from it, the EPP num_gpu_blocks (the most blocks a rank can hold).
  new Gauge({
    name: "vllm:cache_config_info", help: "Information of the LLMEngine CacheConfig", registers: [registry],
    labelNames: ["block_size", "cache_dtype", "enable_prefix_caching", "num_gpu_blocks", "num_cpu_blocks", "engine"],
    collect() {
      for (const e of engines()) {
        this.set({
          block_size: String(e.cache.blockSize), cache_dtype: "auto", enable_prefix_caching: "True",
          num_gpu_blocks: String(e.cache.capacityBlocks), num_cpu_blocks: "None", engine: String(e.rank),
        }, 1);
      }
    },
  });
  counter("vllm:prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.", (e) => e.cache.queriedTokens);
  counter("vllm:prefix_cache_hits_total", "Prompt tokens found in the prefix cache.", (e) => e.cache.hitTokens);
  counter("vllm:num_preemptions_total", "Requests preempted for want of KV cache blocks.", (e) => e.preemptions);
  // vLLM's breakdown of prompt tokens by where their KV came from: a decode worker that pulled a
  // prefill's blocks counts them as external_kv_transfer and computes only the last token.
  new Counter({
    name: "vllm:prompt_tokens_by_source_total", help: "Number of prompt tokens by source.",
    labelNames: ["model_name", "engine", "source"], registers: [registry],
    collect() {
      this.reset();
      for (const e of engines())
        for (const [source, n] of Object.entries(e.promptTokens)) this.inc({ ...labels(e.rank), source }, n);
    },
  });

  const ttft = new Histogram({
    name: "vllm:time_to_first_token_seconds", help: "Time from arrival to the first token.",
    labelNames, buckets: TTFT_BUCKETS, registers: [registry],
  });
  const success = new Counter({ name: "vllm:request_success_total", help: "Finished requests.", labelNames, registers: [registry] });
  const generated = new Counter({ name: "vllm:generation_tokens_total", help: "Output tokens.", labelNames, registers: [registry] });
  return {
    ...(maxLora !== undefined ? { loraStep: loraInfo(registry, maxLora) } : {}),
    firstToken: (rank, s) => ttft.observe(labels(rank), s),
    finished: (rank, n) => {
      success.inc(labels(rank));
      generated.inc(labels(rank), n);
    },
  };
}
