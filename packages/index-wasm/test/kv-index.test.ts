import { parseWorkerKey, type StoredBlock, workerKey, type WorkerRef } from "@kv-epp/protocol";
import { describe, expect, test } from "bun:test";
import { IndexTrappedError, KvIndex } from "../src/index.ts";

const a: WorkerRef = { workerId: "vllm-0", dpRank: 0 };
const b: WorkerRef = { workerId: "vllm-1", dpRank: 0 };
const HIGH = 2n ** 63n;

/** A chain of blocks whose block hashes are >= 2^63, tokens hashes t0..tn-1. */
function chain(worker: number, tokens: bigint[]): StoredBlock[] {
  return tokens.map((t, i) => ({ blockHash: HIGH + BigInt(worker) * 1_000_000n + BigInt(i) * 1000n + t, tokensHash: t }));
}
const q = (...t: bigint[]) => BigUint64Array.from(t);

describe("KvIndex semantics", () => {
  test("a block stored again is a second copy: it leaves the worker only with its last copy", () => {
    const index = KvIndex.create({ blockSize: 16 });
    const blocks = chain(0, [10n, 11n, 12n]);
    expect(index.applyStored(a, null, blocks)).toEqual({ kind: "applied", blocks: 3, unknown: 0 });
    // vLLM does not deduplicate: the same prompt computed again stores the same hashes again
    expect(index.applyStored(a, blocks[1]!.blockHash, blocks.slice(2))).toEqual({ kind: "applied", blocks: 0, unknown: 0 });
    expect(index.stats()).toMatchObject({ blocks: 3, residencies: 3, workers: 1, rejected: 0 });
    expect(index.applyRemoved(a, [blocks[2]!.blockHash])).toEqual({ kind: "applied", blocks: 0, unknown: 0 });
    expect(index.findMatches(q(10n, 11n, 12n, 13n)).scores).toEqual(new Map([[workerKey(a), 3]]));
    expect(index.applyRemoved(a, [blocks[2]!.blockHash])).toEqual({ kind: "applied", blocks: 1, unknown: 0 });
    expect(index.findMatches(q(10n, 11n, 12n, 13n)).scores).toEqual(new Map([[workerKey(a), 2]]));
    expect(index.applyRemoved(a, [blocks[2]!.blockHash])).toEqual({ kind: "applied", blocks: 0, unknown: 1 });
    expect([...index.dump()]).toEqual([{ worker: a, parentHash: null, blocks: blocks.slice(0, 2) }]);
  });

  test("copies travel through the dump and AllBlocksCleared resets them", () => {
    const index = KvIndex.create({ blockSize: 16 });
    const blocks = chain(0, [10n, 11n]);
    index.applyStored(a, null, blocks);
    index.applyStored(a, null, blocks.slice(0, 1));
    index.applyStored(a, null, blocks.slice(0, 1));
    const dump = [...index.dump()];
    expect(dump).toEqual([{ worker: a, parentHash: null, blocks: [{ ...blocks[0]!, copies: 3 }, blocks[1]!] }]);
    const copy = KvIndex.create({ blockSize: 16 });
    copy.applyBatch(dump.map((e) => ({ kind: "stored" as const, ...e })));
    expect([...copy.dump()]).toEqual(dump);
    index.clearWorker(a);
    index.applyStored(a, null, blocks.slice(0, 1));
    expect(index.applyRemoved(a, [blocks[0]!.blockHash])).toEqual({ kind: "applied", blocks: 1, unknown: 0 });
    expect(index.stats()).toMatchObject({ blocks: 0, residencies: 0 });
  });

  test("removing a block the worker does not hold is a counted no-op", () => {
    const index = KvIndex.create({ blockSize: 16 });
    index.applyStored(a, null, chain(0, [1n, 2n]));
    expect(index.applyRemoved(a, [2n ** 64n - 1n])).toEqual({ kind: "applied", blocks: 0, unknown: 1 });
    expect(index.applyRemoved(b, chain(0, [1n]).map((x) => x.blockHash))).toEqual({ kind: "applied", blocks: 0, unknown: 1 });
    expect(index.stats()).toMatchObject({ residencies: 2, unknownRemovals: 2 });
  });

  test("a stored event whose parent the worker does not hold is rejected, counted and changes nothing", () => {
    const index = KvIndex.create({ blockSize: 16 });
    const held = chain(0, [1n, 2n]);
    index.applyStored(a, null, held);
    // b never stored the parent, even though a holds it
    expect(index.applyStored(b, held[1]!.blockHash, chain(1, [3n]))).toEqual({ kind: "rejected", reason: "unknown-parent", blocks: 0 });
    expect(index.stats()).toMatchObject({ blocks: 2, residencies: 2, rejected: 1 });
    expect(index.findMatches(q(1n, 2n, 3n)).scores).toEqual(new Map([[workerKey(a), 2]]));
  });

  test("a block is identified by its whole prefix: the same tokens under another parent is another block", () => {
    const index = KvIndex.create({ blockSize: 16 });
    index.applyStored(a, null, chain(0, [1n, 2n, 3n]));
    index.applyStored(b, null, chain(1, [9n, 2n, 3n]));
    expect(index.findMatches(q(1n, 2n, 3n)).scores).toEqual(new Map([[workerKey(a), 3]]));
    expect(index.findMatches(q(9n, 2n)).scores).toEqual(new Map([[workerKey(b), 2]]));
    expect(index.findMatches(q(2n, 3n)).scores.size).toBe(0);
    expect(index.stats().blocks).toBe(6);
  });

  test("removing a block keeps its descendants: the hit stops at it, and comes back whole when it is stored again", () => {
    const index = KvIndex.create({ blockSize: 16 });
    const blocks = chain(0, [1n, 2n, 3n, 4n, 5n]);
    index.applyStored(a, null, blocks);
    index.applyStored(b, null, chain(1, [1n, 2n, 3n, 4n, 5n]));
    expect(index.applyRemoved(a, [blocks[2]!.blockHash])).toEqual({ kind: "applied", blocks: 1, unknown: 0 });
    const m = index.findMatches(q(1n, 2n, 3n, 4n, 5n));
    expect(m.scores).toEqual(new Map([[workerKey(a), 2], [workerKey(b), 5]]));
    expect(m.treeSizes.get(workerKey(a))).toBe(4);
    // the dump names the removed block with zero copies, so a replica keeps the same chain
    expect([...index.dump()].filter((e) => e.worker === a || e.worker.workerId === a.workerId)).toEqual([
      { worker: a, parentHash: null, blocks: [blocks[0]!, blocks[1]!, { ...blocks[2]!, copies: 0 }, blocks[3]!, blocks[4]!] },
    ]);
    // the engine recomputes the evicted block and stores it again: the full overlap comes back
    expect(index.applyStored(a, blocks[1]!.blockHash, blocks.slice(2, 3))).toEqual({ kind: "applied", blocks: 1, unknown: 0 });
    expect(index.findMatches(q(1n, 2n, 3n, 4n, 5n)).scores.get(workerKey(a))).toBe(5);
    // descendants leave by their own removal: then nothing is left of a's chain below block 1
    index.applyRemoved(a, [blocks[2]!.blockHash]);
    index.applyRemoved(a, [blocks[4]!.blockHash, blocks[3]!.blockHash]);
    expect(index.treeSize(a)).toBe(2);
    index.removeWorker(b);
    expect(index.stats()).toMatchObject({ blocks: 2, residencies: 2 });
  });

  test("clearWorker drops every block of that worker only; removeWorker also forgets it", () => {
    const index = KvIndex.create({ blockSize: 16 });
    index.applyStored(a, null, chain(0, [1n, 2n]));
    index.applyStored(b, null, chain(1, [1n, 7n]));
    index.clearWorker(a);
    expect(index.findMatches(q(1n, 2n)).scores).toEqual(new Map([[workerKey(b), 1]]));
    expect(index.workers()).toEqual([a, b]);
    index.removeWorker(a);
    expect(index.workers()).toEqual([b]);
    expect(index.stats()).toMatchObject({ blocks: 2, residencies: 2, workers: 1 });
  });

  test("more than 64 workers share a prefix (worker bitsets widen)", () => {
    const index = KvIndex.create({ blockSize: 16 });
    const workers = Array.from({ length: 200 }, (_, i) => ({ workerId: `pod-${i}`, dpRank: i % 4 }));
    index.applyBatch(workers.map((w, i) => ({ kind: "stored" as const, worker: w, parentHash: null, blocks: chain(i, [1n, 2n, BigInt(3 + (i % 3))]) })));
    const m = index.findMatches(q(1n, 2n, 4n));
    expect(m.scores.size).toBe(200);
    for (const [key, score] of m.scores) {
      const i = Number(parseWorkerKey(key).workerId.slice(4));
      expect(score).toBe(i % 3 === 1 ? 3 : 2);
      expect(m.treeSizes.get(key)).toBe(3);
    }
  });

  test("a WorkerRef object reused after removeWorker, or changed in place, still names the right worker", () => {
    const index = KvIndex.create({ blockSize: 16 });
    const ref = { workerId: "vllm-0", dpRank: 0 }; // mutable on purpose (a WorkerRef is readonly)
    index.applyStored(ref, null, chain(0, [1n]));
    index.removeWorker(ref);
    index.applyStored(b, null, chain(1, [1n])); // takes the freed slot
    index.applyStored(ref, null, chain(0, [2n])); // the same object again: a fresh slot, not b's
    expect(index.findMatches(q(1n)).scores).toEqual(new Map([[workerKey(b), 1]]));
    expect(index.findMatches(q(2n)).scores).toEqual(new Map([[workerKey(ref), 1]]));
    ref.dpRank = 1; // mutated in place: now another worker
    index.applyStored(ref, null, chain(2, [3n]));
    expect(index.findMatches(q(3n)).scores).toEqual(new Map([[workerKey({ workerId: "vllm-0", dpRank: 1 }), 1]]));
    expect(index.workers().length).toBe(3);
  });

  test("workerKey and parseWorkerKey round-trip ids that contain separators", () => {
    const w = { workerId: "ns/pod:0\u0000x", dpRank: 7 };
    expect(parseWorkerKey(workerKey(w))).toEqual(w);
  });

  test("a dump in progress survives changes to the index between workers", () => {
    const index = KvIndex.create({ blockSize: 16 });
    index.applyStored(a, null, chain(0, [1n, 2n]));
    index.applyStored(b, null, chain(1, [1n, 3n]));
    const it = index.dump()[Symbol.iterator]();
    const first = it.next();
    expect(first.done).toBe(false);
    index.removeWorker(b);
    index.applyStored(a, null, chain(0, [5n]));
    const rest = [];
    for (let r = it.next(); !r.done; r = it.next()) rest.push(r.value);
    expect(rest.every((e) => workerKey(e.worker) !== workerKey(b))).toBe(true);
  });
});

describe("KvIndex.applyEncoded", () => {
  test("pre-encoded words apply exactly like the same events through applyBatch", () => {
    const viaBatch = KvIndex.create({ blockSize: 16 });
    const viaWords = KvIndex.create({ blockSize: 16 });
    const first = chain(0, [1n, 2n, 3n]);
    viaBatch.applyBatch([
      { kind: "stored", worker: a, parentHash: null, blocks: first },
      { kind: "stored", worker: a, parentHash: first[2]!.blockHash, blocks: chain(1, [4n]) },
      { kind: "stored", worker: b, parentHash: 77n, blocks: chain(2, [1n]) },
      { kind: "removed", worker: a, hashes: [first[1]!.blockHash, 5n] },
    ]);
    const sa = BigInt(viaWords.slotFor(a)), sb = BigInt(viaWords.slotFor(b));
    const header = (kind: bigint, slot: bigint, n: number) => kind | (slot << 8n) | (BigInt(n) << 32n);
    const words = BigUint64Array.from([
      header(1n, sa, 3), ...first.flatMap((x) => [x.blockHash, x.tokensHash]),
      header(2n, sa, 1), first[2]!.blockHash, ...chain(1, [4n]).flatMap((x) => [x.blockHash, x.tokensHash]),
      header(2n, sb, 1), 77n, ...chain(2, [1n]).flatMap((x) => [x.blockHash, x.tokensHash]),
      header(3n, sa, 2), first[1]!.blockHash, 5n,
    ]);
    expect(viaWords.applyEncoded(words)).toEqual({ events: 4, blocks: 4 + 1, unknown: 1, rejected: 1 }); // 4 stored, 1 removed
    const q = BigUint64Array.from([1n, 2n, 3n, 4n]);
    expect(viaWords.findMatches(q)).toEqual(viaBatch.findMatches(q));
    expect(viaWords.stats()).toEqual(viaBatch.stats());
  });

  test("a malformed batch (unknown kind, slot past 4094, a count past the end) is refused whole, nothing applied", () => {
    const ix = KvIndex.create({ blockSize: 16 });
    const s = BigInt(ix.slotFor(a));
    const header = (kind: bigint, slot: bigint, n: number) => kind | (slot << 8n) | (BigInt(n) << 32n);
    const good = [header(1n, s, 1), 11n, 1n];
    for (const bad of [
      [...good, header(9n, s, 0)], // unknown kind after a good event
      [...good, header(1n, 4095n, 1), 12n, 2n], // the free-slot marker
      [...good, header(1n, s, 3), 12n, 2n], // 3 blocks announced, 1 given
      [header(3n, s, 5), 11n], // a removal past the end
    ]) {
      expect(() => ix.applyEncoded(BigUint64Array.from(bad))).toThrow(/malformed encoded batch/);
      expect(ix.stats().residencies).toBe(0);
    }
    expect(ix.applyEncoded(BigUint64Array.from(good)).events).toBe(1);
    expect(ix.stats().residencies).toBe(1);
  });

  test("an index holds at most 4095 worker ranks (12-bit slots): the next one is a RangeError, not a wrap", () => {
    const ix = KvIndex.create({ blockSize: 16 });
    for (let i = 0; i < 4095; i++) ix.slotFor({ workerId: `w${i}`, dpRank: 0 });
    expect(() => ix.slotFor({ workerId: "one-too-many", dpRank: 0 })).toThrow(RangeError);
  });
});

describe("KvIndex memory", () => {
  test("a long stored/removed churn reuses space: linear memory stops growing", () => {
    const index = KvIndex.create({ blockSize: 16 });
    const workers = Array.from({ length: 16 }, (_, i) => ({ workerId: `pod-${i}`, dpRank: 0 }));
    const live: { w: WorkerRef; head: bigint }[] = [];
    let next = 1n;
    const storeOne = (round: number) => {
      const w = workers[round % workers.length]!;
      const head = HIGH + next;
      const blocks = Array.from({ length: 8 }, (_, i) => ({ blockHash: head + BigInt(i), tokensHash: next * 16n + BigInt(i) }));
      next += 16n;
      index.applyStored(w, null, blocks);
      live.push({ w, head });
    };
    for (let r = 0; r < 4000; r++) storeOne(r);
    // removed head first: the rest of the chain stays (zero copies at the head) until its own removals
    const warm = () => { for (let r = 0; r < 20_000; r++) { storeOne(r); const old = live.shift()!; index.applyRemoved(old.w, Array.from({ length: 8 }, (_, i) => old.head + BigInt(i))); } };
    warm();
    const after = index.stats();
    warm(); warm(); warm();
    const end = index.stats();
    expect(end.residencies).toBe(after.residencies);
    expect(end.bytes).toBe(after.bytes);
    expect(end.bytesInUse).toBe(after.bytesInUse);
    expect(end.residencies).toBe(4000 * 8);
  }, 60_000);
});

describe("a module trap", () => {
  test("leaves the index refusing every later call (IndexTrappedError) instead of answering from a half-done state", () => {
    const ix = KvIndex.create({ blockSize: 16 });
    ix.applyStored(a, null, chain(0, [1n]));
    expect(ix.trapped).toBe(false);
    // An unknown event kind past the check applyEncoded makes (the builder's path): `unreachable`.
    const inner = ix as unknown as { applyWords(p: number, w: number): unknown; ex: { reserve(n: number): number; memory: WebAssembly.Memory } };
    const p = inner.ex.reserve(8);
    new BigUint64Array(inner.ex.memory.buffer, p, 1)[0] = 9n;
    expect(() => inner.applyWords(p, 1)).toThrow(WebAssembly.RuntimeError);
    expect(ix.trapped).toBe(true);
    expect(() => ix.findMatches(BigUint64Array.from([1n]))).toThrow(IndexTrappedError);
    expect(() => ix.stats()).toThrow(IndexTrappedError);
  });
});
