// The mock's newer-engine wire variants as events, before any socket: vLLM's partial prefix-cache
// entries (--partial-entries) and SGLang's EAGLE bigram token_ids (--spec-bigram).
import { expect, test } from "bun:test";
import { decodeBatch, encodeBatch, EVENT_ENCODINGS, type BlockStored, type KvEvent } from "@kv-epp/kv-events";
import { engineKind } from "../src/config.ts";
import { parseKvGroups, PrefixCacheSim, RankEvents, startMockWorker } from "../src/index.ts";

const U = 4;
const tokens = (n: number, from = 0) => Uint32Array.from({ length: n }, (_, i) => 100 + from + i);

function rank(wire: { partialEntries?: boolean; specBigram?: boolean }, groups?: string) {
  const cache = new PrefixCacheSim({ blockSize: U, capacityBlocks: 64, runContext: true });
  const events = new RankEvents(U, wire.specBigram ? "sglang-map" : "vllm", groups ? parseKvGroups(groups) : undefined, wire);
  const out: KvEvent[][] = [];
  cache.subscribe((changes) => out.push(events.of(changes)));
  return { cache, out, chain: (t: Uint32Array) => cache.blockIds(t).map((b) => b.hash) };
}

test("a run ending inside a larger main-group block publishes vLLM's partial entry; completing the block promotes it", () => {
  const r = rank({ partialEntries: true }, `full_attention:${2 * U}`);
  const t = tokens(3 * U + 1); // hash blocks 0..2: group block 0 full, block 1 half
  const h = r.chain(t);
  const first = r.cache.acquire(t);
  expect(r.out.at(-1)).toEqual([
    expect.objectContaining({ type: "BlockStored", blockHashes: [h[1]], blockSize: 2 * U, groupIdx: 0 }),
    expect.objectContaining({ type: "BlockStored", blockHashes: [h[2]], parentBlockHash: h[1], tokenIds: Array.from(t.subarray(2 * U, 3 * U)), blockSize: U, groupIdx: 0, kvCacheSpecKind: "full_attention" }),
  ]);
  r.cache.release(first.lease);
  const longer = tokens(4 * U + 1); // the same prefix, now through group block 1
  r.cache.acquire(longer);
  const [removed, stored] = r.out.at(-1)!;
  expect(removed).toEqual({ type: "BlockRemoved", blockHashes: [h[2]!], medium: "GPU", groupIdx: 0 });
  expect(stored).toMatchObject({ type: "BlockStored", blockHashes: [r.chain(longer)[3]], parentBlockHash: h[1], blockSize: 2 * U });
});

test("SGLang bigram mode: a run's pages as (t, next) pairs; a page ending the prompt is not published", () => {
  const r = rank({ specBigram: true });
  const t = tokens(2 * U + 1);
  r.cache.acquire(t);
  const [ev] = r.out.at(-1)! as BlockStored[];
  expect(ev!.bigramNextTokenId).toBe(t[2 * U]);
  const wire = decodeBatch(encodeBatch({ ts: 0.5, events: [ev!], dataParallelRank: 0 }, { encoding: "sglang-map" }));
  expect(wire.events[0]).toMatchObject({ tokenIds: Array.from(t.subarray(0, 2 * U)), bigramNextTokenId: t[2 * U] });

  const onBoundary = tokens(2 * U, 50);
  r.cache.acquire(onBoundary);
  const [last] = r.out.at(-1)! as BlockStored[];
  expect(last!.blockHashes).toEqual([r.chain(onBoundary)[0]!]);
  expect(last!.bigramNextTokenId).toBe(onBoundary[U]);
});

test("the flags are refused where the engine they mimic would not publish them", async () => {
  await expect(startMockWorker({ port: 0, logLevel: "silent", specBigram: true })).rejects.toThrow(/sglang/);
  await expect(startMockWorker({ port: 0, logLevel: "silent", partialEntries: true })).rejects.toThrow(/--kv-groups/);
});

test("every event encoding publishes as its engine (engineKind): SGLang's stores never fill lora_id and carry the salt, vLLM's the reverse", () => {
  const change = { kind: "stored" as const, parent: null, hashes: [1n], tokenIds: [1, 2, 3, 4], extraKeys: [null], loraName: "ad", loraId: 7, cacheSalt: "t1" };
  for (const encoding of EVENT_ENCODINGS) {
    const [ev] = new RankEvents(U, encoding).of([change]) as BlockStored[];
    const sglang = engineKind({ eventEncoding: encoding }) === "sglang";
    expect([encoding, ev!.loraId, ev!.cacheSalt]).toEqual([encoding, sglang ? null : 7, sglang ? "t1" : undefined]);
  }
});
