import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { waitFor, LOOPBACK } from "@kv-epp/testkit";
import { startMockWorker, type CacheTruth, type MockWorker } from "../src/index.ts";
import { post } from "./support.ts";

// vLLM's NixlConnector flow between a prefill-role and a decode-role mock, driven as the P/D sidecar
// drives it: the prefill request (do_remote_decode, max_tokens 1), then the decode request carrying
// the kv_transfer_params the prefill answered with.

let prefill: MockWorker, decode: MockWorker, both: MockWorker;
const common = { port: 0, speed: 0, blockSize: 16, model: "mock/model", logLevel: "silent" as const };
beforeAll(async () => {
  prefill = await startMockWorker({ ...common, listen: `${LOOPBACK}.2.60`, kvEvents: `tcp://${LOOPBACK}.2.60:0`, role: "prefill" });
  decode = await startMockWorker({ ...common, listen: `${LOOPBACK}.2.61`, kvEvents: `tcp://${LOOPBACK}.2.61:0`, role: "decode" });
  both = await startMockWorker({ ...common, listen: `${LOOPBACK}.2.62`, kvEvents: `tcp://${LOOPBACK}.2.62:0` });
});
afterAll(() => Promise.all([prefill.close(), decode.close(), both.close()]));

const ids = (n: number, from = 1) => Array.from({ length: n }, (_, i) => from + i);
const PREFILL_PARAMS = { do_remote_decode: true, do_remote_prefill: false, remote_engine_id: null, remote_block_ids: null, remote_host: null, remote_port: null };

async function completion(w: MockWorker, body: object): Promise<any> {
  const res = await post(`${w.url}/v1/completions`, { model: "mock/model", ...body });
  expect(res.status).toBe(200);
  return res.json();
}
const truth = async (w: MockWorker) => (await (await fetch(`${w.url}/admin/cache`)).json()) as CacheTruth;
const hashes = (t: CacheTruth) => t.ranks[0]!.blocks.map((b) => b.block_hash).sort();
async function metric(w: MockWorker, line: string): Promise<number> {
  const text = await (await fetch(`${w.url}/metrics`)).text();
  const found = text.split("\n").find((l) => l.startsWith(line + " "));
  return found === undefined ? Number.NaN : Number(found.slice(line.length + 1));
}
const source = (s: string) => `vllm:prompt_tokens_by_source_total{model_name="mock/model",engine="0",source="${s}"}`;

describe("prefill and decode roles (vLLM's NixlConnector)", () => {
  test("a prefill for a remote decode answers with the parameters naming its held blocks", async () => {
    const prompt = ids(70); // 4 full blocks and 6 tokens: 5 blocks of KV
    const res = await completion(prefill, { prompt, max_tokens: 1, kv_transfer_params: PREFILL_PARAMS });
    const kv = res.kv_transfer_params;
    expect(kv).toMatchObject({ do_remote_prefill: true, do_remote_decode: false, remote_host: `${LOOPBACK}.2.60`, remote_port: Number(new URL(prefill.url).port), tp_size: 1 });
    expect(kv.remote_block_ids).toHaveLength(1); // one KV cache group, as vLLM's BlockIds
    expect(kv.remote_block_ids[0]).toHaveLength(5);
    expect(typeof kv.remote_engine_id).toBe("string");
    expect(kv.remote_request_id).toStartWith("cmpl-");
    expect(await metric(prefill, `mock_worker_kv_transfer_held_requests{model_name="mock/model",engine="0"}`)).toBe(1);
    const t = await truth(prefill);
    expect(t.role).toBe("prefill");
    expect(prefill.ranks[0]!.cache.peekHitBlocks(Uint32Array.from(prompt))).toBe(4);
    // The blocks stay referenced for the decode worker to read: it tells the prefill worker when it did.
    const read = (await (await post(`${prefill.url}/nixl/notify`, { remote_request_id: kv.remote_request_id })).json()) as { released: boolean };
    expect(read.released).toBe(true);
    expect(await metric(prefill, `mock_worker_kv_transfer_held_requests{model_name="mock/model",engine="0"}`)).toBe(0);
  });

  test("a decode given those parameters pulls the prompt's blocks instead of computing them, then frees the prefill's", async () => {
    const prompt = ids(100, 1000); // 6 full blocks and 4 tokens
    const before = { external: await metric(decode, source("external_kv_transfer")), compute: await metric(decode, source("local_compute")) };
    const p = await completion(prefill, { prompt, max_tokens: 1, kv_transfer_params: PREFILL_PARAMS });
    const d = await completion(decode, { prompt, max_tokens: 5, kv_transfer_params: p.kv_transfer_params });
    expect(d.choices[0].finish_reason).toBe("length");
    expect(d.usage).toMatchObject({ prompt_tokens: 100, completion_tokens: 5, prompt_tokens_details: { cached_tokens: 99 } });
    expect(d.kv_transfer_params).toBeNull();
    // Every prompt token but the last came over the transfer; the decode computed one.
    expect((await metric(decode, source("external_kv_transfer"))) - before.external).toBe(99);
    expect((await metric(decode, source("local_compute"))) - before.compute).toBe(1);
    // The pulled blocks are cached on the decode worker as on the prefill worker: same hashes.
    const onDecode = new Set(hashes(await truth(decode)));
    const onPrefill = (await truth(prefill)).ranks[0]!.blocks.filter((b) => b.token_ids[0]! >= 1000).map((b) => b.block_hash);
    expect(onPrefill).toHaveLength(6);
    for (const h of onPrefill) expect(onDecode.has(h)).toBe(true);
    await waitFor(async () => (await metric(prefill, `mock_worker_kv_transfer_held_requests{model_name="mock/model",engine="0"}`)) === 0, { message: "the prefill's blocks freed" });
  });

  test("a decode pulls only the blocks it does not hold itself", async () => {
    const shared = ids(64, 5000); // 4 blocks the decode worker already holds
    await completion(decode, { prompt: [...shared, 1], max_tokens: 1 });
    const pulled = await metric(decode, `mock_worker_kv_transfer_pulled_blocks_total{model_name="mock/model",engine="0"}`);
    const prompt = [...shared, ...ids(40, 9000)]; // 104 tokens: 7 blocks of KV, 4 of them local
    const p = await completion(prefill, { prompt, max_tokens: 1, kv_transfer_params: PREFILL_PARAMS });
    const d = await completion(decode, { prompt, max_tokens: 1, kv_transfer_params: p.kv_transfer_params });
    expect((await metric(decode, `mock_worker_kv_transfer_pulled_blocks_total{model_name="mock/model",engine="0"}`)) - pulled).toBe(3);
    expect(d.usage.prompt_tokens_details.cached_tokens).toBe(103);
  });

  test("do_remote_prefill without where to pull from runs the prompt locally and is counted", async () => {
    const compute = await metric(decode, source("local_compute"));
    const d = await completion(decode, { prompt: ids(48, 20000), max_tokens: 1, kv_transfer_params: { do_remote_prefill: true, remote_block_ids: [[1, 2, 3]], remote_engine_id: "e" } });
    expect(d.usage.prompt_tokens_details).toBeNull();
    expect((await metric(decode, source("local_compute"))) - compute).toBe(48);
    expect(await metric(decode, `mock_worker_kv_transfer_invalid_params_total{model_name="mock/model"}`)).toBe(1);
  });

  test("a worker without a role has no connector: it ignores kv_transfer_params, as vLLM without --kv-transfer-config", async () => {
    const res = await completion(both, { prompt: ids(40), max_tokens: 1, kv_transfer_params: PREFILL_PARAMS });
    expect("kv_transfer_params" in res).toBe(false);
    expect((await truth(both)).role).toBeNull();
    expect(await metric(both, source("local_compute"))).toBe(40);
  });

  test("/v1/messages honours them as a chat does, in the message's shape: the prefill's parameters at its top, none when null", async () => {
    const request = { model: "mock/model", messages: [{ role: "user", content: "what does a decode worker read? ".repeat(8) }] };
    const pres = await post(`${prefill.url}/v1/messages`, { ...request, max_tokens: 1, kv_transfer_params: PREFILL_PARAMS });
    expect(pres.status).toBe(200);
    const p = (await pres.json()) as any;
    expect(Object.keys(p)).toEqual(["id", "type", "role", "content", "model", "stop_reason", "usage", "kv_transfer_params"]);
    expect(p.kv_transfer_params).toMatchObject({ do_remote_prefill: true, do_remote_decode: false, remote_host: `${LOOPBACK}.2.60`, tp_size: 1 });
    expect(p.kv_transfer_params.remote_request_id).toStartWith("chatcmpl-");
    const n = p.usage.input_tokens;
    const external = await metric(decode, source("external_kv_transfer"));
    // A streamed decode pulls as a JSON one does.
    const d = await post(`${decode.url}/v1/messages`, { ...request, max_tokens: 2, stream: true, kv_transfer_params: p.kv_transfer_params });
    const events = (await d.text()).split("\n").filter((l) => l.startsWith("data: ")).map((l) => JSON.parse(l.slice(6)));
    expect(events.map((e) => e.type).at(-1)).toBe("message_stop");
    expect(events[0].message).not.toHaveProperty("kv_transfer_params");
    expect(events.find((e) => e.type === "message_delta").usage).toEqual({ input_tokens: 1, output_tokens: 2, cache_read_input_tokens: n - 1 });
    expect((await metric(decode, source("external_kv_transfer"))) - external).toBe(n - 1);
    await waitFor(async () => (await metric(prefill, `mock_worker_kv_transfer_held_requests{model_name="mock/model",engine="0"}`)) === 0, { message: "the prefill's blocks freed" });
    // Parameters that are no object are refused as vLLM's request model refuses them.
    const bad = await post(`${decode.url}/v1/messages`, { ...request, max_tokens: 1, kv_transfer_params: 3 });
    expect(bad.status).toBe(400);
    expect(((await bad.json()) as any).error.param).toBe("body.kv_transfer_params");
  });

  test("/v1/responses honours them as a chat does: the prefill's parameters at the Response's top, null otherwise, streamed too", async () => {
    const request = { model: "mock/model", input: "what does a decode worker pull? ".repeat(8) };
    const pres = await post(`${prefill.url}/v1/responses`, { ...request, max_output_tokens: 1, kv_transfer_params: PREFILL_PARAMS });
    expect(pres.status).toBe(200);
    const p = (await pres.json()) as any;
    expect(Object.keys(p).slice(-2)).toEqual(["usage", "kv_transfer_params"]);
    expect(p.kv_transfer_params).toMatchObject({ do_remote_prefill: true, do_remote_decode: false, remote_host: `${LOOPBACK}.2.60`, tp_size: 1 });
    expect(p.kv_transfer_params.remote_request_id).toBe(p.id);
    const n = p.usage.input_tokens;
    const pulledOrHeld = async () => (await metric(decode, source("external_kv_transfer"))) + (await metric(decode, source("local_cache_hit")));
    const before = await pulledOrHeld();
    // A streamed decode pulls (what it does not hold: the template's opening it has from the tests before) as a JSON
    // one does; its Response objects carry null.
    const d = await post(`${decode.url}/v1/responses`, { ...request, max_output_tokens: 2, stream: true, kv_transfer_params: p.kv_transfer_params });
    const events = (await d.text()).split("\n").filter((l) => l.startsWith("data: ")).map((l) => JSON.parse(l.slice(6)));
    const completed = events.at(-1);
    expect(completed.type).toBe("response.completed");
    expect(events[0].response.kv_transfer_params).toBeNull();
    expect(completed.response.kv_transfer_params).toBeNull();
    expect(completed.response.usage).toMatchObject({ input_tokens: n, input_tokens_details: { cached_tokens: n - 1 }, output_tokens: 2 });
    expect((await pulledOrHeld()) - before).toBe(n - 1);
    await waitFor(async () => (await metric(prefill, `mock_worker_kv_transfer_held_requests{model_name="mock/model",engine="0"}`)) === 0, { message: "the prefill's blocks freed" });
  });

  test("a streamed decode of a remote prefill streams as usual", async () => {
    const prompt = ids(50, 30000);
    const p = await completion(prefill, { prompt, max_tokens: 1, kv_transfer_params: PREFILL_PARAMS });
    const res = await post(`${decode.url}/v1/completions`, { prompt, max_tokens: 3, stream: true, stream_options: { include_usage: true }, kv_transfer_params: p.kv_transfer_params });
    const data = (await res.text()).split("\n").filter((l) => l.startsWith("data: ")).map((l) => l.slice(6));
    expect(data.at(-1)).toBe("[DONE]");
    expect(JSON.parse(data.at(-2)!).usage.prompt_tokens_details).toEqual({ cached_tokens: 49 });
  });
});

test("a worker of role both (llm-d's prefill-decode) runs the connector either way", async () => {
  const w = await startMockWorker({ ...common, listen: `${LOOPBACK}.2.64`, kvEvents: `tcp://${LOOPBACK}.2.64:0`, role: "both" });
  try {
    const p = await completion(w, { prompt: ids(40, 600), max_tokens: 1, kv_transfer_params: PREFILL_PARAMS });
    expect(p.kv_transfer_params).toMatchObject({ do_remote_prefill: true, remote_host: `${LOOPBACK}.2.64` });
    const d = await completion(decode, { prompt: ids(40, 600), max_tokens: 1, kv_transfer_params: p.kv_transfer_params });
    expect(d.usage.prompt_tokens_details.cached_tokens).toBe(39);
    await waitFor(async () => (await metric(w, `mock_worker_kv_transfer_held_requests{model_name="mock/model",engine="0"}`)) === 0, { message: "the blocks read and freed" });
    expect((await truth(w)).role).toBe("both");
  } finally {
    await w.close();
  }
});

test("prefilled blocks no decode worker reads are freed at the abort timeout", async () => {
  const w = await startMockWorker({ ...common, listen: `${LOOPBACK}.2.63`, kvEvents: `tcp://${LOOPBACK}.2.63:0`, role: "prefill", kvTransferAbortTimeoutS: 0.05 });
  try {
    const res = await completion(w, { prompt: ids(40), max_tokens: 1, kv_transfer_params: PREFILL_PARAMS });
    expect(res.kv_transfer_params.do_remote_prefill).toBe(true);
    await waitFor(async () => (await metric(w, `mock_worker_kv_transfer_expired_total{model_name="mock/model"}`)) === 1, { message: "the held blocks to expire" });
    expect(await metric(w, `mock_worker_kv_transfer_held_requests{model_name="mock/model",engine="0"}`)).toBe(0);
    expect(w.ranks[0]!.cache.usage).toBe(0);
  } finally {
    await w.close();
  }
});
