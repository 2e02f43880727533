// A worker with an SGLang --event-encoding stands for SGLang on the wire: SGLang's scheduler gauges and
// labels on /metrics (python/sglang/srt/metrics/collector.py) and no vLLM series, `GET /server_info` with the
// kv_events descriptor a router subscribes by (and no vLLM /kv_event_sources), SGLang's /flush_cache, and the DP rank a
// request names read as SGLang reads it.
import { afterAll, afterEach, expect, test } from "bun:test";
import { readReportedSources } from "@kv-epp/intents";
import { LOOPBACK, waitFor } from "@kv-epp/testkit";
import { startMockWorker, type MockWorker, type MockWorkerOptions } from "../src/index.ts";
import { FLUSH_CACHE_TEXT } from "../src/http/sglang-routes.ts";
import { post } from "./support.ts";

const HOST = `${LOOPBACK}.2.80`;
const workers: MockWorker[] = [];
const inflight: AbortController[] = [];
afterEach(() => {
  for (const a of inflight.splice(0)) a.abort();
});
afterAll(async () => {
  for (const w of workers.splice(0)) await w.close();
});

async function worker(opts: MockWorkerOptions): Promise<MockWorker> {
  const w = await startMockWorker({ listen: HOST, port: 0, kvEvents: `tcp://${HOST}:0`, eventEncoding: "sglang-map", speed: 0, model: "mock/model", logLevel: "silent", ...opts });
  workers.push(w);
  return w;
}

/** The series of one metric: its label text and value, in exposition order. */
function series(text: string, name: string): { labels: string; value: number }[] {
  return [...text.matchAll(new RegExp(`^${name}\\{([^}]*)\\} (\\S+)$`, "gm"))].map((m) => ({ labels: m[1]!, value: Number(m[2]) }));
}

/** A request that runs (or waits) on `rank` until the test ends. */
function hold(w: MockWorker, rank: number, promptTokens: number): void {
  const a = new AbortController();
  inflight.push(a);
  const prompt = Array.from({ length: promptTokens }, (_, i) => 1 + rank * 10_000 + i);
  fetch(`${w.url}/v1/completions`, {
    method: "POST", signal: a.signal, headers: { "content-type": "application/json", "x-data-parallel-rank": String(rank) },
    body: JSON.stringify({ prompt, max_tokens: 100_000 }),
  }).catch(() => {});
}

test("/metrics carries SGLang's scheduler gauges per DP rank, labelled as SGLang labels them, and no vLLM series", async () => {
  const w = await worker({ dpSize: 2, blockSize: 16, capacityBlocks: 64, speed: 1, stepBaseMs: 20, maxNumSeqs: 1 });
  hold(w, 0, 100);
  hold(w, 0, 40);
  hold(w, 0, 40);
  hold(w, 1, 300);
  await waitFor(() => w.ranks[0]!.engine.running === 1 && w.ranks[0]!.engine.waiting === 2 && w.ranks[1]!.engine.running === 1, { message: "the requests admitted" });
  const text = await (await fetch(`${w.url}/metrics`)).text();
  expect(text).not.toMatch(/^vllm:/m);
  const labels = (dp: number) => `model_name="mock/model",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0",dp_rank="${dp}"`;
  expect(series(text, "sglang:num_running_reqs")).toEqual([{ labels: labels(0), value: 1 }, { labels: labels(1), value: 1 }]);
  expect(series(text, "sglang:num_queue_reqs")).toEqual([{ labels: labels(0), value: 2 }, { labels: labels(1), value: 0 }]);
  expect(series(text, "sglang:max_total_num_tokens")).toEqual([{ labels: labels(0), value: 1024 }, { labels: labels(1), value: 1024 }]);
  const usage = series(text, "sglang:token_usage");
  expect(usage.map((s) => s.labels)).toEqual([labels(0), labels(1)]);
  // The running request's slots: its prompt blocks and its partial tail (the decode grows it step by step).
  expect(usage[0]!.value).toBeGreaterThanOrEqual(7 / 64);
  expect(usage[1]!.value).toBeGreaterThanOrEqual(19 / 64);
  expect(text).toContain("# TYPE sglang:num_running_reqs gauge");
});

test("sglang:num_used_tokens counts the tokens running requests hold, not the cached blocks none holds", async () => {
  const w = await worker({ blockSize: 16, capacityBlocks: 64 });
  const cache = w.ranks[0]!.cache;
  const used = async () => series(await (await fetch(`${w.url}/metrics`)).text(), "sglang:num_used_tokens").map((s) => s.value);
  // A finished request leaves its 10 blocks cached: evictable, so free to SGLang (its evictable_size).
  expect((await post(`${w.url}/v1/completions`, { prompt: Array.from({ length: 160 }, (_, i) => i + 1), max_tokens: 1 })).status).toBe(200);
  expect(await used()).toEqual([0]);
  // A request running on the rank: its 100-token prompt and first output token in 7 blocks it holds.
  const running = cache.acquire(Uint32Array.from({ length: 100 }, (_, i) => 5000 + i));
  expect(cache.allocate(running.lease, 101)).toBe(true);
  const held = (running.lease.blocks.length + running.lease.anonymous) * cache.blockSize;
  expect(held).toBe(7 * 16);
  expect(cache.usedBlocks * cache.blockSize).toBeGreaterThan(held); // the finished request's blocks are still resident
  expect(await used()).toEqual([held]);
  cache.release(running.lease);
  expect(await used()).toEqual([0]);
});

test("a server of one DP rank labels no dp_rank, and counts its tokens and requests", async () => {
  const w = await worker({ blockSize: 16 });
  const prompt = Array.from({ length: 40 }, (_, i) => i + 1);
  for (let i = 0; i < 2; i++) expect((await post(`${w.url}/v1/completions`, { prompt, max_tokens: 3 })).status).toBe(200);
  const text = await (await fetch(`${w.url}/metrics`)).text();
  expect(series(text, "sglang:num_queue_reqs")).toEqual([{ labels: 'model_name="mock/model",engine_type="unified",tp_rank="0",pp_rank="0",moe_ep_rank="0"', value: 0 }]);
  const server = (name: string) => series(text, name).map((s) => s.value);
  expect(server("sglang:prompt_tokens_total")).toEqual([80]);
  expect(server("sglang:cached_tokens_total")).toEqual([32]);
  expect(server("sglang:generation_tokens_total")).toEqual([6]);
  expect(server("sglang:num_requests_total")).toEqual([2]);
  expect(server("sglang:time_to_first_token_seconds_count")).toEqual([2]);
  expect(text).not.toMatch(/^vllm:/m);
});

test("/server_info's kv_events is SGLang's descriptor: host as configured, base port, rank r on base + r; /kv_event_sources is not served", async () => {
  const w = await worker({ dpSize: 2, blockSize: 16, kvEvents: `tcp://${HOST}:15557`, topic: "kv" });
  const info = (await (await fetch(`${w.url}/server_info`)).json()) as Record<string, unknown>;
  expect(info.kv_events).toEqual({ publisher: "zmq", endpoint_host: HOST, endpoint_port_base: 15557, topic: "kv", block_size: 16, dp_size: 2 });
  expect(info).toMatchObject({ served_model_name: "mock/model", page_size: 16, dp_size: 2, disaggregation_mode: "null", max_total_num_tokens: 16 * 8192 });
  expect((await fetch(`${w.url}/kv_event_sources`)).status).toBe(404);
  // The EPP's reader falls back to /server_info and finds every rank's publisher.
  const read = await readReportedSources(w.url);
  expect(read.sources).toEqual(w.ranks.map((r) => ({ rank: r.rank, kvEvents: r.kvEvents, replay: null, topic: "kv" })));
  expect([read.skipped, read.unknownFields]).toEqual([0, 0]);
});

test("ranks on ephemeral ports, which SGLang cannot advertise, are listed one by one in publishers", async () => {
  const w = await worker({ dpSize: 2, blockSize: 16, kvEvents: "tcp://*:0" });
  const kv = ((await (await fetch(`${w.url}/server_info`)).json()) as { kv_events: Record<string, unknown> }).kv_events;
  expect(kv).toMatchObject({ publisher: "zmq", endpoint_host: "*", dp_size: 2 });
  expect((kv.publishers as { dp_rank: number }[]).map((p) => p.dp_rank)).toEqual([0, 1]);
  const read = await readReportedSources(w.url);
  expect(read.sources.map((s) => s.kvEvents)).toEqual(w.ranks.map((r) => r.kvEvents));
});

test("/flush_cache drops an idle server's cache and refuses a busy one, with SGLang's text; /v1/models is owned by sglang", async () => {
  const w = await worker({ blockSize: 16, speed: 1, stepBaseMs: 20 });
  expect((await post(`${w.url}/v1/completions`, { prompt: Array.from({ length: 40 }, (_, i) => i + 1), max_tokens: 1 })).status).toBe(200);
  expect(w.ranks[0]!.cache.usedBlocks).toBeGreaterThan(0);
  hold(w, 0, 20);
  await waitFor(() => w.ranks[0]!.engine.running === 1, { message: "a request running" });
  const busy = await post(`${w.url}/flush_cache`, {});
  expect([busy.status, await busy.text()]).toEqual([400, FLUSH_CACHE_TEXT]);
  for (const a of inflight.splice(0)) a.abort();
  await waitFor(() => w.ranks[0]!.engine.load === 0, { message: "the request gone" });
  const idle = await fetch(`${w.url}/flush_cache`);
  expect([idle.status, await idle.text()]).toEqual([200, FLUSH_CACHE_TEXT]);
  expect(w.ranks[0]!.cache.usedBlocks).toBe(0);
  const models = (await (await fetch(`${w.url}/v1/models`)).json()) as { data: { owned_by: string }[] };
  expect(models.data.map((m) => m.owned_by)).toEqual(["sglang"]);
});

test("the rank a request names is read as SGLang reads it: the header over the body's routed_dp_rank (or data_parallel_rank); a header int() refuses and a rank out of range are 400s", async () => {
  const w = await worker({ dpSize: 2, blockSize: 16, capacityBlocks: 256 });
  let seed = 0;
  const complete = (header: string | undefined, body: Record<string, unknown> = {}) =>
    fetch(`${w.url}/v1/completions`, {
      method: "POST", headers: { "content-type": "application/json", ...(header === undefined ? {} : { "x-data-parallel-rank": header }) },
      body: JSON.stringify({ prompt: Array.from({ length: 32 }, (_, i) => 1 + ++seed * 100 + i), max_tokens: 1, ...body }),
    });
  /** The rank a request ran on: the one whose cache grew. */
  const ranOn = async (header: string | undefined, body: Record<string, unknown> = {}) => {
    const before = w.ranks.map((r) => r.cache.usedBlocks);
    expect((await complete(header, body)).status).toBe(200);
    return w.ranks.findIndex((r, i) => r.cache.usedBlocks > before[i]!);
  };
  expect(await ranOn(undefined, { routed_dp_rank: 1 })).toBe(1);
  expect(await ranOn(undefined, { data_parallel_rank: 1 })).toBe(1);
  expect(await ranOn("0", { routed_dp_rank: 1 })).toBe(0);
  expect(await ranOn(" +1 ")).toBe(1);
  // As pydantic's lax int: an integer string too; a deprecated rank beside a routed one is validated, not used.
  expect(await ranOn(undefined, { routed_dp_rank: "1" })).toBe(1);
  expect(await ranOn(undefined, { routed_dp_rank: "1.0" })).toBe(1);
  expect(await ranOn(undefined, { routed_dp_rank: true })).toBe(1);
  expect(await ranOn(undefined, { routed_dp_rank: 0, data_parallel_rank: 1 })).toBe(0);
  const message = async (res: Response) => ((await res.json()) as { error: { message: string } }).error.message;
  const bad = await complete("one");
  expect(bad.status).toBe(400);
  expect(await message(bad)).toBe("Invalid X-Data-Parallel-Rank header: must be an integer, got 'one'");
  const past = await complete(undefined, { routed_dp_rank: 2 });
  expect(past.status).toBe(400);
  expect(await message(past)).toBe("routed_dp_rank=2 out of range [0, 2)");
  for (const body of [{ routed_dp_rank: "x" }, { routed_dp_rank: 0.5 }, { data_parallel_rank: "1.5" }]) {
    const res = await complete(undefined, body);
    expect(res.status).toBe(400);
    expect(await message(res)).toMatch(/^(routed_dp_rank|data_parallel_rank): Input should be a valid integer$/);
  }
  // /v1/responses reads the rank the same way.
  const responses = await fetch(`${w.url}/v1/responses`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ input: "q", routed_dp_rank: "x" }) });
  expect(responses.status).toBe(400);
});

test("a chat's reply comes in SGLang's role, assistant, whatever --response-role (vLLM's) and add_generation_prompt say", async () => {
  const w = await worker({ responseRole: "model" });
  const role = async (body: object) =>
    ((await (await post(`${w.url}/v1/chat/completions`, { messages: [{ role: "user", content: "hi" }], max_tokens: 1, ...body })).json()) as any).choices[0].message.role;
  expect(await role({})).toBe("assistant");
  expect(await role({ add_generation_prompt: false })).toBe("assistant");
});
