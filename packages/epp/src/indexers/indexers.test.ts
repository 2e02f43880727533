// Indexers through the batch builder: listener batches (GPU only, partial blocks, unknown parents
// counted as rejected) and recovery staging in batches (same index as one applyStored per event).
import type { RouterEvent, WorkerRef } from "@kv-epp/protocol";
import { expect, test } from "bun:test";
import { computeBlockHashes, KvIndex } from "@kv-epp/index-wasm";
import { applyRemoved, applyStored, findMatches } from "@kv-epp/index-wasm/helpers";
import type { KvEvent } from "@kv-epp/kv-events";
import { dumpBinaryChunks, dumpBodyParser, dumpChunks, stageEvents } from "@kv-epp/recovery";
import { Indexers } from "./indexers.ts";
import { presizeFor } from "./recovery-target.ts";
import { createMetrics } from "../metrics.ts";

const BS = 4;
const w: WorkerRef = { workerId: "w", dpRank: 0 };

async function counter(m: ReturnType<typeof createMetrics>, name: string, labels = ""): Promise<number> {
  const text = await m.registry.metrics();
  const line = text.split("\n").find((l) => l.startsWith(`${name}${labels} `));
  return line ? Number(line.split(" ")[1]) : 0;
}

function stored(hashes: bigint[], parent: bigint | null, tokenIds: number[], medium: string | null = null): KvEvent {
  return { type: "BlockStored", blockHashes: hashes, parentBlockHash: parent, tokenIds, blockSize: BS, loraId: null, medium };
}

test("listener batches: applied, CPU skipped, partial blocks and unknown parents counted", async () => {
  const metrics = createMetrics();
  const ixs = new Indexers(metrics);
  const ix = ixs.models.register("m", "default", BS);
  const ids = Array.from({ length: 10 }, (_, i) => i + 1); // two full blocks and a partial one
  ixs.live.apply("m:default", w, {
    kind: "batch",
    seq: 0n,
    batch: {
      ts: 0,
      dataParallelRank: 0,
      events: [
        stored([11n, 12n, 13n], null, ids), // 3 hashes, 2 full blocks: partial_block
        stored([21n], null, [7, 7, 7, 7], "CPU"), // medium
        stored([31n], 999n, [5, 5, 5, 5]), // unknown parent: rejected by the index
        stored([41n], null, [8, 8, 8, 8], "gpu"), // medium compares case-insensitively: applied
        { type: "BlockStored", blockHashes: [51n, 52n], parentBlockHash: null, tokenIds: [], blockSize: 0, loraId: null, medium: "CPU" }, // placeholder
        { type: "BlockRemoved", blockHashes: [12n], medium: null },
      ],
    },
  });
  const m = findMatches(ix.index, computeBlockHashes(Uint32Array.from(ids.slice(0, 8)), BS));
  expect(m.scores.get("w\u00000")).toBe(1); // block 2 removed
  expect(findMatches(ix.index, computeBlockHashes(Uint32Array.of(8, 8, 8, 8), BS)).scores.get("w\u00000")).toBe(1);
  expect(await counter(metrics, "dynamo_epp_kv_events_applied_total")).toBe(3);
  expect(await counter(metrics, "dynamo_epp_kv_events_ignored_total", '{reason="placeholder"}')).toBe(1);
  expect(await counter(metrics, "dynamo_epp_kv_events_rejected_total", '{reason="index"}')).toBe(1);
  expect(await counter(metrics, "dynamo_epp_kv_events_rejected_total", '{reason="medium"}')).toBe(1);
  expect(await counter(metrics, "dynamo_epp_kv_events_rejected_total", '{reason="partial_block"}')).toBe(1);

  ixs.live.apply("m:default", w, { kind: "batch", seq: 1n, batch: { ts: 0, dataParallelRank: 0, events: [{ type: "AllBlocksCleared" }] } });
  expect(ix.index.stats().residencies).toBe(0);
});

test("a main-group store naming fewer blocks than its token_ids span is not paired with tokens from the head", async () => {
  // vLLM's cache_full_blocks leaves out of block_hashes the blocks it skips (null blocks, blocks cached
  // already) while token_ids still span the whole run, and no field says which blocks are left out.
  const metrics = createMetrics();
  const ixs = new Indexers(metrics);
  const ix = ixs.models.register("m", "default", BS);
  const ids = Array.from({ length: 12 }, (_, i) => i + 1); // 3 blocks of tokens, 2 hashes: block 1 or 2 left out
  ixs.live.apply("m:default", w, {
    kind: "batch",
    seq: 0n,
    batch: { ts: 0, dataParallelRank: 0, events: [{ ...stored([11n, 13n], null, ids), groupIdx: 0, kvCacheSpecKind: "full_attention" } as KvEvent] },
  });
  // Paired from the head, block 1's tokens would be named by hash 13 (block 2's).
  expect(findMatches(ix.index, computeBlockHashes(Uint32Array.from(ids), BS)).scores.get("w\u00000")).toBeUndefined();
  expect(ix.index.stats().residencies).toBe(0);
  expect(await counter(metrics, "dynamo_epp_kv_events_rejected_total", '{reason="unaligned"}')).toBe(1);
});

test("recovery staging in batches builds the same index as one applyStored per event; abort leaves nothing", () => {
  const events: RouterEvent[] = [];
  let id = 0;
  // 3 workers x 200 chains of 3 blocks, children after parents: > STAGING_BATCH events per model.
  for (let c = 0; c < 200; c++)
    for (let r = 0; r < 3; r++) {
      let parent: bigint | null = null;
      for (let d = 0; d < 3; d++) {
        const h = BigInt(c * 1000 + d * 10 + r + 1) | (1n << 63n);
        events.push({ workerId: `w${r}`, dpRank: 0, eventId: id++, parentHash: parent, blocks: [{ blockHash: h, tokensHash: BigInt(c * 100 + d) }] });
        parent = h;
      }
    }
  const reference = KvIndex.create({ blockSize: BS });
  for (const e of events)
    applyStored(reference, { workerId: e.workerId, dpRank: e.dpRank }, e.parentHash, e.blocks.map((b) => ({ blockHash: b.blockHash, tokensHash: b.tokensHash })));

  const ixs = new Indexers(createMetrics());
  ixs.models.register("m", "default", BS);
  const aborted = ixs.recovery.begin();
  stageEvents(aborted, "m:default", BS, events);
  aborted.abort();
  expect(ixs.models.get("m:default")!.index.stats().residencies).toBe(0);

  const staging = ixs.recovery.begin();
  stageEvents(staging, "m:default", BS, events);
  staging.commit();
  const got = ixs.models.get("m:default")!.index;
  expect(got.stats().residencies).toBe(reference.stats().residencies);
  expect(got.stats().residencies).toBe(events.length);
  expect([...got.dump()]).toEqual([...reference.dump()]);
});

test("recovery staging keeps a dump's copy counts, zero-copy records on held paths included", () => {
  // a peer whose worker holds block 1 twice, and block 3 below a block 2 it lost (kept with 0 copies)
  const peer = KvIndex.create({ blockSize: BS });
  const blocks = [1n, 2n, 3n].map((h) => ({ blockHash: h | (1n << 63n), tokensHash: h * 7n }));
  applyStored(peer, w, null, blocks);
  applyStored(peer, w, null, blocks.slice(0, 1));
  applyRemoved(peer, w, [blocks[1]!.blockHash]);
  const dump = [...peer.dump()];
  expect(dump[0]!.blocks.map((b) => b.copies ?? 1)).toEqual([2, 0, 1]);
  const ixs = new Indexers(createMetrics());
  ixs.models.register("m", "default", BS);
  const staging = ixs.recovery.begin();
  let id = 0;
  stageEvents(staging, "m:default", BS, dump.map((e) => ({
    workerId: e.worker.workerId, dpRank: e.worker.dpRank, eventId: id++, parentHash: e.parentHash,
    blocks: e.blocks.map((b) => ({ blockHash: b.blockHash, tokensHash: b.tokensHash, ...(b.copies === undefined ? {} : { copies: b.copies }) })),
  })));
  staging.commit();
  const got = ixs.models.get("m:default")!.index;
  expect([...got.dump()]).toEqual(dump);
  // the recovered replica drops block 1 at the same removal as its peer: the second one
  expect(applyRemoved(got, w, [blocks[0]!.blockHash])).toEqual({ kind: "applied", blocks: 0, unknown: 0 });
  expect(applyRemoved(got, w, [blocks[0]!.blockHash])).toEqual({ kind: "applied", blocks: 1, unknown: 0 });
});

test("once the index holds blocks, events and a peer's dump of another block size are rejected (counted as block_size), not indexed unmatchable", async () => {
  const metrics = createMetrics();
  const ixs = new Indexers(metrics);
  const ix = ixs.models.register("m", "default", BS);
  ixs.live.apply("m:default", w, { kind: "batch", seq: 0n, batch: { ts: 0, dataParallelRank: 0, events: [stored([40n], null, [9, 9, 9, 9])] } });
  const r1: WorkerRef = { workerId: "w", dpRank: 1 };
  const other: KvEvent = { ...stored([41n], null, [1, 2, 3, 4, 5, 6, 7, 8]), blockSize: 8 } as KvEvent;
  ixs.live.apply("m:default", r1, { kind: "batch", seq: 0n, batch: { ts: 0, dataParallelRank: 1, events: [other] } });
  expect(ix.index.stats().residencies).toBe(1);
  expect(await counter(metrics, "dynamo_epp_kv_events_rejected_total", '{reason="block_size"}')).toBe(1);
  expect(await counter(metrics, "dynamo_epp_kv_block_size_mismatch_total")).toBe(1);
  expect(ixs.live.rankInfo(r1)).toMatchObject({ blockSize: 8, blockSizeMismatch: true });
  expect(ixs.live.rankInfo(w)).toMatchObject({ blockSize: BS, blockSizeMismatch: false });

  // A dump of another block size fails its attempt (so recovery tries the next peer), not "recovered".
  const staging = ixs.recovery.begin();
  expect(() => stageEvents(staging, "m:default", 8, [{ workerId: "w", dpRank: 0, eventId: 0, parentHash: null, blocks: [{ blockHash: 1n, tokensHash: 7n }] }])).toThrow(/block size/);
  staging.abort();
  expect(ixs.models.get("m:default")!.index.stats().residencies).toBe(1); // what live events indexed stays
  expect(await counter(metrics, "dynamo_epp_kv_events_rejected_total", '{reason="block_size"}')).toBe(2);
  // Within one dump, a model's block size cannot change either (a repeated key).
  ixs.models.register("n", "default", 16);
  const twice = ixs.recovery.begin();
  stageEvents(twice, "n:default", 16, [{ workerId: "w", dpRank: 0, eventId: 0, parentHash: null, blocks: [{ blockHash: 1n, tokensHash: 7n }] }]);
  expect(() => stageEvents(twice, "n:default", 32, [{ workerId: "w", dpRank: 0, eventId: 1, parentHash: null, blocks: [{ blockHash: 2n, tokensHash: 7n }] }])).toThrow(/block size/);
  twice.abort();
});

test("a replica that holds nothing recovers a peer's dump of another block size with the peer's size (the configured one was wrong), loudly", async () => {
  // The peer learned the workers' size (8) from their events; this replica only has the configured 4.
  const peer = new Indexers(createMetrics());
  peer.models.register("m", "default", BS);
  const ids = [1, 2, 3, 4, 5, 6, 7, 8];
  peer.live.apply("m:default", w, { kind: "batch", seq: 0n, batch: { ts: 0, dataParallelRank: 0, events: [{ ...stored([81n], null, ids), blockSize: 8 } as KvEvent] } });
  expect(peer.models.get("m:default")!.blockSize).toBe(8);
  const metrics = createMetrics();
  const errors: unknown[] = [];
  const joiner = new Indexers(metrics, { error: (o: unknown) => errors.push(o), warn: () => {}, info: () => {} } as unknown as import("pino").Logger);
  const ix = joiner.models.register("m", "default", BS);
  const staging = joiner.recovery.begin();
  const parser = dumpBodyParser(staging, "json");
  parser.push(Buffer.concat([...dumpChunks(peer.recovery)]));
  parser.end();
  staging.commit();
  expect(ix.blockSize).toBe(8);
  expect(findMatches(ix.index, computeBlockHashes(Uint32Array.from(ids), 8)).scores.get("w\u00000")).toBe(1);
  expect(await counter(metrics, "dynamo_epp_kv_block_size_mismatch_total")).toBe(1);
  expect(errors).toEqual([{ model: "m:default", configured: BS, peer: 8 }]);
  // Live events of that size continue it.
  joiner.live.apply("m:default", w, { kind: "batch", seq: 1n, batch: { ts: 0, dataParallelRank: 0, events: [{ ...stored([82n], 81n, [9, 10, 11, 12, 13, 14, 15, 16]), blockSize: 8 } as KvEvent] } });
  expect(findMatches(ix.index, computeBlockHashes(Uint32Array.from({ length: 16 }, (_, i) => i + 1), 8)).scores.get("w\u00000")).toBe(2);
});

test("an index whose module trapped is replaced by an empty one (counted), and routing reads the new one", async () => {
  const metrics = createMetrics();
  const ixs = new Indexers(metrics);
  const ix = ixs.models.register("m", "default", BS);
  ixs.live.apply("m:default", w, { kind: "batch", seq: 0n, batch: { ts: 0, dataParallelRank: 0, events: [stored([11n], null, [1, 2, 3, 4])] } });
  const trapping = ix.index;
  // Trap the module (an event kind it does not know, as an out-of-memory grow would).
  const inner = trapping as unknown as { applyWords(p: number, w: number): unknown; ex: { reserve(n: number): number; memory: WebAssembly.Memory } };
  const p = inner.ex.reserve(8);
  new BigUint64Array(inner.ex.memory.buffer, p, 1)[0] = 9n;
  expect(() => inner.applyWords(p, 1)).toThrow(WebAssembly.RuntimeError);
  expect(trapping.trapped).toBe(true);
  const fresh = ixs.models.lookup("m")!.index;
  expect(fresh).not.toBe(trapping);
  expect(fresh.stats().residencies).toBe(0);
  expect(await counter(metrics, "dynamo_epp_kv_index_traps_total")).toBe(1);
  ixs.live.apply("m:default", w, { kind: "batch", seq: 1n, batch: { ts: 0, dataParallelRank: 0, events: [stored([12n], null, [5, 6, 7, 8])] } });
  expect(ixs.models.get("m:default")!.index.stats().residencies).toBe(1);
});

test("adapters: configured or learned from lora_name resolve to their base model's index in their identity; unknown names fall back, logged once", () => {
  const warned: unknown[] = [];
  const log = { warn: (o: unknown) => warned.push(o), info: () => {} } as unknown as import("pino").Logger;
  const ixs = new Indexers(createMetrics(), log);
  const ix = ixs.models.register("m", "default", BS);
  ixs.models.registerAdapter("sql", "m");
  expect(ixs.models.resolve("sql")).toEqual({ indexer: ix, loraName: "sql" });
  expect(ixs.models.resolve("chat")).toEqual({ indexer: ix, loraName: null });
  ixs.live.apply("m:default", w, {
    kind: "batch", seq: 0n,
    batch: { ts: 0, dataParallelRank: 0, events: [{ ...stored([1n], null, [1, 2, 3, 4]), loraName: "chat", extraKeys: [["chat"]] } as KvEvent] },
  });
  expect(ixs.models.resolve("chat")).toEqual({ indexer: ix, loraName: "chat" });
  expect(ixs.models.adapterOf("chat")).toBe("chat");
  expect(ixs.models.adapterOf("m")).toBeNull();
  // The adapter's block is found in the adapter's identity only.
  expect(findMatches(ix.index, computeBlockHashes(Uint32Array.of(1, 2, 3, 4), BS, [["chat"]])).scores.get("w\u00000")).toBe(1);
  expect(findMatches(ix.index, computeBlockHashes(Uint32Array.of(1, 2, 3, 4), BS)).scores.get("w\u00000")).toBeUndefined();
  ixs.models.resolve("nope");
  ixs.models.resolve("nope");
  expect(warned).toEqual([{ model: "chat", fallback: "m:default" }, { model: "nope", fallback: "m:default" }]); // chat: before it was learned
});

test("SGLang's rules: a served model's \"<base>:<adapter>\" is scored on the base's index in the adapter's identity; vLLM's read it as a name", () => {
  const ixs = new Indexers(createMetrics());
  const ix = ixs.models.register("m", "default", BS);
  const other = ixs.models.register("n", "default", BS);
  ixs.models.readAdaptersAs("sglang");
  // Split at the first colon and trimmed, as SGLang's _parse_model_parameter; the adapter need not be known here.
  expect(ixs.models.resolve("n:sql")).toEqual({ indexer: other, loraName: "sql" });
  expect(ixs.models.resolve(" m : a:b ")).toEqual({ indexer: ix, loraName: "a:b" });
  expect(ixs.models.adapterOf("n:sql")).toBe("sql");
  // No adapter after the colon: the base model itself; a base SGLang does not serve (it answers 404): the default.
  expect(ixs.models.resolve("n:")).toEqual({ indexer: other, loraName: null });
  expect(ixs.models.resolve("x:sql")).toEqual({ indexer: ix, loraName: null });
  expect(ixs.models.adapterOf("x:sql")).toBeNull();
  ixs.models.readAdaptersAs("vllm");
  expect(ixs.models.resolve("n:sql")).toEqual({ indexer: ix, loraName: null });
  expect(ixs.models.adapterOf("n:sql")).toBeNull();
});

test("a rank the index sees above its capacity is reset and counted; other ranks keep their blocks", async () => {
  const metrics = createMetrics();
  const ixs = new Indexers(metrics, undefined, { rankCapacity: (r) => (r.dpRank === 0 ? 5 : undefined) });
  const ix = ixs.models.register("m", "default", BS);
  const other: WorkerRef = { workerId: "w", dpRank: 1 };
  const batch = (hashes: bigint[], seed: number) => ({
    kind: "batch" as const, seq: 0n,
    batch: { ts: 0, dataParallelRank: 0, events: [stored(hashes, null, Array.from({ length: hashes.length * BS }, (_, i) => seed + i))] },
  });
  ixs.live.apply("m:default", w, batch([1n, 2n, 3n, 4n, 5n], 100)); // exactly at capacity: kept
  ixs.live.apply("m:default", other, batch([1n, 2n, 3n, 4n, 5n, 6n, 7n], 100)); // no capacity known: kept
  expect([ix.index.treeSize(w), ix.index.treeSize(other)]).toEqual([5, 7]);
  expect(await counter(metrics, "dynamo_epp_kv_rank_capacity_resets_total")).toBe(0);
  ixs.live.apply("m:default", w, batch([6n], 900));
  expect([ix.index.treeSize(w), ix.index.treeSize(other)]).toEqual([0, 7]);
  expect(await counter(metrics, "dynamo_epp_kv_rank_capacity_resets_total")).toBe(1);
});

test("recovery staging accepts only served models and reports the linear memory it holds", () => {
  const ixs = new Indexers(createMetrics());
  ixs.models.register("m", "default", BS);
  const staging = ixs.recovery.begin();
  expect([staging.accepts("m:default"), staging.accepts("other:default")]).toEqual([true, false]);
  expect(staging.stagedBytes()).toBe(0);
  stageEvents(staging, "m:default", BS, [{ workerId: "w", dpRank: 0, eventId: 0, parentHash: null, blocks: [{ blockHash: 1n, tokensHash: 2n }] }]);
  expect(staging.stagedBytes()).toBeGreaterThan(0);
  expect(() => stageEvents(staging, "other:default", BS, [{ workerId: "w", dpRank: 0, eventId: 1, parentHash: null, blocks: [] }])).toThrow(/not served/);
  staging.abort();
});

test("a batch naming another data_parallel_rank than its listener's is applied to the listener's rank, counted, logged once", async () => {
  const warned: unknown[] = [];
  const metrics = createMetrics();
  const ixs = new Indexers(metrics, { warn: (o: unknown) => warned.push(o), info: () => {} } as unknown as import("pino").Logger);
  const ix = ixs.models.register("m", "default", BS);
  const r2: WorkerRef = { workerId: "w", dpRank: 2 };
  for (const seq of [0n, 1n])
    ixs.live.apply("m:default", r2, { kind: "batch", seq, batch: { ts: 0, dataParallelRank: 0, events: [stored([100n + seq], null, [1, 2, 3, Number(seq)])] } });
  ixs.live.apply("m:default", r2, { kind: "batch", seq: 2n, batch: { ts: 0, dataParallelRank: 2, events: [] } });
  expect(await counter(metrics, "dynamo_epp_kv_rank_mismatch_total")).toBe(2);
  expect(warned).toEqual([{ worker: "w", rank: 2, batchRank: 0 }]);
  expect(findMatches(ix.index, computeBlockHashes(Uint32Array.of(1, 2, 3, 0), BS)).scores.get("w\u00002")).toBe(1);
});

test("the block size is the workers': a configured size their first store contradicts is replaced while nothing is indexed, loudly", async () => {
  const metrics = createMetrics();
  const errors: unknown[] = [];
  const ixs = new Indexers(metrics, { error: (o: unknown) => errors.push(o), warn: () => {}, info: () => {} } as unknown as import("pino").Logger);
  const ix = ixs.models.register("m", "default", 16);
  // Context parallelism scales the published block size; whatever it is, it is what the blocks hash by.
  ixs.live.apply("m:default", w, { kind: "batch", seq: 0n, batch: { ts: 0, dataParallelRank: 0, events: [stored([1n, 2n], null, [1, 2, 3, 4, 5, 6, 7, 8])] } });
  expect(ix.blockSize).toBe(BS);
  expect(findMatches(ix.index, computeBlockHashes(Uint32Array.of(1, 2, 3, 4, 5, 6, 7, 8), BS)).scores.get("w\u00000")).toBe(2);
  expect(await counter(metrics, "dynamo_epp_kv_block_size_mismatch_total")).toBe(1);
  expect(errors).toEqual([{ model: "m:default", configured: 16, workers: BS, worker: "w", rank: 0 }]);
});

test("SGLang's default --page-size 1 (one-token blocks) is refused, not adopted: the configured size stays and the error says what to change", async () => {
  const metrics = createMetrics();
  const errors: { o: unknown; msg: string }[] = [];
  const ixs = new Indexers(metrics, { error: (o: unknown, msg: string) => errors.push({ o, msg }), warn: () => {}, info: () => {} } as unknown as import("pino").Logger);
  const ix = ixs.models.register("m", "default", 16);
  // SGLang's record_store at page size 1: one hash per token, a chain coalesced into one event, medium GPU.
  const tokens = Array.from({ length: 32 }, (_, i) => 100 + i);
  const perToken: KvEvent = { type: "BlockStored", blockHashes: tokens.map((_, i) => BigInt(i + 1)), parentBlockHash: null, tokenIds: tokens, blockSize: 1, loraId: null, medium: "GPU" };
  const r1: WorkerRef = { workerId: "w", dpRank: 1 };
  for (let seq = 0n; seq < 2n; seq++) ixs.live.apply("m:default", w, { kind: "batch", seq, batch: { ts: 0, dataParallelRank: 0, events: [perToken] } });
  expect(ix.blockSize).toBe(16);
  expect(ix.index.stats().residencies).toBe(0);
  expect(ixs.live.rankInfo(w)).toMatchObject({ blockSize: 1, blockSizeMismatch: true });
  expect(await counter(metrics, "dynamo_epp_kv_events_rejected_total", '{reason="block_size"}')).toBe(2);
  expect(errors).toHaveLength(1);
  expect(errors[0]!.msg).toContain("--page-size 16");
  // A rank started with --page-size 16 is indexed by the configured size.
  ixs.live.apply("m:default", r1, { kind: "batch", seq: 0n, batch: { ts: 0, dataParallelRank: 1, events: [{ ...perToken, blockHashes: [90n, 91n], blockSize: 16 } as KvEvent] } });
  expect(findMatches(ix.index, computeBlockHashes(Uint32Array.from(tokens), 16)).scores.get("w\u00001")).toBe(2);
  // Configured as one-token blocks, they are what the index holds.
  const perTokenIx = new Indexers(createMetrics());
  const one = perTokenIx.models.register("m", "default", 1);
  perTokenIx.live.apply("m:default", w, { kind: "batch", seq: 0n, batch: { ts: 0, dataParallelRank: 0, events: [perToken] } });
  expect(findMatches(one.index, computeBlockHashes(Uint32Array.from(tokens), 1)).scores.get("w\u00000")).toBe(32);
});

test("hybrid KV groups: only the main attention group is indexed; a sliding-window group's stores and removals never touch it", async () => {
  const metrics = createMetrics();
  const ixs = new Indexers(metrics);
  const ix = ixs.models.register("m", "default", BS);
  const tokens = Array.from({ length: 12 }, (_, i) => i + 1);
  const hashes = [1n, 2n, 3n];
  const full = { ...stored(hashes, null, tokens), groupIdx: 0, kvCacheSpecKind: "full_attention" } as KvEvent;
  // vLLM's mask: the window group names only the blocks it keeps, its token_ids span them all.
  const window = { ...stored([3n], null, tokens), groupIdx: 1, kvCacheSpecKind: "sliding_window", kvCacheSpecSlidingWindow: 4 } as KvEvent;
  const mla = { ...stored(hashes, null, tokens), groupIdx: 2, kvCacheSpecKind: "mla_attention" } as KvEvent;
  ixs.live.apply("m:default", w, { kind: "batch", seq: 0n, batch: { ts: 0, dataParallelRank: 0, events: [full, window, mla] } });
  const probe = () => findMatches(ix.index, computeBlockHashes(Uint32Array.from(tokens), BS)).scores.get("w\u00000");
  expect(probe()).toBe(3);
  // The window group drops blocks full attention still holds: nothing changes.
  ixs.live.apply("m:default", w, { kind: "batch", seq: 1n, batch: { ts: 0, dataParallelRank: 0, events: [{ type: "BlockRemoved", blockHashes: [1n, 2n], medium: "GPU", groupIdx: 1 }] } });
  expect(probe()).toBe(3);
  expect(await counter(metrics, "dynamo_epp_kv_events_ignored_total", '{reason="non_main_group"}')).toBe(2);
  expect(await counter(metrics, "dynamo_epp_kv_events_ignored_total", '{reason="extra_main_group"}')).toBe(1);
  // The indexed group's own removal applies.
  ixs.live.apply("m:default", w, { kind: "batch", seq: 2n, batch: { ts: 0, dataParallelRank: 0, events: [{ type: "BlockRemoved", blockHashes: [3n], medium: "GPU", groupIdx: 0 }] } });
  expect(probe()).toBe(2);
  expect(ixs.live.rankInfo(w)!.kvGroups).toEqual({
    main: 0,
    groups: [
      { group_idx: 0, kind: "full_attention", block_size: BS, sliding_window: null },
      { group_idx: 1, kind: "sliding_window", block_size: BS, sliding_window: 4 },
      { group_idx: 2, kind: "mla_attention", block_size: BS, sliding_window: null },
    ],
  });
});

test("after a recovery, a rank the peer's dump holds above its capacity is reset too", async () => {
  const metrics = createMetrics();
  const ixs = new Indexers(metrics, undefined, { rankCapacity: () => 2 });
  ixs.models.register("m", "default", BS);
  const staging = ixs.recovery.begin();
  const blocks = [1n, 2n, 3n].map((h) => ({ blockHash: h, tokensHash: h + 100n }));
  stageEvents(staging, "m:default", BS, [{ workerId: "w", dpRank: 0, eventId: 0, parentHash: null, blocks }]);
  stageEvents(staging, "m:default", BS, [{ workerId: "v", dpRank: 0, eventId: 1, parentHash: null, blocks: blocks.slice(0, 2) }]);
  staging.commit();
  ixs.live.holdWithinCapacity();
  expect([ixs.models.get("m:default")!.index.treeSize(w), ixs.models.get("m:default")!.index.treeSize({ workerId: "v", dpRank: 0 })]).toEqual([0, 2]);
  expect(await counter(metrics, "dynamo_epp_kv_rank_capacity_resets_total")).toBe(1);
});

test("a peer's dump carries its learned adapters and blocks in both bodies: the recovered replica scores the adapter's request in its identity", () => {
  const peer = new Indexers(createMetrics());
  const pix = peer.models.register("m", "default", BS);
  // learned from an event's lora_name only: nothing configures "chat" on either replica
  peer.live.apply("m:default", w, {
    kind: "batch", seq: 0n,
    batch: { ts: 0, dataParallelRank: 0, events: [{ ...stored([1n, 2n], null, [1, 2, 3, 4, 5, 6, 7, 8]), loraName: "chat", extraKeys: [["chat"], ["chat"]] } as KvEvent] },
  });
  const chatHashes = computeBlockHashes(Uint32Array.of(1, 2, 3, 4, 5, 6, 7, 8), BS, [["chat"], ["chat"]]);
  expect(findMatches(pix.index, chatHashes).scores.get("w\u00000")).toBe(2);
  for (const format of ["json", "binary"] as const) {
    const joiner = new Indexers(createMetrics());
    joiner.models.register("m", "default", BS);
    expect(joiner.models.resolve("chat")!.loraName).toBeNull(); // before: an unknown name, scored as the base model
    const staging = joiner.recovery.within(1 << 30).begin();
    const body = Buffer.concat([...(format === "json" ? dumpChunks(peer.recovery) : dumpBinaryChunks(peer.recovery))]);
    const parser = dumpBodyParser(staging, format);
    parser.push(body);
    parser.end();
    staging.commit();
    const got = joiner.models.resolve("chat")!;
    expect({ format, lora: got.loraName, score: findMatches(got.indexer.index, chatHashes).scores.get("w\u00000") }).toEqual({ format, lora: "chat", score: 2 });
  }
});

test("a binary dump's announced size presizes the staged index only within the recovery budget", () => {
  const ixs = new Indexers(createMetrics());
  ixs.models.register("m", "default", BS);
  const sizes = { blocks: 1 << 20, residencies: 1 << 20 };
  const bounded = ixs.recovery.within(1 << 30).begin();
  bounded.model("m:default", BS, sizes);
  expect(bounded.stagedBytes()).toBeGreaterThan(32 * 1024 * 1024); // tables for a million blocks, up front
  bounded.abort();
  // a claim past the budget (or no budget at all) sizes nothing: the index grows with what really comes
  for (const staging of [ixs.recovery.within(16 * 1024 * 1024).begin(), ixs.recovery.begin()]) {
    staging.model("m:default", BS, sizes);
    expect(staging.stagedBytes()).toBeLessThan(4 * 1024 * 1024);
    staging.abort();
  }
  expect(presizeFor({ blocks: 2 ** 26, residencies: 1 }, Infinity)).toBeUndefined();
}, 120_000); // tables for a million blocks: about a second alone, tens of seconds beside a CPU hog

test("the ranks' KV capacity reserves every index's tables, the ones replacing it too; filling up to it rebuilds none", async () => {
  const metrics = createMetrics();
  const ixs = new Indexers(metrics);
  const ix = ixs.models.register("m", "default", BS);
  const empty = ix.index.stats().bytesInUse;
  ixs.models.reserve(20_000);
  const reserved = ix.index.stats();
  expect(reserved.bytesInUse).toBeGreaterThan(empty + 20_000 * 8); // two tables of >= 4 B a slot
  expect(await counter(metrics, "dynamo_epp_kv_index_reserved_residencies")).toBe(20_000);
  ixs.models.reserve(5_000); // smaller (a rank left): the tables stay
  expect(ix.index.stats().bytesInUse).toBe(reserved.bytesInUse);
  expect(await counter(metrics, "dynamo_epp_kv_index_reserved_residencies")).toBe(20_000);
  // 20,000 blocks in 500 stored events of 40 fill it exactly: no table grows
  for (let s = 0; s < 500; s++) {
    const ids = Array.from({ length: 40 * BS }, (_, i) => s * 1000 + i);
    const hashes = Array.from({ length: 40 }, (_, i) => 2n ** 63n + BigInt(s * 100 + i));
    ixs.live.apply("m:default", w, { kind: "batch", seq: BigInt(s), batch: { ts: 0, dataParallelRank: 0, events: [stored(hashes, null, ids)] } });
  }
  expect(ix.index.stats()).toMatchObject({ residencies: 20_000, tableRebuilds: reserved.tableRebuilds });
  ixs.models.updateGauges();
  expect(await counter(metrics, "dynamo_epp_kv_index_table_rebuilds", '{model="m:default"}')).toBe(reserved.tableRebuilds);
  // the index that replaces a trapped one is reserved as well
  const trapped = ix.index;
  (trapped as unknown as { trap: unknown }).trap = new WebAssembly.RuntimeError("unreachable");
  const fresh = ixs.models.lookup("m")!.index;
  expect(fresh).not.toBe(trapped);
  expect(fresh.stats().residencies).toBe(0);
  expect(fresh.stats().bytesInUse).toBeGreaterThan(empty + 20_000 * 8);
});

test("--index-reserve false: the tables grow as the index fills", async () => {
  const metrics = createMetrics();
  const ixs = new Indexers(metrics);
  ixs.models.disableReserve();
  const ix = ixs.models.register("m", "default", BS);
  const empty = ix.index.stats().bytesInUse;
  ixs.models.reserve(20_000);
  expect(ix.index.stats().bytesInUse).toBe(empty);
  expect(await counter(metrics, "dynamo_epp_kv_index_reserved_residencies")).toBe(0);
});

test("a recovered index is staged unreserved (the budget counts what the dump costs) and reserved when it is installed", () => {
  const ixs = new Indexers(createMetrics());
  ixs.models.register("m", "default", BS);
  ixs.models.reserve(500_000);
  const reserved = ixs.models.get("m:default")!.index.stats();
  expect(reserved.bytes).toBeGreaterThan(500_000 * 8);
  const staging = ixs.recovery.begin();
  stageEvents(staging, "m:default", BS, [{ workerId: "w", dpRank: 0, eventId: 0, parentHash: null, blocks: [{ blockHash: 1n, tokensHash: 2n }] }]);
  expect(staging.stagedBytes()).toBeLessThan(reserved.bytes / 4);
  staging.commit();
  const installed = ixs.models.get("m:default")!.index.stats();
  expect(installed.residencies).toBe(1);
  expect(installed.bytesInUse).toBeGreaterThanOrEqual(reserved.bytesInUse);
});

test("a reservation the module cannot take (a trap) turns reserving off and leaves a working index", async () => {
  const metrics = createMetrics();
  const ixs = new Indexers(metrics);
  const ix = ixs.models.register("m", "default", BS);
  const real = KvIndex.prototype.reserve;
  KvIndex.prototype.reserve = function (this: KvIndex) {
    (this as unknown as { trap: unknown }).trap = new WebAssembly.RuntimeError("memory.grow refused");
    throw (this as unknown as { trap: unknown }).trap;
  };
  try {
    ixs.models.reserve(1_000_000);
    expect(await counter(metrics, "dynamo_epp_kv_index_reserved_residencies")).toBe(0);
    // the trapped index is replaced on its next use, by an unreserved one that works
    const next = ixs.models.lookup("m")!;
    expect(next).toBe(ix);
    expect(next.index.trapped).toBe(false);
    ixs.live.apply("m:default", w, { kind: "batch", seq: 0n, batch: { ts: 0, dataParallelRank: 0, events: [stored([2n ** 63n], null, [1, 2, 3, 4])] } });
    expect(next.index.stats().residencies).toBe(1);
    expect(await counter(metrics, "dynamo_epp_kv_index_traps_total")).toBe(1);
    ixs.models.reserve(2_000_000); // off from now on: nothing is tried again
    expect(next.index.trapped).toBe(false);
  } finally {
    KvIndex.prototype.reserve = real;
  }
});

test("reservations grow in steps of more than 10% (ranks joining one by one do not rebuild the tables each time); an index trapped meanwhile is replaced reserved", () => {
  const ixs = new Indexers(createMetrics());
  const ix = ixs.models.register("m", "default", BS);
  ixs.models.reserve(100_000);
  const first = ix.index.stats();
  ixs.models.reserve(109_000); // within 10%: the tables hold it
  expect(ix.index.stats().tableRebuilds).toBe(first.tableRebuilds);
  ixs.models.reserve(120_000);
  const second = ix.index.stats();
  expect(second.tableRebuilds).toBeGreaterThan(first.tableRebuilds);
  expect(second.bytesInUse).toBeGreaterThan(first.bytesInUse);
  // an index that trapped for its own reasons is skipped, not taken for a refused reservation
  (ix.index as unknown as { trap: unknown }).trap = new WebAssembly.RuntimeError("unreachable");
  ixs.models.reserve(200_000);
  const fresh = ixs.models.lookup("m")!.index;
  expect(fresh.trapped).toBe(false);
  expect(fresh.stats().bytesInUse).toBeGreaterThan(second.bytesInUse);
});
