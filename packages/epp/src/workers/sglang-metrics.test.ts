import { expect, test } from "bun:test";
import { parseVllmMetrics } from "./worker-metrics.ts";

// SGLang's /metrics as its tokenizer manager serves it (prometheus_client multiprocess: labels sorted, no pid
// for "mostrecent" gauges, floats as 3.0), for dp_size 2 with DP attention over tp_size 4 and
// --enable-metrics-for-all-schedulers: DP rank 0 is tp_rank 0-1, DP rank 1 tp_rank 2-3, each TP rank a copy.
const series = (name: string, help: string, values: [dp: number, tp: number, v: string][]) => [
  `# HELP ${name} ${help}`,
  `# TYPE ${name} gauge`,
  ...values.map(([dp, tp, v]) => `${name}{dp_rank="${dp}",engine_type="unified",model_name="qwen",pp_rank="0",tp_rank="${tp}"} ${v}`),
];
const copies = (dp0: string, dp1: string): [number, number, string][] => [[0, 0, dp0], [0, 1, dp0], [1, 2, dp1], [1, 3, dp1]];

const SGLANG_DP2 = [
  ...series("sglang:num_running_reqs", "The number of running requests.", copies("12.0", "5.0")),
  ...series("sglang:num_used_tokens", "The number of used tokens.", copies("40960.0", "8192.0")),
  ...series("sglang:token_usage", "The token usage.", copies("0.52", "0.1")),
  ...series("sglang:num_queue_reqs", "The number of requests in the waiting queue.", copies("7.0", "0.0")),
  ...series("sglang:max_total_num_tokens", "Maximum total number of tokens in the KV cache pool.", copies("78848.0", "78720.0")),
  ...series("sglang:cache_hit_rate", "The prefix cache hit rate.", copies("0.4", "0.2")),
  "# HELP sglang:prompt_tokens_total Number of prefill tokens processed.",
  "# TYPE sglang:prompt_tokens_total counter",
  'sglang:prompt_tokens_total{model_name="qwen"} 912345.0',
  "",
].join("\n");

test("SGLang: running, queue per DP rank, token usage and the pool in tokens, each rank's TP copies counted once", () => {
  const m = parseVllmMetrics(SGLANG_DP2, 0);
  expect(m).toMatchObject({ running: 17, waiting: 7, kvUsage: 0.52 });
  expect([...m.waitingByEngine]).toEqual([[0, 7], [1, 0]]);
  expect([...m.poolTokens]).toEqual([[0, 78848], [1, 78720]]);
  // Not vLLM's num_gpu_blocks: a pool in tokens is counted in blocks only when read, at the block size then.
  expect(m.gpuBlocks.size).toBe(0);
});

test("SGLang with one DP rank leaves dp_rank off: the server's totals, rank 0's capacity", () => {
  const line = (name: string, tp: number, v: string) => `${name}{engine_type="unified",model_name="qwen",pp_rank="0",tp_rank="${tp}"} ${v}`;
  const m = parseVllmMetrics(
    ["sglang:num_running_reqs", "sglang:num_queue_reqs"].flatMap((n) => [line(n, 1, "9.0"), line(n, 0, "3.0")]).concat(line("sglang:max_total_num_tokens", 0, "1000.0")).join("\n"),
    0,
  );
  expect(m).toMatchObject({ running: 3, waiting: 3 });
  expect(m.waitingByEngine.size).toBe(0);
  expect([...m.poolTokens]).toEqual([[0, 1000]]);
});

// A P/D pair's scrapes as SGLang writes them (one DP rank each, so no dp_rank), with every queue gauge its collector
// exports: each server writes all of them, the other side's at 0.
const disaggregated = (mode: "prefill" | "decode", values: Record<string, string>) =>
  Object.entries({ num_running_reqs: "2.0", num_queue_reqs: "1.0", num_grammar_queue_reqs: "0.0", num_prefill_prealloc_queue_reqs: "0.0", num_prefill_inflight_queue_reqs: "0.0", num_decode_prealloc_queue_reqs: "0.0", num_decode_transfer_queue_reqs: "0.0", ...values })
    .flatMap(([name, v]) => [`# HELP sglang:${name} The number of requests.`, `# TYPE sglang:${name} gauge`, `sglang:${name}{engine_type="${mode}",model_name="qwen",pp_rank="0",tp_rank="0"} ${v}`])
    .join("\n");

test("SGLang: requests waiting in its grammar, bootstrap, preallocation and transfer queues count as waiting; a prefill server's KV sends do not", () => {
  const prefill = parseVllmMetrics(disaggregated("prefill", { num_grammar_queue_reqs: "3.0", num_prefill_prealloc_queue_reqs: "4.0", num_prefill_inflight_queue_reqs: "9.0" }), 0);
  expect(prefill).toMatchObject({ running: 2, waiting: 1 + 3 + 4 });
  const decode = parseVllmMetrics(disaggregated("decode", { num_decode_prealloc_queue_reqs: "5.0", num_decode_transfer_queue_reqs: "6.0" }), 0);
  expect(decode).toMatchObject({ running: 2, waiting: 1 + 5 + 6 });
});

test("SGLang: every queue of a DP rank adds to that rank's waiting", () => {
  const m = parseVllmMetrics(
    [
      ...series("sglang:num_queue_reqs", "The number of requests in the waiting queue.", copies("7.0", "0.0")),
      ...series("sglang:num_decode_transfer_queue_reqs", "The number of requests in the decode transfer queue.", copies("2.0", "3.0")),
    ].join("\n"),
    0,
  );
  expect(m.waiting).toBe(12);
  expect([...m.waitingByEngine]).toEqual([[0, 9], [1, 3]]);
});
