import { expect, test } from "bun:test";
import { LOOPBACK } from "@kv-epp/testkit";
import { parseVllmMetrics, WorkerMetricsScraper } from "./worker-metrics.ts";

// The line as vLLM's PrometheusStatLogger writes it: every CacheConfig field as a string label (in field
// order), `engine` last, value 1.0 (prometheus_client's float format).
const vllmLine = (engine: number, blocks: string) =>
  `vllm:cache_config_info{block_size="16",gpu_memory_utilization="0.9",swap_space="4.0",cache_dtype="auto",is_attention_free="False",num_gpu_blocks_override="None",sliding_window="None",enable_prefix_caching="True",prefix_caching_hash_algo="sha256",cpu_offload_gb="0.0",calculate_kv_scales="False",num_gpu_blocks="${blocks}",num_cpu_blocks="None",engine="${engine}"} 1.0`;

test("num_gpu_blocks per engine from vllm:cache_config_info, beside the load gauges", () => {
  const m = parseVllmMetrics(
    [
      "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
      "# TYPE vllm:cache_config_info gauge",
      vllmLine(0, "27298"),
      vllmLine(1, "27301"),
      'vllm:num_requests_running{model_name="m",engine="0"} 3.0',
    ].join("\n"),
  );
  expect([...m.gpuBlocks]).toEqual([[0, 27298], [1, 27301]]);
  expect(m.running).toBe(3);
});

test("an engine that has not profiled yet (num_gpu_blocks None) or a malformed value tells nothing", () => {
  expect(parseVllmMetrics(vllmLine(0, "None")).gpuBlocks.size).toBe(0);
  expect(parseVllmMetrics(vllmLine(0, "-3")).gpuBlocks.size).toBe(0);
  expect(parseVllmMetrics('vllm:cache_config_info{num_gpu_blocks="12",escaped="a\\"b}c"} 1').gpuBlocks).toEqual(new Map([[0, 12]]));
});

test("vLLM metrics: running, waiting and KV usage, summed over label sets", () => {
  const m = parseVllmMetrics(
    [
      "# HELP vllm:num_requests_running x",
      'vllm:num_requests_running{model_name="m",engine="0"} 3',
      'vllm:num_requests_running{model_name="m",engine="1"} 2',
      'vllm:num_requests_waiting{model_name="m"} 7',
      'vllm:kv_cache_usage_perc{model_name="m"} 0.25',
      "other_metric 99",
    ].join("\n"),
  );
  expect(m).toMatchObject({ running: 5, waiting: 7, kvUsage: 0.25 });
});

test("waiting requests per engine (DP rank), from the series' engine label, beside their sum", () => {
  const m = parseVllmMetrics(
    [
      'vllm:num_requests_waiting{model_name="m",engine="0"} 1.0',
      'vllm:num_requests_waiting{model_name="m",engine="1"} 4.0',
      'vllm:num_requests_waiting{model_name="m",engine="3"} 0.0',
    ].join("\n"),
  );
  expect(m.waiting).toBe(5);
  expect([...m.waitingByEngine]).toEqual([[0, 1], [1, 4], [3, 0]]);
  // A series without the label counts in the sum only.
  expect(parseVllmMetrics('vllm:num_requests_waiting{model_name="m"} 2').waitingByEngine.size).toBe(0);
});

test("an SGLang pool is counted in blocks of the block size when read, not of the size its last scrape saw", async () => {
  // SGLang --page-size 8 under --block-size 16: a recovered dump switches the index to 8 between two scrapes,
  // and the capacity check that follows must already count 8-token blocks.
  const host = `${LOOPBACK}.4.141`;
  const server = Bun.serve({ hostname: host, port: 0, fetch: () => new Response('sglang:max_total_num_tokens{engine_type="unified",model_name="m",pp_rank="0",tp_rank="0"} 3200.0\n') });
  try {
    let blockSize = 16;
    const scraper = new WorkerMetricsScraper({ intervalMs: 0, blockSize: () => blockSize, onError: (_, err) => { throw err; } });
    scraper.setTargets([{ workerId: "w", endpoint: `${host}:${server.port}`, url: `http://${host}:${server.port}/metrics` }]);
    await scraper.scrapeOnce();
    expect(scraper.gpuBlocks("w", 0)).toBe(200);
    blockSize = 8;
    expect(scraper.gpuBlocks("w", 0)).toBe(400);
    // A pool smaller than one block is no capacity to hold a rank to.
    blockSize = 4096;
    expect(scraper.gpuBlocks("w", 0)).toBeUndefined();
  } finally {
    server.stop(true);
  }
});
