// llm-d's EPP metrics (llm-d-router at ebab687: docs/metrics.md, pkg/epp/metrics/llm_d_router_metrics.go, and
// pkg/epp/metrics/metrics.go for the deprecated twins), scraped from a real EPP's /metrics after requests through
// ext_proc: their names, types, label names and values, and bucket bounds as llm-d fixes them.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { waitFor } from "@kv-epp/testkit";
import type { ProcessingRequest } from "../src/extproc/messages.ts";
import type { EppHandle } from "../src/main.ts";
import { HOST, MODEL, body, extProcClient, headers, scrapeMetric, setHeader, startTestEpp, tokens, type ExtProcStream, type Resp } from "./helpers.ts";

const enc = new TextEncoder();
/** Two vLLM stand-ins' /metrics (the routed upstream is never dialled: the test plays the response). */
const VLLM = [
  { kv: 0.5, waiting: 3, running: 2 },
  { kv: 0.25, waiting: 0, running: 1 },
];
const servers = VLLM.map((m) =>
  Bun.serve({
    hostname: HOST,
    port: 0,
    fetch: () =>
      new Response(
        `vllm:num_requests_running{model_name="m"} ${m.running}\nvllm:num_requests_waiting{model_name="m"} ${m.waiting}\nvllm:kv_cache_usage_perc{model_name="m"} ${m.kv}\n`,
      ),
  }),
);
let epp: EppHandle;
let client: ReturnType<typeof extProcClient>;
let page = "";
const scrape = async () => (page = await (await fetch(`http://${HOST}:${epp.ports.metrics}/metrics`)).text());
const metric = async (series: string) => (await scrapeMetric(`http://${HOST}:${epp.ports.metrics}`, series)) ?? 0;

beforeAll(async () => {
  epp = await startTestEpp(
    servers.map((s, i) => ({ id: `w${i}`, address: `${HOST}:${s.port}`, kvEvents: `tcp://${HOST}:1` })),
    { flags: ["--scrape-interval-ms", "100", "--objective-priorities", "chat=5", "--lora-adapters", "my-adapter", "--subscribe-wait-ms", "0"] },
  );
  client = extProcClient(epp.ports.grpc);
});
afterAll(async () => {
  client?.close();
  await epp?.stop({ graceMs: 200 });
  for (const s of servers) s.stop(true);
});

const header = (key: string, value: string) => ({ key, raw_value: enc.encode(value) });
function requestHeaders(extra: [string, string][], path?: string): ProcessingRequest {
  const h = headers(path);
  h.request_headers!.headers!.headers!.push(...extra.map(([k, v]) => header(k, v)));
  return h;
}
async function answerFor(s: ExtProcStream, phase: string): Promise<Resp> {
  for (;;) {
    const r = await s.next();
    if (r.response === phase || r.immediate_response) return r;
  }
}
/** A request through ext_proc, routed, then answered by the upstream as the test plays it. */
async function exchange(json: unknown, extra: [string, string][], response: { status: string; contentType: string; chunks: string[] }, whileRunning?: () => Promise<void>, path?: string) {
  const s = client.open();
  s.send(requestHeaders(extra, path));
  s.send(body(json));
  expect(setHeader((await s.next()).request_headers?.response, "x-gateway-destination-endpoint")).toBeDefined();
  await whileRunning?.();
  s.send({ response_headers: { headers: { headers: [header(":status", response.status), header("content-type", response.contentType)] }, end_of_stream: false } });
  await answerFor(s, "response_headers");
  response.chunks.forEach((c, i) => s.send({ response_body: { body: enc.encode(c), end_of_stream: i === response.chunks.length - 1 } }));
  for (let i = 0; i < response.chunks.length; i++) await answerFor(s, "response_body");
  s.end();
}

/** Each series' label names on the page, by metric family (a histogram's _bucket/_sum/_count under its name). */
function families(text: string): Map<string, { type: string; labels: Set<string> }> {
  const out = new Map<string, { type: string; labels: Set<string> }>();
  for (const m of text.matchAll(/^# TYPE (\S+) (\S+)$/gm)) out.set(m[1]!, { type: m[2]!, labels: new Set() });
  for (const m of text.matchAll(/^([a-z_:][a-z0-9_:]*)\{([^}]*)\} /gm)) {
    const name = out.has(m[1]!) ? m[1]! : m[1]!.replace(/_(bucket|sum|count)$/, "");
    for (const l of m[2]!.matchAll(/([a-z_]+)="/g)) if (l[1] !== "le") out.get(name)?.labels.add(l[1]!);
  }
  return out;
}

const REQ = ["model_name", "target_model_name", "fairness_id", "priority"];
/** As llm-d declares them: type and label names. */
const UPSTREAM: Record<string, [string, string[]]> = {
  llm_d_epp_request_total: ["counter", REQ],
  llm_d_epp_request_error_total: ["counter", [...REQ, "error_code"]],
  llm_d_epp_request_running: ["gauge", REQ],
  llm_d_epp_request_duration_seconds: ["histogram", REQ],
  llm_d_epp_request_ttft_seconds: ["histogram", [...REQ, "streaming"]],
  llm_d_epp_request_size_bytes: ["histogram", REQ],
  llm_d_epp_response_size_bytes: ["histogram", REQ],
  llm_d_epp_request_input_tokens: ["histogram", REQ],
  llm_d_epp_request_output_tokens: ["histogram", REQ],
  llm_d_epp_request_cached_tokens: ["histogram", REQ],
  llm_d_epp_request_ntpot_seconds: ["histogram", REQ],
  llm_d_epp_request_streaming_tpot_seconds: ["histogram", REQ],
  llm_d_epp_request_streaming_itl_seconds: ["histogram", REQ],
  llm_d_epp_ready_endpoints: ["gauge", ["name"]],
  llm_d_epp_average_kv_cache_utilization: ["gauge", ["name"]],
  llm_d_epp_average_queue_size: ["gauge", ["name"]],
  llm_d_epp_average_running_requests: ["gauge", ["name"]],
  llm_d_epp_std_dev_kv_cache_utilization: ["gauge", ["name"]],
  llm_d_epp_std_dev_queue_size: ["gauge", ["name"]],
  llm_d_epp_std_dev_running_requests: ["gauge", ["name"]],
  inference_objective_request_total: ["counter", ["model_name", "target_model_name", "priority"]],
  inference_objective_request_error_total: ["counter", ["model_name", "target_model_name", "error_code"]],
  inference_objective_running_requests: ["gauge", ["model_name"]],
  inference_objective_request_duration_seconds: ["histogram", ["model_name", "target_model_name"]],
  inference_objective_request_sizes: ["histogram", ["model_name", "target_model_name"]],
  inference_objective_response_sizes: ["histogram", ["model_name", "target_model_name"]],
  inference_objective_input_tokens: ["histogram", ["model_name", "target_model_name"]],
  inference_objective_output_tokens: ["histogram", ["model_name", "target_model_name"]],
  inference_objective_prompt_cached_tokens: ["histogram", ["model_name", "target_model_name"]],
  inference_objective_normalized_time_per_output_token_seconds: ["histogram", ["model_name", "target_model_name"]],
  inference_pool_ready_pods: ["gauge", ["name"]],
  inference_pool_average_kv_cache_utilization: ["gauge", ["name"]],
  inference_pool_average_queue_size: ["gauge", ["name"]],
  inference_pool_average_running_requests: ["gauge", ["name"]],
};
/** llm-d's generalLatencyBuckets (request duration); its TTFT buckets are those up to 120 s. */
const REQUEST_SIZES = [64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144, 524288, 1048576, 2097152, 4194304, 8388608, 16777216, 33554432, 67108864, 134217728, 268435456, 536870912, 1073741824];
const RESPONSE_SIZES = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32778, 65536];
/** llm-d's input and cached token buckets; its output token buckets are those up to 8192. */
const PROMPT_TOKENS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32778, 65536, 131072, 262144, 524288, 1048576];
/** llm-d's per-token latency buckets: normalized (NTPOT), streamed (TPOT), between chunks (ITL). */
const NTPOT = [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10];
const TPOT = [0.0005, 0.00205, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.125, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1, 2];
const ITL = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1, 2];
const LATENCY = [0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1, 1.25, 1.5, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30, 45, 60, 120, 180, 240, 300, 360, 480, 600, 900, 1200, 1800, 2700, 3600];

test("a routed request is counted and running under llm-d's names with its model, target model, fairness id and priority; its response times it", async () => {
  const labels = 'model_name="my-adapter",target_model_name="test-model",fairness_id="tenant-a",priority="5"';
  const gaie: [string, string][] = [["x-gateway-model-name-rewrite", MODEL], ["x-gateway-inference-fairness-id", "tenant-a"], ["x-gateway-inference-objective", "chat"]];
  const json = { model: "my-adapter", prompt: tokens(32, 1) };
  const chunks = ["data: {}\n\n", "data: [DONE]\n\n"];
  await exchange(json, gaie, { status: "200", contentType: "text/event-stream", chunks }, async () => {
    expect(await metric(`llm_d_epp_request_running{${labels}}`)).toBe(1);
    expect(await metric('inference_objective_running_requests{model_name="my-adapter"}')).toBe(1);
  });
  await waitFor(async () => (await metric(`llm_d_epp_request_running{${labels}}`)) === 0, { message: "no longer running" });
  expect(await metric('inference_objective_running_requests{model_name="my-adapter"}')).toBe(0);
  expect(await metric(`llm_d_epp_request_total{${labels}}`)).toBe(1);
  expect(await metric('inference_objective_request_total{model_name="my-adapter",target_model_name="test-model",priority="5"}')).toBe(1);
  expect(await metric(`llm_d_epp_request_duration_seconds_count{${labels}}`)).toBe(1);
  expect(await metric('inference_objective_request_duration_seconds_count{model_name="my-adapter",target_model_name="test-model"}')).toBe(1);
  expect(await metric(`llm_d_epp_request_ttft_seconds_count{${labels},streaming="true"}`)).toBe(1);
  // The first chunk came before the end: the streamed TTFT is at most the duration.
  expect(await metric(`llm_d_epp_request_ttft_seconds_sum{${labels},streaming="true"}`)).toBeLessThanOrEqual(await metric(`llm_d_epp_request_duration_seconds_sum{${labels}}`));
  const bounds = (name: string) => page.split("\n").filter((l) => l.startsWith(`${name}_bucket{`) && l.includes(labels)).map((l) => /le="([^"]+)"/.exec(l)![1]);
  await scrape();
  expect(bounds("llm_d_epp_request_duration_seconds")).toEqual([...LATENCY.map(String), "+Inf"]);
  expect(bounds("llm_d_epp_request_ttft_seconds")).toEqual([...LATENCY.filter((b) => b <= 120).map(String), "+Inf"]);
  expect(bounds("llm_d_epp_request_size_bytes")).toEqual([...REQUEST_SIZES.map(String), "+Inf"]);
  expect(bounds("llm_d_epp_response_size_bytes")).toEqual([...RESPONSE_SIZES.map(String), "+Inf"]);
  // Its body as sent, and its response's chunks together.
  const sent = JSON.stringify(json).length;
  expect(await metric(`llm_d_epp_request_size_bytes_sum{${labels}}`)).toBe(sent);
  expect(await metric('inference_objective_request_sizes_sum{model_name="my-adapter",target_model_name="test-model"}')).toBe(sent);
  expect(await metric(`llm_d_epp_response_size_bytes_sum{${labels}}`)).toBe(chunks.join("").length);
  expect(await metric('inference_objective_response_sizes_sum{model_name="my-adapter",target_model_name="test-model"}')).toBe(chunks.join("").length);
  // No error counted for it.
  expect(page).not.toContain(`llm_d_epp_request_error_total{${labels}`);
});

test("errors are counted under llm-d's codes: the upstream's non-200 (ModelServerError, timed as a response not streamed) and a request refused here (BadRequest, its model unread)", async () => {
  const labels = 'model_name="test-model",target_model_name="test-model",fairness_id="default-flow",priority="0"';
  await exchange({ model: MODEL, prompt: tokens(32, 2) }, [], { status: "500", contentType: "application/json", chunks: ['{"error":"boom"}'] });
  await waitFor(async () => (await metric(`llm_d_epp_request_error_total{${labels},error_code="ModelServerError"}`)) === 1, { message: "the model server's error" });
  expect(await metric('inference_objective_request_error_total{model_name="test-model",target_model_name="test-model",error_code="ModelServerError"}')).toBe(1);
  expect(await metric(`llm_d_epp_request_ttft_seconds_count{${labels},streaming="false"}`)).toBe(1);

  const s = client.open();
  s.send(headers());
  s.send(body("not json"));
  expect((await s.next()).immediate_response?.status?.code).toBe("BadRequest");
  s.end();
  const unread = 'model_name="",target_model_name="",fairness_id="default-flow",priority="0"';
  expect(await metric(`llm_d_epp_request_error_total{${unread},error_code="BadRequest"}`)).toBe(1);
  expect(await metric('inference_objective_request_error_total{model_name="",target_model_name="",error_code="BadRequest"}')).toBe(1);
  expect(await metric('dynamo_epp_requests_total{outcome="bad_request"}')).toBe(1);
});

test("a body asking for a stream is a streaming request whatever the response's content type, as llm-d labels it", async () => {
  const labels = 'model_name="test-model",target_model_name="test-model",fairness_id="asks-stream",priority="0"';
  const json = { model: MODEL, prompt: tokens(32, 3), stream: true };
  await exchange(json, [["x-gateway-inference-fairness-id", "asks-stream"]], { status: "200", contentType: "application/json", chunks: ['{"choices":[', "]}"] });
  await waitFor(async () => (await metric(`llm_d_epp_request_duration_seconds_count{${labels}}`)) === 1, { message: "the response timed" });
  expect(await metric(`llm_d_epp_request_ttft_seconds_count{${labels},streaming="true"}`)).toBe(1);
  expect(await metric(`llm_d_epp_request_ttft_seconds_count{${labels},streaming="false"}`)).toBe(0);
  // A filter that skips response headers: the body's ask alone makes it streamed.
  const s = client.open();
  s.send(requestHeaders([["x-gateway-inference-fairness-id", "asks-stream"]]));
  s.send(body({ ...json, prompt: tokens(32, 10) }));
  await answerFor(s, "request_headers");
  s.send({ response_body: { body: enc.encode("data: [DONE]\n\n"), end_of_stream: true } });
  await answerFor(s, "response_body");
  s.end();
  await waitFor(async () => (await metric(`llm_d_epp_request_ttft_seconds_count{${labels},streaming="true"}`)) === 2, { message: "streamed without response headers" });
});

test("the token counts a response's usage reports (a chat's JSON body, a stream's last usage, the Messages API's names) under llm-d's token histograms", async () => {
  const labels = (id: string) => `model_name="test-model",target_model_name="test-model",fairness_id="${id}",priority="0"`;
  const model = 'model_name="test-model",target_model_name="test-model"';
  const json = '{"choices":[{"text":"x"}],"usage":{"prompt_tokens":40,"completion_tokens":9,"prompt_tokens_details":{"cached_tokens":32}}}';
  await exchange({ model: MODEL, prompt: tokens(40, 4) }, [["x-gateway-inference-fairness-id", "usage-json"]], { status: "200", contentType: "application/json", chunks: [json] });
  // vLLM's continuous usage stats, the final usage chunk split across two body chunks; no prompt_tokens_details.
  const stream = [
    'data: {"choices":[{"text":"a"}],"usage":{"prompt_tokens":48,"completion_tokens":1}}\n\n',
    'data: {"choices":[],"usage":{"prompt_tokens":48,"completion_tokens":1', '7}}\n\ndata: [DONE]\n\n',
  ];
  await exchange({ model: MODEL, prompt: tokens(48, 5), stream: true }, [["x-gateway-inference-fairness-id", "usage-stream"]], { status: "200", contentType: "text/event-stream", chunks: stream });
  // A usage of 0 output tokens is not observed; 0 cached tokens is.
  const zero = '{"usage":{"input_tokens":12,"output_tokens":0,"cache_read_input_tokens":0}}';
  await exchange({ model: MODEL, prompt: tokens(12, 6) }, [["x-gateway-inference-fairness-id", "usage-zero"]], { status: "200", contentType: "application/json", chunks: [zero] });
  // A count_tokens answer reports a prompt that ran nowhere: its response is not read for usage (llm-d's skips it).
  const count = { model: MODEL, messages: [{ role: "user", content: "how long am I?" }], max_tokens: 1 };
  await exchange(count, [["x-gateway-inference-fairness-id", "count-tokens"]], { status: "200", contentType: "application/json", chunks: ['{"input_tokens":7}'] }, undefined, "/v1/messages/count_tokens");
  await waitFor(async () => (await metric(`llm_d_epp_request_duration_seconds_count{${labels("usage-zero")}}`)) === 1, { message: "the responses ended" });
  await waitFor(async () => (await metric(`llm_d_epp_request_duration_seconds_count{${labels("count-tokens")}}`)) === 1, { message: "count_tokens ended" });

  const sums = async (id: string) =>
    Promise.all(["input", "output", "cached"].map(async (k) => [await metric(`llm_d_epp_request_${k}_tokens_count{${labels(id)}}`), await metric(`llm_d_epp_request_${k}_tokens_sum{${labels(id)}}`)]));
  expect(await sums("usage-json")).toEqual([[1, 40], [1, 9], [1, 32]]);
  expect(await sums("usage-stream")).toEqual([[1, 48], [1, 17], [0, 0]]);
  expect(await sums("usage-zero")).toEqual([[1, 12], [0, 0], [1, 0]]);
  expect(await sums("count-tokens")).toEqual([[0, 0], [0, 0], [0, 0]]);
  // The deprecated twins, summed over the three requests (they carry no fairness id).
  expect(await metric(`inference_objective_input_tokens_sum{${model}}`)).toBe(40 + 48 + 12);
  expect(await metric(`inference_objective_output_tokens_sum{${model}}`)).toBe(9 + 17);
  expect(await metric(`inference_objective_prompt_cached_tokens_count{${model}}`)).toBe(2);
  await scrape();
  const bounds = (name: string) => page.split("\n").filter((l) => l.startsWith(`${name}_bucket{`) && l.includes(labels("usage-json"))).map((l) => /le="([^"]+)"/.exec(l)![1]);
  expect(bounds("llm_d_epp_request_input_tokens")).toEqual([...PROMPT_TOKENS.map(String), "+Inf"]);
  expect(bounds("llm_d_epp_request_cached_tokens")).toEqual([...PROMPT_TOKENS.map(String), "+Inf"]);
  expect(bounds("llm_d_epp_request_output_tokens")).toEqual([...PROMPT_TOKENS.filter((b) => b <= 8192).map(String), "+Inf"]);
  // 40 input tokens: first counted in the bucket of 64.
  const bucket = (le: string) => page.split("\n").find((l) => l.startsWith("llm_d_epp_request_input_tokens_bucket{") && l.includes(labels("usage-json")) && l.includes(`le="${le}"`))?.split(" ")[1];
  expect([bucket("32"), bucket("64")]).toEqual(["0", "1"]);
});

test("the time per output token from the usage's output count: normalized over the whole duration, and for a stream the time after its first byte over the tokens after the first, and between its chunks", async () => {
  const labels = (id: string) => `model_name="test-model",target_model_name="test-model",fairness_id="${id}",priority="0"`;
  const ids = ["tpot-json", "tpot-stream", "tpot-one-chunk"];
  await exchange({ model: MODEL, prompt: tokens(16, 7) }, [["x-gateway-inference-fairness-id", ids[0]!]], { status: "200", contentType: "application/json", chunks: ['{"usage":{"prompt_tokens":16,"completion_tokens":8}}'] });
  const stream = ['data: {"choices":[{"text":"a"}]}\n\n', 'data: {"choices":[{"text":"b"}]}\n\n', 'data: {"choices":[],"usage":{"prompt_tokens":16,"completion_tokens":5}}\n\ndata: [DONE]\n\n'];
  await exchange({ model: MODEL, prompt: tokens(16, 8), stream: true }, [["x-gateway-inference-fairness-id", ids[1]!]], { status: "200", contentType: "text/event-stream", chunks: stream });
  // Its first byte in the message that ends it: no time after the first token (llm-d skips it too).
  await exchange({ model: MODEL, prompt: tokens(16, 9), stream: true }, [["x-gateway-inference-fairness-id", ids[2]!]], { status: "200", contentType: "text/event-stream", chunks: [stream.join("")] });
  await waitFor(async () => (await metric(`llm_d_epp_request_duration_seconds_count{${labels(ids[2]!)}}`)) === 1, { message: "the responses ended" });
  const figures = async (id: string) => ({
    ntpot: await metric(`llm_d_epp_request_ntpot_seconds_count{${labels(id)}}`),
    tpot: await metric(`llm_d_epp_request_streaming_tpot_seconds_count{${labels(id)}}`),
    itl: await metric(`llm_d_epp_request_streaming_itl_seconds_count{${labels(id)}}`),
  });
  expect(await Promise.all(ids.map(figures))).toEqual([{ ntpot: 1, tpot: 0, itl: 0 }, { ntpot: 1, tpot: 1, itl: 2 }, { ntpot: 1, tpot: 0, itl: 0 }]);
  const sum = (name: string, id: string) => metric(`${name}_sum{${labels(id)}}`);
  expect(await sum("llm_d_epp_request_ntpot_seconds", ids[0]!)).toBeCloseTo((await sum("llm_d_epp_request_duration_seconds", ids[0]!)) / 8, 9);
  // The stream's 5 output tokens: the 4 after the first took at most its duration, as did the gaps between its 3 chunks.
  const duration = await sum("llm_d_epp_request_duration_seconds", ids[1]!);
  expect(await sum("llm_d_epp_request_ntpot_seconds", ids[1]!)).toBeCloseTo(duration / 5, 9);
  expect(4 * (await sum("llm_d_epp_request_streaming_tpot_seconds", ids[1]!))).toBeLessThanOrEqual(duration);
  expect(await sum("llm_d_epp_request_streaming_itl_seconds", ids[1]!)).toBeLessThanOrEqual(duration);
  expect(await metric('inference_objective_normalized_time_per_output_token_seconds_count{model_name="test-model",target_model_name="test-model"}')).toBeGreaterThanOrEqual(3);
  await scrape();
  const bounds = (name: string) => page.split("\n").filter((l) => l.startsWith(`${name}_bucket{`) && l.includes(labels(ids[1]!))).map((l) => /le="([^"]+)"/.exec(l)![1]);
  expect(bounds("llm_d_epp_request_ntpot_seconds")).toEqual([...NTPOT.map(String), "+Inf"]);
  expect(bounds("llm_d_epp_request_streaming_tpot_seconds")).toEqual([...TPOT.map(String), "+Inf"]);
  expect(bounds("llm_d_epp_request_streaming_itl_seconds")).toEqual([...ITL.map(String), "+Inf"]);
});

test("the pool's gauges: its endpoints with a current scrape, and the means and sample standard deviations of what they last reported, rounded as llm-d rounds them", async () => {
  await waitFor(async () => (await metric('llm_d_epp_average_queue_size{name=""}')) === 1.5, { message: "both workers scraped" });
  for (const prefix of ["llm_d_epp_", "inference_pool_"]) {
    expect(await metric(`${prefix}average_kv_cache_utilization{name=""}`)).toBe(0.38);
    expect(await metric(`${prefix}average_queue_size{name=""}`)).toBe(1.5);
    expect(await metric(`${prefix}average_running_requests{name=""}`)).toBe(1.5);
  }
  // KV 0.5 and 0.25: sqrt(2 x 0.125^2) = 0.177; waiting 3 and 0: 2.121; running 2 and 1: 0.707.
  expect(await metric('llm_d_epp_std_dev_kv_cache_utilization{name=""}')).toBe(0.18);
  expect(await metric('llm_d_epp_std_dev_queue_size{name=""}')).toBe(2.12);
  expect(await metric('llm_d_epp_std_dev_running_requests{name=""}')).toBe(0.71);
  expect(await metric('llm_d_epp_ready_endpoints{name=""}')).toBe(2);
  expect(await metric('inference_pool_ready_pods{name=""}')).toBe(2);
});

test("every llm-d series has llm-d's type and label names", async () => {
  const seen = families(await scrape());
  const got = Object.fromEntries(Object.keys(UPSTREAM).map((n) => [n, seen.has(n) ? [seen.get(n)!.type, [...seen.get(n)!.labels].sort()] : "absent"]));
  expect(got).toEqual(Object.fromEntries(Object.entries(UPSTREAM).map(([n, [type, labels]]) => [n, [type, [...labels].sort()]])));
});
