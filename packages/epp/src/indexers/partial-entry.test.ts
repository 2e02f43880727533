// vLLM's partial prefix-cache entries (partial-entry.ts) through live ingestion: never indexed, never a
// block size, counted; the full blocks around them index as usual in either arrival order.
import type { WorkerRef } from "@kv-epp/protocol";
import { expect, test } from "bun:test";
import { computeBlockHashes } from "@kv-epp/index-wasm";
import { findMatches } from "@kv-epp/index-wasm/helpers";
import type { BlockStored, KvEvent } from "@kv-epp/kv-events";
import { Indexers } from "./indexers.ts";
import { createMetrics } from "../metrics.ts";

const B = 8; // the full-attention group's physical block size
const U = 4; // --prefix-match-unit
const w: WorkerRef = { workerId: "w", dpRank: 0 };
const prompt = Array.from({ length: 2 * B + U }, (_, i) => 100 + i); // two full blocks and one unit into the third

async function counter(m: ReturnType<typeof createMetrics>, name: string, labels = ""): Promise<number> {
  const line = (await m.registry.metrics()).split("\n").find((l) => l.startsWith(`${name}${labels} `));
  return line ? Number(line.split(" ")[1]) : 0;
}

function store(hashes: bigint[], parent: bigint | null, tokenIds: number[], blockSize: number): BlockStored {
  return { type: "BlockStored", blockHashes: hashes, parentBlockHash: parent, tokenIds, blockSize, loraId: null, medium: "GPU", loraName: null, extraKeys: hashes.map(() => null), groupIdx: 0, kvCacheSpecKind: "full_attention" };
}

// What vLLM publishes for `prompt` (block_pool.py): the hashes are the u-granularity prefix chain h1..h5;
// a full block's hash is the one at its last unit boundary, the partial entry's the one at the tail.
const full = store([0x2n, 0x4n], null, prompt.slice(0, 2 * B), B);
const partial = store([0x5n], 0x4n, prompt.slice(2 * B, 2 * B + U), U);
// A warm-up or health check shorter than one block: its only entry is partial, parent none.
const warmup = store([0x9n], null, [1, 2, 3, 4], U);

function ingest(events: KvEvent[][]) {
  const metrics = createMetrics();
  const ixs = new Indexers(metrics);
  const ix = ixs.models.register("m", "default", B);
  events.forEach((evs, seq) => ixs.live.apply("m:default", w, { kind: "batch", seq: BigInt(seq), batch: { ts: 0, dataParallelRank: 0, events: evs } }));
  const overlap = (tokens: number[]) => findMatches(ix.index, computeBlockHashes(Uint32Array.from(tokens), ix.blockSize)).scores.get("w\u00000") ?? 0;
  return { metrics, ixs, ix, overlap };
}

test("a partial entry arriving first never defines the block size: the full blocks after it index", async () => {
  const { metrics, ixs, ix, overlap } = ingest([[warmup], [full, partial]]);
  expect(ix.blockSize).toBe(B);
  expect(overlap(prompt)).toBe(2);
  expect(await counter(metrics, "dynamo_epp_kv_events_ignored_total", '{reason="partial_entry"}')).toBe(2);
  expect(await counter(metrics, "dynamo_epp_kv_block_size_mismatch_total")).toBe(0);
  expect(ixs.live.rankInfo(w)).toMatchObject({ blockSize: B, blockSizeMismatch: false, kvGroups: { main: 0, groups: [{ group_idx: 0, block_size: B }] } });
});

test("in the good order a partial entry is counted as such, not as a block size mismatch", async () => {
  const { metrics, ixs, overlap } = ingest([[full], [partial]]);
  expect(overlap(prompt)).toBe(2);
  expect(await counter(metrics, "dynamo_epp_kv_events_rejected_total", '{reason="block_size"}')).toBe(0);
  expect(await counter(metrics, "dynamo_epp_kv_block_size_mismatch_total")).toBe(0);
  expect(await counter(metrics, "dynamo_epp_kv_events_ignored_total", '{reason="partial_entry"}')).toBe(1);
  expect(ixs.live.rankInfo(w)!.blockSizeMismatch).toBe(false);
});

test("a configured size above the workers' still gives way to their first multi-block store, a partial entry before it aside", async () => {
  const metrics = createMetrics();
  const ixs = new Indexers(metrics);
  const ix = ixs.models.register("m", "default", 4 * B); // configured wrong: 32
  ixs.live.apply("m:default", w, { kind: "batch", seq: 0n, batch: { ts: 0, dataParallelRank: 0, events: [warmup, full] } });
  expect(ix.blockSize).toBe(B);
  expect(findMatches(ix.index, computeBlockHashes(Uint32Array.from(prompt), B)).scores.get("w\u00000")).toBe(2);
});

test("the partial entry's removal (promotion to a full block, or eviction) leaves the index as it was", () => {
  const { ixs, overlap } = ingest([[full, partial]]);
  ixs.live.apply("m:default", w, { kind: "batch", seq: 5n, batch: { ts: 0, dataParallelRank: 0, events: [{ type: "BlockRemoved", blockHashes: [0x5n], medium: "GPU", groupIdx: 0 }] } });
  expect(overlap(prompt)).toBe(2);
});

test("a one-token store (SGLang's --page-size 1, a single-token radix node) is refused as another block size, not a partial entry", async () => {
  const metrics = createMetrics();
  const errors: string[] = [];
  const ixs = new Indexers(metrics, { error: (_: unknown, msg: string) => errors.push(msg), warn: () => {}, info: () => {} } as unknown as import("pino").Logger);
  ixs.models.register("m", "default", B);
  const oneToken: BlockStored = { type: "BlockStored", blockHashes: [0x7n], parentBlockHash: null, tokenIds: [42], blockSize: 1, loraId: null, medium: "GPU" };
  ixs.live.apply("m:default", w, { kind: "batch", seq: 0n, batch: { ts: 0, dataParallelRank: 0, events: [oneToken] } });
  expect(await counter(metrics, "dynamo_epp_kv_events_ignored_total", '{reason="partial_entry"}')).toBe(0);
  expect(await counter(metrics, "dynamo_epp_kv_events_rejected_total", '{reason="block_size"}')).toBe(1);
  expect(await counter(metrics, "dynamo_epp_kv_block_size_mismatch_total")).toBe(1);
  expect(ixs.live.rankInfo(w)).toMatchObject({ blockSize: 1, blockSizeMismatch: true });
  expect(errors).toHaveLength(1);
  expect(errors[0]).toContain("one-token KV blocks");
});
