import { describe, expect, test } from "bun:test";
import { workerKey } from "@kv-epp/protocol";
import { computeBlockHashes, KvIndex, MatchList, requestBlockExtras, type DumpEvent, type WorkerRef } from "../src/index.ts";
import { applyEvents, findMatches, type IndexEvent } from "../src/helpers.ts";
import { ReferenceIndex } from "./reference-model.ts";

const HIGH = 2n ** 63n;
const workers: WorkerRef[] = Array.from({ length: 5 }, (_, i) => ({ workerId: `pod-${i >> 1}`, dpRank: i & 1 }));

/** Random events over a few workers (with parents, removals and clears), hashes >= 2^63 included. */
function randomEvents(seed: number, count: number): IndexEvent[] {
  let s = seed;
  const next = () => (s = (s * 1103515245 + 12345) & 0x7fffffff);
  const held: bigint[][] = workers.map(() => []);
  const events: IndexEvent[] = [];
  for (let i = 0; i < count; i++) {
    const w = next() % workers.length;
    const k = next() % 10;
    if (k < 7) {
      const parent = held[w]!.length > 0 && next() % 2 === 0 ? held[w]![next() % held[w]!.length]! : null;
      const blocks = Array.from({ length: 1 + (next() % 40) }, (_, j) => {
        const ext = HIGH + BigInt(next()) * 7919n + BigInt(j);
        held[w]!.push(ext);
        return { blockHash: ext, tokensHash: BigInt(next() % 3) + (j % 2 === 0 ? HIGH : 0n) };
      });
      events.push({ kind: "stored", worker: workers[w]!, parentHash: parent, blocks });
    } else if (k < 9) {
      events.push({ kind: "removed", worker: workers[w]!, hashes: [held[w]![next() % Math.max(1, held[w]!.length)] ?? 5n, 77n] });
    } else {
      events.push({ kind: "cleared", worker: workers[w]! });
    }
  }
  return events;
}

describe("KvIndex.batch() builder", () => {
  test("typed-array and bigint[] events apply exactly as the reference model applies the same events", () => {
    const viaEvents = ReferenceIndex.create({ blockSize: 16 });
    const viaBuilder = KvIndex.create({ blockSize: 16 });
    for (let round = 0; round < 30; round++) {
      const events = randomEvents(round + 1, 60);
      const b = viaBuilder.batch();
      for (const e of events) {
        if (e.kind === "stored") {
          const ext = BigUint64Array.from(e.blocks, (x) => x.blockHash);
          // both forms of hashes: typed arrays and plain bigint[]s
          const tok = BigUint64Array.from(e.blocks, (x) => x.tokensHash);
          b.stored(e.worker, e.parentHash, round % 2 === 0 ? ext : [...ext], round % 4 < 2 ? tok : [...tok]);
        } else if (e.kind === "removed") {
          b.removed(e.worker, round % 2 === 0 ? BigUint64Array.from(e.hashes) : e.hashes);
        } else {
          b.cleared(e.worker);
        }
      }
      expect(b.events).toBe(events.length);
      expect(b.apply()).toEqual(viaEvents.applyBatch(events));
      expect(b.events).toBe(0);
      const { bytes: _b, bytesInUse: _u, tableRebuilds: _t, ...stats } = viaBuilder.stats();
      const { bytes: _rb, bytesInUse: _ru, tableRebuilds: _rt, ...refStats } = viaEvents.stats();
      expect(stats).toEqual(refStats);
    }
    // the same blocks, parents and copies (the two may cut chains into events differently)
    const rows = (ix: { dump(): Iterable<DumpEvent> }) => [...ix.dump()].flatMap((e) => {
      let parent = e.parentHash;
      return e.blocks.map((x) => `${workerKey(e.worker)}|${parent}|${(parent = x.blockHash)}|${x.tokensHash}|${x.copies ?? 1}`);
    }).sort();
    expect(rows(viaBuilder)).toEqual(rows(viaEvents));
  });

  test("a batch larger than the builder's first buffer grows it without losing events", () => {
    const index = KvIndex.create({ blockSize: 16 });
    const b = index.batch();
    const w = workers[0]!;
    const n = 20_000; // 20k blocks x 16 bytes: several times the first 64 KiB buffer
    const ext = BigUint64Array.from({ length: n }, (_, i) => HIGH + BigInt(i));
    const tok = BigUint64Array.from({ length: n }, (_, i) => BigInt(i));
    b.stored(w, null, ext.subarray(0, 10), tok.subarray(0, 10));
    b.stored(w, ext[9]!, ext.subarray(10), tok.subarray(10));
    expect(b.apply()).toEqual({ events: 2, blocks: n, unknown: 0, rejected: 0 });
    expect(findMatches(index, tok).scores.get(workerKey(w))).toBe(n);
  });

  test("token ids are hashed by the index's own module: the same blocks as from computeBlockHashes, extra keys included", () => {
    const fromTokens = KvIndex.create({ blockSize: 4 });
    const fromHashes = KvIndex.create({ blockSize: 4 });
    const tokens = Uint32Array.from({ length: 4 * 6 + 3 }, (_, i) => (i * 7919) % 50_000); // 6 blocks and a partial tail
    const extras = requestBlockExtras(6, 4, { loraName: "sql-lora", cacheSalt: "tenant-a" });
    const ext = BigUint64Array.from({ length: 6 }, (_, i) => HIGH + BigInt(i));
    const w = workers[0]!, v = workers[1]!;
    // w from token ids (a number[] too, as decoded events carry them), v without extra keys
    fromTokens.batch().stored(w, null, ext, { tokenIds: [...tokens], extras }).stored(v, null, ext.subarray(0, 5), { tokenIds: tokens }).apply();
    fromHashes.batch().stored(w, null, ext, computeBlockHashes(tokens, 4, extras)).stored(v, null, ext.subarray(0, 5), computeBlockHashes(tokens, 4).subarray(0, 5)).apply();
    const dump = (ix: KvIndex) => JSON.stringify([...ix.dump()], (_, x) => (typeof x === "bigint" ? x.toString() : x));
    expect(dump(fromTokens)).toEqual(dump(fromHashes));
    // a query by token ids is hashed the same way
    const out = new MatchList();
    for (const query of [{ tokenIds: tokens, extras }, { tokenIds: tokens }, { tokenIds: tokens.subarray(0, 9) }, { tokenIds: tokens.subarray(0, 3) }]) {
      const hashes = computeBlockHashes(query.tokenIds, 4, query.extras);
      fromTokens.findMatchesInto(query, out);
      expect(out.toMaps()).toEqual(findMatches(fromHashes, hashes));
    }
    expect(fromTokens.findMatchesInto({ tokenIds: tokens, extras }, out)).toBe(1);
    expect(out.scores[0]).toBe(6);
    expect(fromTokens.findMatchesInto({ tokenIds: tokens }, out)).toBe(1);
    expect(out.scores[0]).toBe(5);
  });

  test("mismatched hash arrays, or too few token ids, are refused before anything is written", () => {
    const index = KvIndex.create({ blockSize: 16 });
    const b = index.batch();
    expect(() => b.stored(workers[0]!, null, new BigUint64Array(2), new BigUint64Array(3))).toThrow(RangeError);
    expect(() => b.stored(workers[0]!, null, new BigUint64Array(2), { tokenIds: new Uint32Array(31) })).toThrow(RangeError);
    expect(b.events).toBe(0);
    b.reset();
    expect(b.apply()).toEqual({ events: 0, blocks: 0, unknown: 0, rejected: 0 });
  });
});

describe("KvIndex.findMatchesInto", () => {
  test("fills a reusable MatchList with the reference model's matches", () => {
    const index = KvIndex.create({ blockSize: 16 });
    const ref = ReferenceIndex.create({ blockSize: 16 });
    // 200 workers: more than the MatchList's first 64 entries and more than one mask word
    const many = Array.from({ length: 200 }, (_, i) => ({ workerId: `w${i}`, dpRank: 0 }));
    const events = many.map((w, i) => ({
      kind: "stored" as const, worker: w, parentHash: null,
      blocks: Array.from({ length: 1 + (i % 4) }, (_, j) => ({ blockHash: HIGH + BigInt(i * 10 + j), tokensHash: BigInt(j) })),
    }));
    applyEvents(index, events);
    ref.applyBatch(events);
    const out = new MatchList();
    for (const q of [[0n, 1n, 2n, 3n], [0n, 1n], [9n], []]) {
      const query = BigUint64Array.from(q);
      const n = index.findMatchesInto(query, out);
      expect(n).toBe(out.count);
      expect(out.toMaps()).toEqual(ref.findMatches(query));
      for (let i = 0; i < n; i++) expect(out.keys[i]).toBe(`${out.workers[i]!.workerId}\u0000${out.workers[i]!.dpRank}`);
    }
  });
});

describe("linear memory", () => {
  test("grows by what the index needs, not by doubling, and reuses freed tables", () => {
    const index = KvIndex.create({ blockSize: 16 });
    const b = index.batch();
    const w = workers[0]!;
    let at = 0n;
    for (let round = 0; round < 40; round++) {
      const n = 5000;
      const ext = BigUint64Array.from({ length: n }, (_, i) => HIGH + at + BigInt(i));
      const tok = BigUint64Array.from({ length: n }, (_, i) => at + BigInt(i));
      at += BigInt(n);
      b.stored(w, null, ext, tok).apply();
    }
    const s = index.stats();
    expect(s.residencies).toBe(200_000);
    // every round is still found after the tables were rebuilt (sorted batches) many times
    for (let r = 0n; r < 40n; r++) {
      const q = BigUint64Array.from({ length: 5000 }, (_, i) => r * 5000n + BigInt(i));
      expect(findMatches(index, q).scores.get(workerKey(w))).toBe(5000);
    }
    // live structures (tables at their capacity, chunks) and linear memory stay close: no doubling
    expect(s.bytes).toBeLessThan(s.bytesInUse * 1.25 + 1_000_000);
  });
});

describe("reserve", () => {
  const pool: WorkerRef[] = Array.from({ length: 8 }, (_, i) => ({ workerId: `vllm-${i >> 1}`, dpRank: i & 1 }));
  /** ~21k residencies over 8 ranks: chains of 20 blocks, the first 10 from one of 16 shared prompts (some stored again: copies). */
  function fill(index: KvIndex): void {
    const b = index.batch();
    for (let s = 0; s < 2000; s++) {
      const w = pool[s % 8]!;
      const tok = BigUint64Array.from({ length: 20 }, (_, i) => (i < 10 ? BigInt((s * 7) % 16) * 100n + BigInt(i) : 1_000_000n + BigInt(s) * 100n + BigInt(i)));
      const ext = BigUint64Array.from(tok, (t) => HIGH + t * 16n + BigInt(s % 8));
      b.stored(w, null, ext, tok);
      if (s % 256 === 255) b.apply();
    }
    b.apply();
  }

  test("an index reserved for its pool's capacity fills up to it without rebuilding a table, and answers as a growing one", () => {
    const growing = KvIndex.create({ blockSize: 16 });
    fill(growing);
    const full = growing.stats().residencies;
    const reserved = KvIndex.create({ blockSize: 16 });
    reserved.reserve(full); // filled exactly to its reservation
    const before = reserved.stats().tableRebuilds;
    fill(reserved);
    const s = reserved.stats();
    expect(s.residencies).toBe(full);
    expect(full).toBeGreaterThan(20_000);
    expect(s.tableRebuilds).toBe(before);
    expect(growing.stats().tableRebuilds).toBeGreaterThanOrEqual(4); // the growing one did, table by table
    const { bytes: _a, bytesInUse: _b, tableRebuilds: _c, ...grown } = growing.stats();
    const { bytes: _d, bytesInUse: _e, tableRebuilds: _f, ...held } = s;
    expect(held).toEqual(grown);
    for (let p = 0; p < 16; p++) {
      const q = BigUint64Array.from({ length: 12 }, (_, i) => BigInt(p) * 100n + BigInt(i));
      expect(findMatches(reserved, q)).toEqual(findMatches(growing, q));
    }
    expect([...reserved.dump()]).toEqual([...growing.dump()]);
  });

  test("a full reserved index churning (stores of new blocks, removals of old ones) keeps its tables: the tombstone sweeps keep their capacity", () => {
    const w = pool[0]!;
    const index = KvIndex.create({ blockSize: 16 });
    const N = 50_000;
    index.reserve(N);
    const b = index.batch();
    const run = (from: number, n: number) => {
      const tok = BigUint64Array.from({ length: n }, (_, i) => BigInt(from + i));
      return { tok, ext: BigUint64Array.from(tok, (t) => HIGH + t) };
    };
    // filled to the reservation in chains of 50 blocks, then each new chain evicts the oldest one
    for (let c = 0; c < N / 50; c++) { const r = run(c * 50, 50); b.stored(w, null, r.ext, r.tok); if (c % 64 === 63) b.apply(); }
    b.apply();
    const full = index.stats();
    expect(full.residencies).toBe(N);
    for (let c = N / 50; c < (4 * N) / 50; c++) {
      const r = run(c * 50, 50);
      b.stored(w, null, r.ext, r.tok);
      b.removed(w, run((c - N / 50) * 50, 50).ext);
      if (c % 64 === 63) b.apply();
    }
    b.apply();
    const churned = index.stats();
    expect(churned.residencies).toBe(N);
    expect(churned.tableRebuilds).toBeGreaterThan(full.tableRebuilds); // tombstones were swept...
    expect(churned.bytesInUse).toBeLessThanOrEqual(full.bytesInUse); // ...into tables of the same size
    const q = run(4 * N - 50, 50).tok; // the last chain stored
    expect(findMatches(index, q).scores.get(workerKey(w))).toBe(50);
  });

  test("reserving under live content keeps it; a smaller figure is a no-op; bad figures are RangeErrors", () => {
    const index = KvIndex.create({ blockSize: 16 });
    fill(index);
    const q = BigUint64Array.from({ length: 12 }, (_, i) => 300n + BigInt(i));
    const answer = findMatches(index, q);
    const dump = [...index.dump()];
    expect(index.reserve(200_000)).toBe(true);
    const grown = index.stats();
    expect(findMatches(index, q)).toEqual(answer);
    expect([...index.dump()]).toEqual(dump);
    index.reserve(1000);
    expect(index.stats().tableRebuilds).toBe(grown.tableRebuilds);
    expect(index.stats().bytesInUse).toBe(grown.bytesInUse);
    for (const bad of [-1, 1.5, Number.NaN]) expect(() => index.reserve(bad)).toThrow(RangeError);
    index.reserve(2 ** 40); // clamped to the index's limits
    expect(findMatches(index, q)).toEqual(answer);
  });
});

describe("builder failures", () => {
  test("a batch whose apply throws (a module trap) is dropped, not sent again with the next", () => {
    const ix = KvIndex.create({ blockSize: 4 });
    const b = ix.batch();
    const w = workers[0]!;
    b.stored(w, null, new BigUint64Array([HIGH + 1n]), new BigUint64Array([1n]));
    const host = ix as unknown as { applyWords(ptr: number, words: number): unknown };
    const real = host.applyWords.bind(ix);
    host.applyWords = () => {
      throw new WebAssembly.RuntimeError("unreachable");
    };
    expect(() => b.apply()).toThrow(WebAssembly.RuntimeError);
    expect(b.events).toBe(0);
    host.applyWords = real;
    b.stored(w, null, new BigUint64Array([HIGH + 2n]), new BigUint64Array([2n]));
    expect(b.apply().events).toBe(1);
    expect(ix.stats().residencies).toBe(1);
  });

  test("presizing beyond the module's limits is a RangeError, not a trap or a silent wrap", () => {
    for (const bad of [2 ** 32, -1, 1.5, 2 ** 26]) expect(() => KvIndex.create({ blockSize: 4, expected: { blocks: bad, residencies: 1 } })).toThrow(RangeError);
    expect(KvIndex.create({ blockSize: 4, expected: { blocks: 1000, residencies: 1000 } }).stats().residencies).toBe(0);
  });
});
