// selection-http shapes (docs/CONTRACTS.md §10): /score, /select (dry run), /workers, errors.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { waitFor, LOOPBACK } from "@kv-epp/testkit";
import type { EppHandle } from "../src/main.ts";
import { FakeWorkerEvents, HOST, MODEL, postJson, scrapeMetric, startTestEpp, tokens } from "./helpers.ts";

let ev: FakeWorkerEvents;
let epp: EppHandle;
const prompt = tokens(64, 7);
const url = (p: string) => `http://${HOST}:${epp.ports.selection}${p}`;

beforeAll(async () => {
  ev = await FakeWorkerEvents.start();
  epp = await startTestEpp([
    { id: "worker-a", address: `${LOOPBACK}.4.31:8000`, kvEvents: ev.endpoint },
    { id: "worker-b", address: `${LOOPBACK}.4.32:8000`, kvEvents: `tcp://${LOOPBACK}.4.32:1`, dpSize: 2 },
  ]);
  await waitFor(() => ev.pub.subscriberCount > 0);
  await ev.storeUntil(prompt, async () => (await postJson(url("/score"), { token_ids: prompt })).body.scores["worker-a"]?.["0"] === 4);
});
afterAll(async () => {
  await epp?.stop({ graceMs: 500 });
  await ev?.close();
});

test("POST /score reports overlap and tree sizes per worker and rank", async () => {
  const r = await postJson(url("/score"), { model: MODEL, token_ids: [...prompt, ...tokens(20, 8)] });
  expect(r.status).toBe(200);
  expect(r.body).toEqual({ block_size: 16, request_blocks: 5, scores: { "worker-a": { "0": 4 } }, tree_sizes: { "worker-a": { "0": 4 } } });
});

test("POST /select picks the overlapping worker and records no load", async () => {
  for (let i = 0; i < 3; i++) {
    const r = await postJson(url("/select"), { model: MODEL, token_ids: prompt });
    expect(r.status).toBe(200);
    expect(r.body).toEqual({
      endpoint: `${LOOPBACK}.4.31:8000`,
      worker_id: "worker-a",
      dp_rank: 0,
      overlap_blocks: 4,
      request_blocks: 4,
      scores: { "worker-a": { "0": 4 } },
    });
  }
  const text = await postJson(url("/select"), { prompt: "hello there" });
  expect(text.status).toBe(200);
  expect(["worker-a", "worker-b"]).toContain(text.body.worker_id);
});

test("GET /workers lists every rank with its connection state, blocks and in-flight load", async () => {
  const IDLE = {
    active_requests: 0,
    active_blocks: 0,
    sibling_requests: 0,
    sibling_blocks: 0,
    active_prefill_blocks: 0,
    sibling_prefill_blocks: 0,
    // No response seen yet: no accuracy, no TTFT, the latency model's priors.
    prediction: { samples: 0, mispredicted: 0, accuracy: null, mean_abs_error_tokens: null },
    observed_ttft_ms: null,
    latency_model: { base_ms: 10, ms_per_token: 0.1, ms_per_waiting: 50, samples: 0 },
  };
  const res = await fetch(url("/workers"));
  const list: unknown = await res.json();
  // A rank nothing was heard from has no cursor and no complete view; worker-a's depends on which of the
  // repeated publishes its subscription caught first (a view is complete only from seq 0).
  const SILENT = { cursor: null, baseline: null, complete: false, epoch: null, gaps: 0, replays: 0, replay_failures: 0, resets: 0, restarts: 0, handoff: null, handoff_skipped: 0 };
  const heard = { ...SILENT, cursor: expect.stringMatching(/^\d+$/), baseline: expect.stringMatching(/^\d+$/), complete: expect.any(Boolean) };
  // The block size and KV cache groups a rank's events showed (none: a silent rank; one group: no group_idx).
  const NO_EVENTS = { block_size: null, index_block_size: 16, block_size_mismatch: false, kv_groups: null };
  const SEEN = { block_size: 16, index_block_size: 16, block_size_mismatch: false, kv_groups: { main: null, groups: [] } };
  // Static workers whose /metrics has not failed (no scraping here): routable.
  const UP = { routable: true, failed_scrapes: 0 };
  // No role (a destination only): the pool is not disaggregated.
  const NO_ROLE = { role: null };
  expect(list).toEqual([
    { worker_id: "worker-a", dp_rank: 0, address: `${LOOPBACK}.4.31:8000`, kv_events: ev.endpoint, connected: true, blocks: 4, ...UP, ...NO_ROLE, ...SEEN, ...heard, ...IDLE },
    { worker_id: "worker-b", dp_rank: 0, address: `${LOOPBACK}.4.32:8000`, kv_events: `tcp://${LOOPBACK}.4.32:1`, connected: false, blocks: 0, ...UP, ...NO_ROLE, ...NO_EVENTS, ...SILENT, ...IDLE },
    { worker_id: "worker-b", dp_rank: 1, address: `${LOOPBACK}.4.32:8000`, kv_events: `tcp://${LOOPBACK}.4.32:2`, connected: false, blocks: 0, ...UP, ...NO_ROLE, ...NO_EVENTS, ...SILENT, ...IDLE },
  ]);
});

test("malformed bodies get 400 with a JSON error", async () => {
  const bad = await fetch(url("/score"), { method: "POST", body: "{nope" });
  expect(bad.status).toBe(400);
  expect(((await bad.json()) as { error: string }).error).toContain("not JSON");
  const wrong = await postJson(url("/score"), { token_ids: [1, -2] });
  expect(wrong.status).toBe(400);
  expect((await postJson(url("/score"), { prompt: "text" })).status).toBe(400);
});

test("bodies nested past the JSON depth limit get 400, counted per route; bodies past 32 MiB get 413", async () => {
  const metrics = `http://${HOST}:${epp.ports.metrics}`;
  const deep = `{"token_ids":${"[".repeat(100_000)}${"]".repeat(100_000)}}`;
  for (const route of ["score", "select"]) {
    const res = await fetch(url(`/${route}`), { method: "POST", body: deep });
    expect(res.status).toBe(400);
    expect(((await res.json()) as { error: string }).error).toContain("deeper than");
    expect(await scrapeMetric(metrics, `dynamo_epp_json_depth_refusals_total{where="${route}"}`)).toBe(1);
  }
  const huge = await fetch(url("/score"), { method: "POST", body: new Uint8Array(33 * 1024 * 1024).fill(0x20) });
  expect(huge.status).toBe(413);
  expect((await postJson(url("/score"), { token_ids: prompt })).body.scores["worker-a"]["0"]).toBe(4);
});

test("to SGLang workers (--chat-rendering sglang): /select picks a body with an extra_key by load, /score counts no blocks for it, and a lora_path names the identity scored", async () => {
  const sglangEv = await FakeWorkerEvents.start();
  const sglang = await startTestEpp(
    [
      { id: "held", address: `${LOOPBACK}.4.34:8000`, kvEvents: sglangEv.endpoint },
      { id: "empty", address: `${LOOPBACK}.4.35:8000`, kvEvents: `tcp://${LOOPBACK}.4.35:1` },
    ],
    { flags: ["--chat-rendering", "sglang"] },
  );
  const at = (p: string) => `http://${HOST}:${sglang.ports.selection}${p}`;
  try {
    await waitFor(() => sglangEv.pub.subscriberCount > 0);
    await sglangEv.storeUntil(prompt, async () => (await postJson(at("/score"), { token_ids: prompt })).body.scores.held?.["0"] === 4);
    const held = await postJson(at("/select"), { model: MODEL, token_ids: prompt });
    expect(held.body).toMatchObject({ worker_id: "held", overlap_blocks: 4, request_blocks: 4 });
    // Its own namespace: no worker's blocks are counted for it, its length still is.
    const namespaced = await postJson(at("/select"), { model: MODEL, token_ids: prompt, extra_key: "tenant-a" });
    expect(namespaced.body).toMatchObject({ overlap_blocks: 0, request_blocks: 4, scores: {} });
    expect((await postJson(at("/score"), { model: MODEL, token_ids: prompt, extra_key: "tenant-a" })).body).toMatchObject({ request_blocks: 4, scores: {} });
    // The blocks are the base model's: in the adapter's identity nothing matches.
    expect((await postJson(at("/score"), { model: MODEL, token_ids: prompt, lora_path: "sql" })).body.scores).toEqual({});
    expect((await postJson(at("/score"), { model: `${MODEL}:sql`, token_ids: prompt })).body.scores).toEqual({});
  } finally {
    await sglang.stop({ graceMs: 0 });
    await sglangEv.close();
  }
  // vLLM's workers read neither field.
  expect((await postJson(url("/select"), { model: MODEL, token_ids: prompt, extra_key: "tenant-a", lora_path: "sql" })).body.overlap_blocks).toBe(4);
});
