// bun run bench:index — the WASM index against the TypeScript reference model, same workloads, same run.
// Prints ingestion throughput, findMatches latency percentiles and memory per residency.
import { computeBlockHashes, KvIndex, MatchList, type WorkerRef } from "../src/index.ts";
import { applyEvents, findMatches, type IndexEvent } from "../src/helpers.ts";
import { ReferenceIndex } from "../test/reference-model.ts";
import { mulberry32 } from "@kv-epp/testkit";
import { sequences, storedBlocks, storedEvents, workers } from "./workload.ts";

type Index = KvIndex | ReferenceIndex;
const impls: [name: string, create: () => Index][] = [
  ["wasm", () => KvIndex.create({ blockSize: 16 })],
  ["reference", () => ReferenceIndex.create({ blockSize: 16 })],
];
/** Events as objects: the WASM index through its helper (the batch builder underneath), the model directly. */
const applyTo = (index: Index, events: IndexEvent[]) => (index instanceof KvIndex ? applyEvents(index, events) : index.applyBatch(events));
const fmt = (n: number, d = 1) => n.toLocaleString("en-US", { maximumFractionDigits: d });

/** Wall and CPU time (user + system of this process, less noisy on a shared machine) of one run. */
function timed(f: () => void): { ms: number; cpuMs: number } {
  const c0 = process.cpuUsage();
  const t0 = performance.now();
  f();
  const ms = performance.now() - t0;
  const c = process.cpuUsage(c0);
  return { ms, cpuMs: (c.user + c.system) / 1000 };
}

function median(xs: number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  return s[s.length >> 1]!;
}

/** Runs `reps` times (fresh setup each), prints median wall and CPU rates for `blocks` block events. */
function rate(label: string, blocks: number, reps: number, setup: () => () => void): number {
  const walls: number[] = [], cpus: number[] = [];
  for (let rep = 0; rep < reps; rep++) {
    const run = setup();
    // collect before timing: a run should not pay for the garbage of the lines before it (the
    // reference model's and the helper's objects), which the process-wide CPU figure counts too
    Bun.gc(true);
    const t = timed(run);
    walls.push(t.ms);
    cpus.push(t.cpuMs);
  }
  const wall = median(walls), cpu = median(cpus);
  console.log(`  ${label.padEnd(34)} ${fmt(blocks / (wall / 1000) / 1e6, 2).padStart(6)} M block events/s wall, ${fmt(blocks / (cpu / 1000) / 1e6, 2).padStart(6)} M/s per CPU-second  (median of ${reps}: ${fmt(wall)} ms wall, ${fmt(cpu)} ms CPU)`);
  return blocks / (cpu / 1000);
}

type Typed = { worker: WorkerRef; ext: BigUint64Array; tok: BigUint64Array };
/** The same stored events as typed arrays (what a caller holding computeBlockHashes output has). */
function typedEvents(events: IndexEvent[]): Typed[] {
  return events.map((e) => {
    if (e.kind !== "stored" || e.parentHash !== null) throw new Error("root stored events only");
    return { worker: e.worker, ext: BigUint64Array.from(e.blocks, (b) => b.blockHash), tok: BigUint64Array.from(e.blocks, (b) => b.tokensHash) };
  });
}

function batches<T>(items: T[], size: number): T[][] {
  const out: T[][] = [];
  for (let i = 0; i < items.length; i += size) out.push(items.slice(i, i + size));
  return out;
}

function blockCount(events: IndexEvent[]): number {
  return events.reduce((n, e) => n + (e.kind === "stored" ? e.blocks.length : 0), 0);
}

/** Token-id sequences of `length` blocks: the first `sharedLength` blocks from one of `prompts` prefixes, the rest unique. */
function tokenSequences(count: number, length: number, sharedLength: number, prompts: number, blockSize: number, seed: number): Uint32Array[] {
  const next = mulberry32(seed + 1000);
  const ids = (n: number) => Uint32Array.from({ length: n }, () => next() % 150_000);
  const heads = Array.from({ length: prompts }, () => ids(sharedLength * blockSize));
  return Array.from({ length: count }, () => {
    const seq = new Uint32Array(length * blockSize);
    seq.set(heads[next() % prompts]!);
    seq.set(ids((length - sharedLength) * blockSize), sharedLength * blockSize);
    return seq;
  });
}

// ---- ingestion: 64 workers, 32-block sequences (16 shared of 256 prompts + 16 unique), ~1M residencies ----
function ingestion(): void {
  const ws = workers(64);
  const seqs = sequences(31_250, 32, 16, 256, 1);
  const next = mulberry32(2);
  const events = storedEvents(ws, seqs, () => [next() % ws.length]);
  const groups = batches(events, 256);
  const blocks = blockCount(events);
  console.log(`\ningestion into an empty index: ${fmt(events.length, 0)} stored events, ${fmt(blocks, 0)} block events, batches of 256 events`);
  const wasmRate = rate("wasm applyEvents helper (IndexEvent[])", blocks, 5, () => {
    const index = KvIndex.create({ blockSize: 16 });
    return () => { for (const g of groups) applyEvents(index, g); };
  });
  const refRate = rate("reference applyBatch", blocks, 3, () => {
    const index = ReferenceIndex.create({ blockSize: 16 });
    return () => { for (const g of groups) index.applyBatch(g); };
  });
  // the same events with hashes in BigUint64Arrays, added through the batch builder (one memcpy per
  // hash array instead of a BigInt conversion per block)
  const typed = batches(typedEvents(events), 256);
  /** Adds groups of typed events through the builder, one apply per group. */
  const addTyped = (index: KvIndex, groups: Typed[][]) => {
    const b = index.batch();
    for (const g of groups) {
      for (const e of g) b.stored(e.worker, null, e.ext, e.tok);
      b.apply();
    }
  };
  const builderRate = rate("wasm batch() builder (typed arrays)", blocks, 5, () => {
    const index = KvIndex.create({ blockSize: 16 });
    return () => addTyped(index, typed);
  });
  // the same shape of events with token ids instead of tokens hashes, as the EPP feeds them: each block's
  // 16 ids are hashed (XXH3) inside the index's module straight into the batch
  const idSeqs = tokenSequences(31_250, 32, 16, 256, 16, 1);
  const pickId = mulberry32(2);
  const idEvents = idSeqs.map((ids) => {
    const w = pickId() % ws.length;
    return { worker: ws[w]!, ids, ext: BigUint64Array.from(storedBlocks(computeBlockHashes(ids, 16), w), (b) => b.blockHash) };
  });
  /** Adds the token-id events through the builder, batches of 256. */
  const addIds = (index: KvIndex) => {
    const b = index.batch();
    for (let i = 0; i < idEvents.length; i += 256) {
      for (let j = i; j < Math.min(i + 256, idEvents.length); j++) { const e = idEvents[j]!; b.stored(e.worker, null, e.ext, { tokenIds: e.ids }); }
      b.apply();
    }
  };
  rate("wasm builder from token ids (hashed in the index)", blocks, 5, () => {
    const index = KvIndex.create({ blockSize: 16 });
    return () => addIds(index);
  });
  // vLLM does not deduplicate: a prompt computed again stores its blocks again (a copy each). Here one
  // event in four repeats an earlier event of the same worker, so a quarter of the blocks add copies.
  const pick = mulberry32(5);
  const typedAll = typedEvents(events);
  const withRepeats: Typed[] = [];
  typedAll.forEach((e, i) => {
    withRepeats.push(e);
    if (i % 3 === 2) withRepeats.push(typedAll[pick() % (i + 1)]!);
  });
  const repeatBlocks = withRepeats.reduce((n, e) => n + e.ext.length, 0);
  rate("wasm builder, 1 in 4 events a repeat", repeatBlocks, 5, () => {
    const index = KvIndex.create({ blockSize: 16 });
    return () => addTyped(index, batches(withRepeats, 256));
  });
  // the same into an index sized up front (KvIndex.create({ expected }), as a recovery that knows the
  // dump's size does): no table rebuilds while it fills, so this line shows what the rebuilds cost
  rate("wasm builder, presized index", blocks, 5, () => {
    const index = KvIndex.create({ blockSize: 16, expected: { blocks: 510_000, residencies: 730_000 } });
    return () => addTyped(index, typed);
  });
  // the same into an empty index reserved for the residencies it ends with, as the EPP reserves its
  // ranks' num_gpu_blocks summed (a pool whose caches fill up to what they can hold): no table grows
  const full = (() => {
    const index = KvIndex.create({ blockSize: 16 });
    addTyped(index, typed);
    return index.stats().residencies;
  })();
  rate("wasm builder, reserved (KvIndex.reserve)", blocks, 5, () => {
    const index = KvIndex.create({ blockSize: 16 });
    index.reserve(full);
    return () => addTyped(index, typed);
  });
  rate("wasm builder from token ids, reserved", blocks, 5, () => {
    const index = KvIndex.create({ blockSize: 16 });
    index.reserve(full);
    return () => addIds(index);
  });
  console.log(`  wasm / reference per CPU-second: applyEvents ${fmt(wasmRate / refRate, 1)}x, builder ${fmt(builderRate / refRate, 1)}x`);
}

// ---- steady state: an index at ~1M residencies where each new sequence evicts an old one ----
function steadyState(): void {
  const ws = workers(64);
  const seqs = sequences(62_500, 32, 16, 256, 11);
  const next = mulberry32(12);
  const owner = seqs.map(() => next() % ws.length);
  const stored = storedEvents(ws, seqs, (s) => [owner[s]!]);
  const warm = 31_250; // ~1M residencies before timing
  // after warm-up, event i stores sequence warm + i and evicts sequence i's unique blocks leaf-first, as
  // an LRU engine does (the shared prompt blocks stay hot)
  const churn: IndexEvent[] = [];
  for (let i = 0; i + warm < seqs.length; i++) {
    churn.push(stored[warm + i]!);
    const e = stored[i]!;
    if (e.kind === "stored") churn.push({ kind: "removed", worker: e.worker, hashes: e.blocks.slice(16).map((b) => b.blockHash).reverse() });
  }
  const blocks = churn.reduce((n, e) => n + (e.kind === "stored" ? e.blocks.length : e.kind === "removed" ? e.hashes.length : 0), 0);
  const groups = batches(churn, 256);
  console.log(`\nsteady state at ~1M residencies: ${fmt(churn.length, 0)} events (stored and removed), ${fmt(blocks, 0)} block events, batches of 256 events`);
  const warmGroups = batches(stored.slice(0, warm), 256);
  const wasmRate = rate("wasm applyEvents helper (IndexEvent[])", blocks, 3, () => {
    const index = KvIndex.create({ blockSize: 16 });
    for (const g of warmGroups) applyEvents(index, g);
    return () => { for (const g of groups) applyEvents(index, g); };
  });
  const refRate = rate("reference applyBatch", blocks, 1, () => {
    const index = ReferenceIndex.create({ blockSize: 16 });
    for (const g of warmGroups) index.applyBatch(g);
    return () => { for (const g of groups) index.applyBatch(g); };
  });
  // the same churn with hashes in BigUint64Arrays through the batch builder
  type TypedChurn = { worker: WorkerRef; ext: BigUint64Array; tok?: BigUint64Array };
  const typedChurn: TypedChurn[][] = groups.map((g) => g.map((e) => e.kind === "stored"
    ? { worker: e.worker, ext: BigUint64Array.from(e.blocks, (x) => x.blockHash), tok: BigUint64Array.from(e.blocks, (x) => x.tokensHash) }
    : { worker: e.worker, ext: BigUint64Array.from(e.kind === "removed" ? e.hashes : []) }));
  const builderRate = rate("wasm batch() builder (typed arrays)", blocks, 3, () => {
    const index = KvIndex.create({ blockSize: 16 });
    for (const g of warmGroups) applyEvents(index, g);
    return () => {
      const b = index.batch();
      for (const g of typedChurn) {
        for (const e of g) e.tok ? b.stored(e.worker, null, e.ext, e.tok) : b.removed(e.worker, e.ext);
        b.apply();
      }
    };
  });
  console.log(`  wasm / reference per CPU-second: applyEvents ${fmt(wasmRate / refRate, 1)}x, builder ${fmt(builderRate / refRate, 1)}x`);
}

// ---- findMatches latency ----
function percentile(sorted: Float64Array, p: number): number {
  return sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))]!;
}

function matching(workerCount: number, length: number): void {
  const ws = workers(workerCount);
  // each worker holds 24 sequences; half of each sequence is one of 8 shared prompts
  const seqs = sequences(workerCount * 24, length, length / 2, 8, 3 + length);
  const events = storedEvents(ws, seqs, (s) => [s % workerCount]);
  const next = mulberry32(4);
  const queries = Array.from({ length: 2000 }, () => seqs[next() % seqs.length]!);
  const line: string[] = [];
  const list = new MatchList();
  const variants: [name: string, create: () => Index, call: (index: Index, q: BigUint64Array) => number][] = [
    ["wasm findMatches helper (Maps)", impls[0]![1], (index, q) => findMatches(index as KvIndex, q).scores.size],
    ["wasm findMatchesInto", impls[0]![1], (index, q) => (index as KvIndex).findMatchesInto(q, list)],
    ["reference", impls[1]![1], (index, q) => (index as ReferenceIndex).findMatches(q).scores.size],
  ];
  for (const [name, create, call] of variants) {
    const index = create();
    for (const g of batches(events, 256)) applyTo(index, g);
    const runs = name.startsWith("wasm") ? 20_000 : 4_000;
    const times = new Float64Array(runs);
    for (let i = 0; i < 1000; i++) call(index, queries[i % queries.length]!); // warm up
    let matched = 0;
    const c0 = process.cpuUsage();
    for (let i = 0; i < runs; i++) {
      const q = queries[i % queries.length]!;
      const t0 = performance.now();
      matched += call(index, q);
      times[i] = performance.now() - t0;
    }
    const c = process.cpuUsage(c0);
    times.sort();
    const cpuUs = (c.user + c.system) / runs;
    line.push(`    ${name.padEnd(24)} p50 ${fmt(percentile(times, 0.5) * 1000, 2)} us, p99 ${fmt(percentile(times, 0.99) * 1000, 2)} us, CPU ${fmt(cpuUs, 2)} us/call (${fmt(matched / runs)} workers matched)`);
  }
  console.log(`  ${String(length).padStart(3)} blocks x ${String(workerCount).padStart(2)} workers:\n${line.join("\n")}`);
}

// ---- memory per residency at ~1M residencies ----
function memory(label: string, workerCount: number, seqs: BigUint64Array[], assign: (seq: number) => number[]): void {
  const events = storedEvents(workers(workerCount), seqs, assign);
  const parts: string[] = [];
  for (const [name, create] of impls) {
    Bun.gc(true);
    const before = process.memoryUsage().heapUsed;
    const index = create();
    for (const g of batches(events, 256)) applyTo(index, g);
    const stats = index.stats();
    if (name === "wasm") {
      parts.push(`${fmt(stats.residencies, 0)} residencies over ${fmt(stats.blocks, 0)} blocks:`);
      // the EPP's index at a full pool: reserved for what the caches hold together (KvIndex.reserve)
      const reserved = KvIndex.create({ blockSize: 16 });
      reserved.reserve(stats.residencies);
      for (const g of batches(events, 256)) applyEvents(reserved, g);
      const r = reserved.stats();
      parts.push(`wasm ${fmt(stats.bytesInUse / stats.residencies)} B/residency in live tables (${fmt(stats.bytes / stats.residencies)} B of linear memory; reserved for them: ${fmt(r.bytesInUse / r.residencies)} / ${fmt(r.bytes / r.residencies)} B) |`);
    } else {
      Bun.gc(true);
      parts.push(`reference ${fmt((process.memoryUsage().heapUsed - before) / stats.residencies)} B/residency of JS heap`);
    }
  }
  console.log(`  ${label}: ${parts.join(" ")}`);
}

function sharedHolders(pool: number, workerCount: number, perWorker: number): number[][] {
  const next = mulberry32(8);
  const holders: number[][] = Array.from({ length: pool }, () => []);
  for (let w = 0; w < workerCount; w++) {
    const picked = new Set<number>();
    while (picked.size < perWorker) picked.add(next() % pool);
    for (const s of picked) holders[s]!.push(w);
  }
  return holders;
}

// `bun run bench:index [ingestion|steady|matches|memory]` runs one section
const only = process.argv[2];
const run = (section: string, f: () => void) => { if (!only || only === section) f(); };
console.log(`bun ${Bun.version}, ${process.platform}/${process.arch}`);
run("ingestion", ingestion);
run("steady", steadyState);
run("matches", () => {
  console.log("\nfindMatches latency (query = a stored sequence; half of it a prompt shared with other workers):");
  for (const length of [128, 512]) for (const w of [16, 64]) matching(w, length);
});
run("memory", () => {
  console.log("\nmemory per (block, worker) residency:");
  const holders = sharedHolders(2000, 64, 244);
  memory("shared: 64 workers each hold 244 of 2,000 64-block sequences (~7.8 workers per block)", 64, sequences(2000, 64, 0, 1, 7), (s) => holders[s]!);
  memory("unshared: 15,625 64-block sequences, each held by one of 64 workers", 64, sequences(15_625, 64, 0, 1, 9), (s) => [s % 64]);
});
