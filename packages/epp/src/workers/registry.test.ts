// WorkerRegistry.reconcile, rank by rank: a worker described differently (pod-only vs. with its
// attachment intents) but opening the same sources keeps its listeners and its blocks; only ranks whose
// source changed or went away are closed and cleared; address and metrics URL change in place.
import type { WorkerRef, WorkerSpec } from "@kv-epp/protocol";
import { afterEach, expect, test } from "bun:test";
import { waitFor, LOOPBACK } from "@kv-epp/testkit";
import type { KvIndex } from "@kv-epp/index-wasm";
import { Indexers } from "../indexers/indexers.ts";
import { createMetrics } from "../metrics.ts";
import { WorkerRegistry } from "./registry.ts";
import { BLOCK, FakeWorkerEvents, MODEL, quietLog, tokens } from "../../test/helpers.ts";

const KEY = `${MODEL}:default`;
const cleanup: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanup.splice(0).reverse()) await c();
});

async function setup() {
  const indexers = new Indexers(createMetrics());
  const ix = indexers.models.register(MODEL, "default", BLOCK);
  const removed: WorkerRef[] = [];
  const reg = new WorkerRegistry({
    topic: "",
    log: quietLog,
    onRemoved: (w) => {
      removed.push(w);
      indexers.removeWorker(w);
    },
  });
  reg.attach((w, s) => indexers.live.apply(KEY, w, s));
  cleanup.push(() => reg.close());
  const pubs = await Promise.all([FakeWorkerEvents.start(`${LOOPBACK}.4.20`), FakeWorkerEvents.start(`${LOOPBACK}.4.20`)]);
  for (const p of pubs) cleanup.push(() => p.close());
  const blocksOf = (dpRank: number) => residency(ix.index, { workerId: "w", dpRank });
  return { reg, removed, pubs, blocksOf };
}

/** Blocks the index holds for one worker rank (from its dump). */
function residency(index: KvIndex, w: WorkerRef): number {
  let n = 0;
  for (const d of index.dump()) if (d.worker.workerId === w.workerId && d.worker.dpRank === w.dpRank) n += d.blocks.length;
  return n;
}

function podSpec(kv: string[], address = `${LOOPBACK}.4.20:8000`): WorkerSpec {
  // Pod discovery's view: one rank on the kvEvents endpoint (no `ranks`). Two ephemeral ports are not
  // port + r, so a two-rank worker states its ranks, without topics.
  const base = { id: "w", address, kvEvents: kv[0]!, dpSize: kv.length, metricsUrl: `http://${address}/metrics` };
  return kv.length === 1 ? base : { ...base, ranks: kv.map((e, r) => ({ dpRank: r, kvEvents: e })) };
}

function intentSpec(kv: string[], address = `${LOOPBACK}.4.20:8000`): WorkerSpec {
  // The same worker as mergeWorkerSets hands it over once its intents are live: topic and block size stated.
  return { ...podSpec(kv, address), ranks: kv.map((e, r) => ({ dpRank: r, kvEvents: e, topic: "", blockSize: BLOCK }) as never) };
}

async function indexBoth(pubs: FakeWorkerEvents[], blocksOf: (r: number) => number, seed: number): Promise<void> {
  for (const [r, p] of pubs.entries()) await p.storeUntil(tokens(4 * BLOCK, seed + r), () => blocksOf(r) >= 4);
}

test("a pod-only worker and the same worker with its intent are one worker: no drop either way", async () => {
  const { reg, removed, pubs, blocksOf } = await setup();
  reg.reconcile([podSpec([pubs[0]!.endpoint])]);
  await pubs[0]!.storeUntil(tokens(5 * BLOCK, 50), () => blocksOf(0) >= 5);
  reg.reconcile([intentSpec([pubs[0]!.endpoint])]);
  reg.reconcile([podSpec([pubs[0]!.endpoint])]);
  expect(removed).toEqual([]);
  expect(blocksOf(0)).toBe(5);
});

test("the same sources described by intents keep the listeners and their blocks", async () => {
  const { reg, removed, pubs, blocksOf } = await setup();
  const kv = pubs.map((p) => p.endpoint);
  reg.reconcile([podSpec(kv)]);
  await indexBoth(pubs, blocksOf, 1);
  const before = [blocksOf(0), blocksOf(1)];

  reg.reconcile([intentSpec(kv)]); // the intents appear
  reg.reconcile([podSpec(kv)]); // and go away again (a deleted Lease)
  expect(removed).toEqual([]);
  expect([blocksOf(0), blocksOf(1)]).toEqual(before);
  expect(reg.candidates().map((c) => c.key).sort()).toEqual(["w\u00000", "w\u00001"]);

  // The kept listeners still deliver: new blocks land on top of the old ones.
  await pubs[0]!.storeUntil(tokens(2 * BLOCK, 99), () => blocksOf(0) >= before[0]! + 2);
});

test("only the rank whose source changed is closed and cleared; address moves in place", async () => {
  const { reg, removed, pubs, blocksOf } = await setup();
  const kv = pubs.map((p) => p.endpoint);
  reg.reconcile([podSpec(kv)]);
  await indexBoth(pubs, blocksOf, 10);
  const rank0 = blocksOf(0);

  const other = await FakeWorkerEvents.start(`${LOOPBACK}.4.21`);
  cleanup.push(() => other.close());
  reg.reconcile([intentSpec([kv[0]!, other.endpoint], `${LOOPBACK}.4.21:8000`)]);
  expect(removed).toEqual([{ workerId: "w", dpRank: 1 }]);
  expect(blocksOf(0)).toBe(rank0);
  expect(blocksOf(1)).toBe(0);
  expect(reg.candidates().map((c) => c.endpoint)).toEqual([`${LOOPBACK}.4.21:8000`, `${LOOPBACK}.4.21:8000`]);
  expect(reg.specs()[0]!.metricsUrl).toBe(`http://${LOOPBACK}.4.21:8000/metrics`);

  // The new rank-1 listener follows the new source; a topic change replaces rank 0 only.
  await other.storeUntil(tokens(3 * BLOCK, 20), () => blocksOf(1) >= 3);
  const ranks = [
    { dpRank: 0, kvEvents: kv[0]!, topic: "other" },
    { dpRank: 1, kvEvents: other.endpoint },
  ];
  reg.reconcile([{ ...intentSpec([kv[0]!, other.endpoint], `${LOOPBACK}.4.21:8000`), ranks }]);
  expect(removed).toEqual([{ workerId: "w", dpRank: 1 }, { workerId: "w", dpRank: 0 }]);
  expect(blocksOf(1)).toBeGreaterThanOrEqual(3);

  // A rank that goes away is closed and cleared; the worker stays.
  reg.reconcile([{ ...podSpec([kv[0]!], `${LOOPBACK}.4.21:8000`), ranks: [ranks[0]!] }]);
  expect(removed.at(-1)).toEqual({ workerId: "w", dpRank: 1 });
  expect(blocksOf(1)).toBe(0);
  expect(reg.candidates().map((c) => c.key)).toEqual(["w\u00000"]);
});

test("a worker that leaves has every rank closed and cleared", async () => {
  const { reg, removed, pubs, blocksOf } = await setup();
  reg.reconcile([podSpec(pubs.map((p) => p.endpoint))]);
  await indexBoth(pubs, blocksOf, 30);
  reg.reconcile([]);
  expect(removed).toEqual([{ workerId: "w", dpRank: 0 }, { workerId: "w", dpRank: 1 }]);
  expect([blocksOf(0), blocksOf(1)]).toEqual([0, 0]);
  expect(reg.candidates()).toEqual([]);
});

test("a worker marked down leaves the candidates but keeps its blocks while its KV publisher is connected; they go when it is gone", async () => {
  const { reg, removed, pubs, blocksOf } = await setup();
  reg.reconcile([podSpec(pubs.map((p) => p.endpoint))]);
  await indexBoth(pubs, blocksOf, 31);
  reg.markDown("w"); // /metrics failing, publisher still up: a busy server, not a dead one
  expect(reg.candidates()).toEqual([]);
  expect(removed).toEqual([]);
  expect([blocksOf(0), blocksOf(1)]).toEqual([4, 4]);
  await Promise.all(pubs.map((p) => p.close()));
  await waitFor(() => !reg.connected("w", 0) && !reg.connected("w", 1), { message: "listeners see the publishers gone" });
  reg.markDown("w"); // the next failed scrape
  expect(removed).toEqual([{ workerId: "w", dpRank: 0 }, { workerId: "w", dpRank: 1 }]);
  expect([blocksOf(0), blocksOf(1)]).toEqual([0, 0]);
  reg.markUp("w");
  expect(reg.candidates().map((c) => c.dpRank)).toEqual([0, 1]);
});

test("a worker whose endpoint no listener can open is logged and skipped; the others still apply, nothing half-open", async () => {
  const { reg, pubs } = await setup();
  // Rank 0 is fine (a live publisher), rank 1 is not an endpoint at all.
  const bad = { id: "bad", address: `${LOOPBACK}.4.21:8000`, kvEvents: pubs[1]!.endpoint, dpSize: 2, ranks: [{ dpRank: 0, kvEvents: pubs[1]!.endpoint }, { dpRank: 1, kvEvents: `${LOOPBACK}.4.21:5558` }] } as WorkerSpec;
  expect(() => reg.reconcile([bad, podSpec([pubs[0]!.endpoint])])).not.toThrow();
  expect(reg.specs().map((s) => s.id)).toEqual(["w"]);
  expect(reg.candidates().map((c) => c.workerId)).toEqual(["w"]);
  await waitFor(() => pubs[0]!.pub.subscriberCount === 1, { message: "the good worker subscribed" });
  await Bun.sleep(200);
  expect(pubs[1]!.pub.subscriberCount).toBe(0); // the bad worker's rank-0 listener was closed again
});
