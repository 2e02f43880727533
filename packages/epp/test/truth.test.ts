// The EPP's index against a mock worker's real cache (its GET /admin/cache), exactly: stores, shared
// prefixes, evictions and a cache reset on two DP ranks end in the same blocks, parents and tokens hashes.
import { afterAll, expect, test } from "bun:test";
import { startMockWorker, type CacheTruth } from "@kv-epp/mock-worker";
import { waitFor, LOOPBACK } from "@kv-epp/testkit";
import { compareIndexWithWorkers, waitForIndexToMatch } from "./kv-truth.ts";
import { BLOCK, postJson, startTestEpp, tokens } from "./helpers.ts";

const cleanups: (() => unknown)[] = [];
afterAll(async () => {
  for (const c of cleanups.reverse()) await c();
});

const WORKER_IP = `${LOOPBACK}.4.81`;

test("after live traffic the index equals the workers' caches, block for block", async () => {
  // Fixed ports: rank r publishes on 5557 + r, where the EPP's static config expects it.
  const w = await startMockWorker({ listen: WORKER_IP, port: 0, kvEvents: `tcp://${WORKER_IP}:5557`, speed: 0, blockSize: BLOCK, capacityBlocks: 40, dpSize: 2, logLevel: "silent" });
  cleanups.push(() => w.close());
  const epp = await startTestEpp([{ id: "mock", address: `${WORKER_IP}:8000`, kvEvents: `tcp://${WORKER_IP}:5557`, dpSize: 2 }]);
  cleanups.push(() => epp.stop({ graceMs: 200 }));
  const selection = `http://${LOOPBACK}.4.1:${epp.ports.selection}`;
  const complete = (prompt: number[], rank: number) =>
    fetch(`${w.url}/v1/completions`, { method: "POST", headers: { "content-type": "application/json", "x-data-parallel-rank": String(rank) }, body: JSON.stringify({ prompt, max_tokens: 1 }) });

  // What a PUB sends before a subscription arrives is lost (slow joiner): new prompts until the EPP
  // sees one on each rank, then a reset, so both sides start from an empty cache.
  for (const rank of [0, 1])
    await waitFor(async () => {
      const p = tokens(BLOCK, 1000 + Math.floor(Math.random() * 1e6));
      await complete(p, rank);
      await Bun.sleep(20);
      return (await postJson(`${selection}/score`, { token_ids: p })).body.scores.mock?.[String(rank)] === 1;
    }, { message: `the EPP subscribed to rank ${rank}` });
  await fetch(`${w.url}/reset_prefix_cache`, { method: "POST" });

  // Shared prefixes, repeats and far more blocks than the 40 each rank holds: evictions.
  for (let i = 0; i < 60; i++) {
    const shared = tokens(BLOCK * 2, i % 5);
    expect((await complete([...shared, ...tokens(BLOCK * 3 + 5, 100 + i)], i % 2)).status).toBe(200);
  }
  const d = await waitForIndexToMatch(selection, [{ id: "mock", url: w.url }]);
  expect(d.blocks).toBeGreaterThan(40);

  // The comparison fails when they differ: a block dropped from the index only is found.
  epp.indexers.models.lookup()!.index.clearWorker({ workerId: "mock", dpRank: 1 });
  const after = await compareIndexWithWorkers(selection, [{ id: "mock", url: w.url }]);
  expect(after.equal).toBe(false);
  const truth = (await (await fetch(`${w.url}/admin/cache`)).json()) as CacheTruth;
  expect(after.missing).toBe(truth.ranks[1]!.blocks.length);
});
