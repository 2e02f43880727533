// Fields newer producers add that change what a store means to the index: vLLM's `ownership` (a
// secondary offloading tier's event, not the engine's cache) and TensorRT-LLM's `mm_keys` (which image a
// block of placeholder tokens holds).
import type { WorkerRef } from "@kv-epp/protocol";
import { expect, test } from "bun:test";
import { computeBlockHashes } from "@kv-epp/index-wasm";
import { findMatches } from "@kv-epp/index-wasm/helpers";
import type { KvEvent } from "@kv-epp/kv-events";
import { Indexers } from "./indexers.ts";
import { createMetrics } from "../metrics.ts";

const BS = 4;
const w: WorkerRef = { workerId: "w", dpRank: 0 };

function rig() {
  const metrics = createMetrics();
  const ixs = new Indexers(metrics);
  const ix = ixs.models.register("m", "default", BS);
  let seq = 0n;
  const apply = (events: KvEvent[]) => ixs.live.apply("m:default", w, { kind: "batch", seq: seq++, batch: { ts: 0, dataParallelRank: 0, events } });
  const overlap = (tokens: number[]) => findMatches(ix.index, computeBlockHashes(Uint32Array.from(tokens), BS)).scores.get("w\u00000") ?? 0;
  const counter = async (name: string, labels: string) => Number((await metrics.registry.metrics()).split("\n").find((l) => l.startsWith(`${name}${labels} `))?.split(" ")[1] ?? 0);
  return { ix, apply, overlap, counter };
}

test("a store or removal a secondary offloading tier published (ownership set) never touches the engine's blocks", async () => {
  const r = rig();
  const tokens = [1, 2, 3, 4];
  r.apply([{ type: "BlockStored", blockHashes: [1n], parentBlockHash: null, tokenIds: tokens, blockSize: BS, loraId: null, medium: "GPU", loraName: null }]);
  // Even one claiming GPU residency: its tier's copy, not the engine's prefix cache.
  r.apply([
    { type: "BlockStored", blockHashes: [2n], parentBlockHash: null, tokenIds: [5, 6, 7, 8], blockSize: BS, loraId: null, medium: "GPU", loraName: null, ownership: "tier-1" },
    { type: "BlockRemoved", blockHashes: [1n], medium: "GPU", ownership: "tier-1" },
  ]);
  expect(r.overlap(tokens)).toBe(1);
  expect(r.overlap([5, 6, 7, 8])).toBe(0);
  expect(await r.counter("dynamo_epp_kv_events_ignored_total", '{reason="offload_tier"}')).toBe(2);
});

test("TensorRT-LLM blocks of image placeholders are told apart by their mm_keys, never matched by plain tokens", () => {
  const r = rig();
  const placeholders = [9, 9, 9, 9];
  const store = (hash: bigint, image: string): KvEvent => ({
    type: "BlockStored", blockHashes: [hash], parentBlockHash: null, tokenIds: placeholders, blockSize: BS, loraId: null, medium: "GPU", loraName: null,
    mmKeys: [[{ hash: image, startOffset: 0, uuid: null }]],
  });
  r.apply([store(1n, "aaaa"), store(2n, "bbbb")]);
  expect(r.ix.index.stats().blocks).toBe(2);
  expect(r.overlap(placeholders)).toBe(0);
});
