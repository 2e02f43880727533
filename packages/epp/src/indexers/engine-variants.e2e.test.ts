// The EPP's index against a mock worker publishing newer engines' wire variants over real ZMTP (the
// worker's PUB, our SUB, the listener, live ingestion): vLLM's partial prefix-cache entries of a hybrid
// model and SGLang's EAGLE bigram token_ids. After each request the index's overlap for every prompt
// equals the worker's true hit, in the engine's own block size.
import { afterEach, expect, test } from "bun:test";
import { computeBlockHashes } from "@kv-epp/index-wasm";
import { findMatches } from "@kv-epp/index-wasm/helpers";
import { KvEventListener } from "@kv-epp/kv-events";
import { parseKvGroups, startMockWorker, type MockWorker, type MockWorkerOptions } from "@kv-epp/mock-worker";
import { workerKey, type WorkerRef } from "@kv-epp/protocol";
import { waitFor, LOOPBACK } from "@kv-epp/testkit";
import { createMetrics } from "../metrics.ts";
import { Indexers } from "./indexers.ts";

const cleanup: (() => Promise<unknown>)[] = [];
afterEach(async () => {
  for (const f of cleanup.splice(0).reverse()) await f();
});

const U = 4; // --block-size: vLLM's hash block (the prefix-match unit), SGLang's page
const w: WorkerRef = { workerId: "mock", dpRank: 0 };

async function counter(m: ReturnType<typeof createMetrics>, name: string, labels = ""): Promise<number> {
  const line = (await m.registry.metrics()).split("\n").find((l) => l.startsWith(`${name}${labels} `));
  return line ? Number(line.split(" ")[1]) : 0;
}

/** A worker, an EPP index of `blockSize` fed by a real listener, and the overlap on both sides. */
async function rig(opts: MockWorkerOptions, blockSize: number, k: number) {
  const worker: MockWorker = await startMockWorker({ port: 0, speed: 0, blockSize: U, capacityBlocks: 14, logLevel: "silent", ...opts });
  cleanup.push(() => worker.close());
  const metrics = createMetrics();
  const ixs = new Indexers(metrics);
  const ix = ixs.models.register("m", "default", blockSize);
  const listener = new KvEventListener({
    workerId: w.workerId, dpRank: 0, endpoint: worker.ranks[0]!.kvEvents,
    onDropped: (reason, n) => metrics.eventsDropped.inc({ reason }, n),
  });
  cleanup.push(() => listener.close());
  listener.attach((s) => ixs.live.apply("m:default", w, s));
  listener.start();
  // PUB drops what it sends before the subscription arrives: reset until the listener has seen a batch.
  await waitFor(async () => {
    await fetch(`${worker.url}/reset_prefix_cache`, { method: "POST" });
    return listener.counters.batches > 0;
  }, { message: "the listener's first batch" });
  const complete = (prompt: number[]) => fetch(`${worker.url}/v1/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ prompt, max_tokens: 1 }) });
  const cache = worker.ranks[0]!.cache;
  // The engine's hit in its own blocks of k hash blocks: block m while the hash at its last hash block is cached.
  const truth = (p: number[]) => {
    const ids = cache.blockIds(Uint32Array.from(p), { loraName: null, cacheSalt: null });
    const resident = cache.residentHashes();
    let m = 0;
    while ((m + 1) * k - 1 < ids.length && resident.has(ids[(m + 1) * k - 1]!.hash)) m++;
    return m;
  };
  const overlap = (p: number[]) => findMatches(ix.index, computeBlockHashes(Uint32Array.from(p), ix.blockSize)).scores.get(workerKey(w)) ?? 0;
  /** True when the index and the engine agree on every prompt; else throws what differs (waitFor reports it). */
  const agree = (ps: number[][]) => {
    const got = ps.map(overlap), want = ps.map(truth);
    if (got.some((g, i) => g !== want[i])) throw new Error(`index ${got} vs engine ${want}`);
    return true;
  };
  return { metrics, ixs, ix, listener, complete, truth, overlap, agree };
}

const stem = (n: number, from = 0) => Array.from({ length: n }, (_, i) => 1000 + from + i);
/** Prompts sharing stems, most ending inside a block, a few on a boundary; more blocks than the cache holds. */
const prompts = [stem(13), stem(21), [...stem(9), ...stem(7, 500)], stem(30), [...stem(16), ...stem(11, 900)], stem(17), stem(6, 300), stem(27, 40)];

test("vLLM hybrid model with --prefix-match-unit: partial entries never index nor set the block size; the index matches the engine after every request", async () => {
  const B = 2 * U; // the full-attention group's physical block
  const r = await rig({ listen: `${LOOPBACK}.2.41`, kvEvents: `tcp://${LOOPBACK}.2.41:0`, kvGroups: parseKvGroups(`full_attention:${B}`), partialEntries: true }, B, 2);
  // A warm-up shorter than one physical block: its only event is a partial entry.
  await r.complete(stem(6, 7000));
  await waitFor(async () => (await counter(r.metrics, "dynamo_epp_kv_events_ignored_total", '{reason="partial_entry"}')) > 0, { message: "the warm-up's partial entry" });
  for (const [i, p] of prompts.entries()) {
    await r.complete(p);
    await waitFor(() => r.agree(prompts), { message: `after request ${i}` });
  }
  expect(r.ix.blockSize).toBe(B);
  expect(prompts.some((p) => r.truth(p) > 0)).toBe(true);
  expect(await counter(r.metrics, "dynamo_epp_kv_block_size_mismatch_total")).toBe(0);
  expect(await counter(r.metrics, "dynamo_epp_kv_events_ignored_total", '{reason="partial_entry"}')).toBeGreaterThan(3);
  expect(r.listener.counters.skippedEvents).toBe(0);
  expect(r.ixs.live.rankInfo(w)).toMatchObject({ blockSize: B, blockSizeMismatch: false });
}, 30_000);

test("SGLang under EAGLE speculative decoding: bigram token_ids index as the plain tokens; nothing is dropped", async () => {
  const r = await rig({ listen: `${LOOPBACK}.2.42`, kvEvents: `tcp://${LOOPBACK}.2.42:0`, eventEncoding: "sglang-map", specBigram: true }, U, 1);
  // A prompt ending on a page boundary has no token after its last page: SGLang does not cache that page.
  const inside = prompts.filter((p) => p.length % U !== 0);
  for (const [i, p] of inside.entries()) {
    await r.complete(p);
    await waitFor(() => r.agree(inside), { message: `after request ${i}` });
  }
  expect(inside.some((p) => r.truth(p) > 1)).toBe(true);
  expect(r.listener.counters.skippedEvents).toBe(0);
  expect(await counter(r.metrics, "dynamo_epp_kv_events_dropped_total", '{reason="malformed"}')).toBe(0);
}, 30_000);
