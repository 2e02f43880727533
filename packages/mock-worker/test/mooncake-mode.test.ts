import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { LOOPBACK, waitFor } from "@kv-epp/testkit";
import { startMockWorker, ConfigError, type CacheTruth, type MockWorker } from "../src/index.ts";
import { subscribe, syncSubscribers, residentFromEvents } from "./support.ts";

// vLLM's MooncakeConnector between a prefill-role and a decode-role mock (--kv-connector mooncake), driven as llm-d's
// sidecar drives it: the engine id from the prefill's bootstrap server, then both legs paired by one transfer_id.

let prefill: MockWorker, decode: MockWorker;
const common = { port: 0, speed: 0, blockSize: 16, model: "mock/model", logLevel: "silent" as const, kvConnector: "mooncake" as const };
const P = `${LOOPBACK}.2.146`, D = `${LOOPBACK}.2.147`;
beforeAll(async () => {
  prefill = await startMockWorker({ ...common, listen: P, kvEvents: `tcp://${P}:0`, role: "prefill", dpSize: 2, mooncakeBootstrapPort: 0, kvTransferAbortTimeoutS: 0.5 });
  decode = await startMockWorker({ ...common, listen: D, kvEvents: `tcp://${D}:0`, role: "decode" });
});
afterAll(() => Promise.all([prefill?.close(), decode?.close()]));

const bootstrap = () => `http://${P}:${prefill.bootstrapPort}`;
const engines = async () => (await (await fetch(`${bootstrap()}/query`)).json()) as Record<string, { engine_id: string; worker_addr: Record<string, Record<string, string>> }>;
const post = (w: MockWorker, path: string, body: object, headers: Record<string, string> = {}) =>
  fetch(`${w.url}${path}`, { method: "POST", headers: { "content-type": "application/json", ...headers }, body: JSON.stringify(body) });
const prefillParams = (transferId: string) => ({ do_remote_prefill: false, do_remote_decode: true, transfer_id: transferId });
const decodeParams = (transferId: string, engineId: string) => ({ do_remote_prefill: true, do_remote_decode: false, transfer_id: transferId, remote_bootstrap_addr: bootstrap(), remote_engine_id: engineId });
const truth = async (w: MockWorker) => (await (await fetch(`${w.url}/admin/cache`)).json()) as CacheTruth;
const ids = (n: number, from: number) => Array.from({ length: n }, (_, i) => from + i);
async function metric(w: MockWorker, line: string): Promise<number> {
  const text = await (await fetch(`${w.url}/metrics`)).text();
  const found = text.split("\n").find((l) => l.startsWith(line + " "));
  return found === undefined ? Number.NaN : Number(found.slice(line.length + 1));
}
const M = `{model_name="mock/model"}`;

describe("Mooncake mode (--kv-connector mooncake)", () => {
  test("the bootstrap server lists each DP rank's engine id and worker, as vLLM's /query", async () => {
    const q = await engines();
    expect(Object.keys(q).sort()).toEqual(["0", "1"]);
    expect(q["0"]!.engine_id).toMatch(/^[0-9a-f-]{36}_dp0$/);
    expect(q["1"]!.engine_id).toBe(q["0"]!.engine_id.replace(/_dp0$/, "_dp1"));
    expect(q["0"]!.worker_addr).toEqual({ "0": { "0": `tcp://${P}:${prefill.bootstrapPort}` } });
    expect(decode.bootstrapPort).toBeNull();
  });

  test("a decode sent first waits for its prefill on the engine's rank, reads the blocks and computes only the last token", async () => {
    const sub = subscribe(decode.ranks[0]!.kvEvents);
    await syncSubscribers(decode.url, [sub]);
    const engine = (await engines())["1"]!.engine_id;
    const prompt = ids(100, 1000); // 6 full blocks and 4 tokens
    const d = post(decode, "/v1/completions", { model: "mock/model", prompt, max_tokens: 5, kv_transfer_params: decodeParams("xfer-a", engine) });
    const p = await post(prefill, "/v1/completions", { model: "mock/model", prompt, max_tokens: 1, kv_transfer_params: prefillParams("xfer-a") }, { "x-data-parallel-rank": "1" });
    expect(p.status).toBe(200);
    const pb = (await p.json()) as any;
    // A Mooncake prefill names nothing: the router paired the legs.
    expect(pb.kv_transfer_params).toBeNull();
    const dres = await d;
    expect(dres.status).toBe(200);
    const db = (await dres.json()) as any;
    expect(db.usage).toMatchObject({ prompt_tokens: 100, completion_tokens: 5, prompt_tokens_details: { cached_tokens: 99 } });
    // The prefill ran on rank 1; the decode holds its blocks under the same hashes and published them.
    const onPrefill = (await truth(prefill)).ranks[1]!.blocks.map((b) => b.block_hash).sort();
    expect(onPrefill).toHaveLength(6);
    const onDecode = (await truth(decode)).ranks[0]!.blocks.map((b) => b.block_hash);
    for (const h of onPrefill) expect(onDecode).toContain(h);
    await waitFor(() => onPrefill.every((h) => residentFromEvents(sub.messages).has(BigInt(h))), { message: "the decode's BlockStored events" });
    sub.close();
    expect(await metric(decode, `mock_worker_kv_transfer_pulled_blocks_total{model_name="mock/model",engine="0"}`)).toBe(7);
    expect(await metric(prefill, `mock_worker_kv_transfer_held_requests{model_name="mock/model",engine="1"}`)).toBe(0);
    expect(await metric(prefill, `mock_worker_mooncake_transfers_total${M}`)).toBe(1);
  });

  test("a decode already holding a prefix reads only what it lacks", async () => {
    const engine = (await engines())["0"]!.engine_id;
    const prompt = ids(64, 5000);
    expect((await post(decode, "/v1/completions", { model: "mock/model", prompt: prompt.slice(0, 32), max_tokens: 1 })).status).toBe(200);
    const pulled = await metric(decode, `mock_worker_kv_transfer_pulled_blocks_total{model_name="mock/model",engine="0"}`);
    expect((await post(prefill, "/v1/completions", { model: "mock/model", prompt, max_tokens: 1, kv_transfer_params: prefillParams("xfer-b") }, { "x-data-parallel-rank": "0" })).status).toBe(200);
    const d = await post(decode, "/v1/completions", { model: "mock/model", prompt, max_tokens: 2, kv_transfer_params: decodeParams("xfer-b", engine) });
    expect(((await d.json()) as any).usage.prompt_tokens_details).toEqual({ cached_tokens: 63 });
    expect(await metric(decode, `mock_worker_kv_transfer_pulled_blocks_total{model_name="mock/model",engine="0"}`)).toBe(pulled + 2);
  });

  test("an engine id the bootstrap server does not list fails the decode (500), counted", async () => {
    const failed = await metric(decode, `mock_worker_mooncake_load_failures_total${M}`);
    const d = await post(decode, "/v1/chat/completions", { model: "mock/model", messages: [{ role: "user", content: "hi" }], kv_transfer_params: decodeParams("xfer-c", "not-an-engine") });
    expect(d.status).toBe(500);
    expect(((await d.json()) as any).error.message).toContain(`remote engine_id not-an-engine not found from bootstrap server ${bootstrap()}`);
    expect(await metric(decode, `mock_worker_mooncake_load_failures_total${M}`)).toBe(failed + 1);
  });

  test("a prefill never taken is freed at the abort timeout; a decode that comes later fails", async () => {
    const engine = (await engines())["0"]!.engine_id;
    const expired = await metric(prefill, `mock_worker_kv_transfer_expired_total${M}`);
    const prompt = ids(40, 9000);
    expect((await post(prefill, "/v1/completions", { model: "mock/model", prompt, max_tokens: 1, kv_transfer_params: prefillParams("xfer-d") }, { "x-data-parallel-rank": "0" })).status).toBe(200);
    expect(await metric(prefill, `mock_worker_kv_transfer_held_requests{model_name="mock/model",engine="0"}`)).toBe(1);
    await waitFor(async () => (await metric(prefill, `mock_worker_kv_transfer_expired_total${M}`)) === expired + 1, { message: "expired" });
    expect(await metric(prefill, `mock_worker_kv_transfer_held_requests{model_name="mock/model",engine="0"}`)).toBe(0);
    const d = await post(decode, "/v1/completions", { model: "mock/model", prompt, max_tokens: 1, kv_transfer_params: decodeParams("xfer-d", engine) });
    expect(d.status).toBe(500);
    expect(((await d.json()) as any).error.message).toContain("Timeout waiting for P side ready.");
  });

  test("a prefill without transfer_id is warned about and holds nothing", async () => {
    const invalid = await metric(prefill, `mock_worker_kv_transfer_invalid_params_total${M}`);
    const p = await post(prefill, "/v1/completions", { model: "mock/model", prompt: ids(40, 12000), max_tokens: 1, kv_transfer_params: { do_remote_decode: true } });
    expect(p.status).toBe(200);
    expect(await metric(prefill, `mock_worker_kv_transfer_invalid_params_total${M}`)).toBe(invalid + 1);
    expect(await metric(prefill, `mock_worker_kv_transfer_held_requests{model_name="mock/model",engine="0"}`)).toBe(0);
    expect(await metric(prefill, `mock_worker_kv_transfer_held_requests{model_name="mock/model",engine="1"}`)).toBe(0);
  });

  test("refused without --role, in an SGLang encoding, or with --rank-ports", async () => {
    for (const extra of [{}, { role: "prefill" as const, eventEncoding: "sglang-map" as const }, { role: "prefill" as const, rankPorts: true }])
      await expect(startMockWorker({ ...common, listen: P, kvEvents: `tcp://${P}:0`, ...extra })).rejects.toBeInstanceOf(ConfigError);
  });
});
