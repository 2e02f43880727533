import { describe, expect, test } from "bun:test";
import { parseWorkerKey, workerKey } from "@kv-epp/protocol";
import { IndexTrappedError, KvIndex, type StoredBlock, type WorkerRef } from "../src/index.ts";
import { applyEvents, applyRemoved, applyStored, findMatches } from "../src/helpers.ts";

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
    expect(applyStored(index, a, null, blocks)).toEqual({ kind: "applied", blocks: 3, unknown: 0 });
    // vLLM does not deduplicate: the same prompt computed again stores the same hashes again
    expect(applyStored(index, a, blocks[1]!.blockHash, blocks.slice(2))).toEqual({ kind: "applied", blocks: 0, unknown: 0 });
    expect(index.stats()).toMatchObject({ blocks: 3, residencies: 3, workers: 1, rejected: 0 });
    expect(applyRemoved(index, a, [blocks[2]!.blockHash])).toEqual({ kind: "applied", blocks: 0, unknown: 0 });
    expect(findMatches(index, q(10n, 11n, 12n, 13n)).scores).toEqual(new Map([[workerKey(a), 3]]));
    expect(applyRemoved(index, a, [blocks[2]!.blockHash])).toEqual({ kind: "applied", blocks: 1, unknown: 0 });
    expect(findMatches(index, q(10n, 11n, 12n, 13n)).scores).toEqual(new Map([[workerKey(a), 2]]));
    expect(applyRemoved(index, a, [blocks[2]!.blockHash])).toEqual({ kind: "applied", blocks: 0, unknown: 1 });
    expect([...index.dump()]).toEqual([{ worker: a, parentHash: null, blocks: blocks.slice(0, 2) }]);
  });

  test("copies travel through the dump and AllBlocksCleared resets them", () => {
    const index = KvIndex.create({ blockSize: 16 });
    const blocks = chain(0, [10n, 11n]);
    applyStored(index, a, null, blocks);
    applyStored(index, a, null, blocks.slice(0, 1));
    applyStored(index, a, null, blocks.slice(0, 1));
    const dump = [...index.dump()];
    expect(dump).toEqual([{ worker: a, parentHash: null, blocks: [{ ...blocks[0]!, copies: 3 }, blocks[1]!] }]);
    const copy = KvIndex.create({ blockSize: 16 });
    applyEvents(copy, dump.map((e) => ({ kind: "stored" as const, ...e })));
    expect([...copy.dump()]).toEqual(dump);
    index.clearWorker(a);
    applyStored(index, a, null, blocks.slice(0, 1));
    expect(applyRemoved(index, a, [blocks[0]!.blockHash])).toEqual({ kind: "applied", blocks: 1, unknown: 0 });
    expect(index.stats()).toMatchObject({ blocks: 0, residencies: 0 });
  });

  test("removing a block the worker does not hold is a counted no-op", () => {
    const index = KvIndex.create({ blockSize: 16 });
    applyStored(index, a, null, chain(0, [1n, 2n]));
    expect(applyRemoved(index, a, [2n ** 64n - 1n])).toEqual({ kind: "applied", blocks: 0, unknown: 1 });
    expect(applyRemoved(index, b, chain(0, [1n]).map((x) => x.blockHash))).toEqual({ kind: "applied", blocks: 0, unknown: 1 });
    expect(index.stats()).toMatchObject({ residencies: 2, unknownRemovals: 2 });
  });

  test("a stored event whose parent the worker does not hold is rejected, counted and changes nothing", () => {
    const index = KvIndex.create({ blockSize: 16 });
    const held = chain(0, [1n, 2n]);
    applyStored(index, a, null, held);
    // b never stored the parent, even though a holds it
    expect(applyStored(index, b, held[1]!.blockHash, chain(1, [3n]))).toEqual({ kind: "rejected", reason: "unknown-parent", blocks: 0 });
    expect(index.stats()).toMatchObject({ blocks: 2, residencies: 2, rejected: 1 });
    expect(findMatches(index, q(1n, 2n, 3n)).scores).toEqual(new Map([[workerKey(a), 2]]));
  });

  test("a block is identified by its whole prefix: the same tokens under another parent is another block", () => {
    const index = KvIndex.create({ blockSize: 16 });
    applyStored(index, a, null, chain(0, [1n, 2n, 3n]));
    applyStored(index, b, null, chain(1, [9n, 2n, 3n]));
    expect(findMatches(index, q(1n, 2n, 3n)).scores).toEqual(new Map([[workerKey(a), 3]]));
    expect(findMatches(index, q(9n, 2n)).scores).toEqual(new Map([[workerKey(b), 2]]));
    expect(findMatches(index, q(2n, 3n)).scores.size).toBe(0);
    expect(index.stats().blocks).toBe(6);
  });

  test("removing a block keeps its descendants: the hit stops at it, and comes back whole when it is stored again", () => {
    const index = KvIndex.create({ blockSize: 16 });
    const blocks = chain(0, [1n, 2n, 3n, 4n, 5n]);
    applyStored(index, a, null, blocks);
    applyStored(index, b, null, chain(1, [1n, 2n, 3n, 4n, 5n]));
    expect(applyRemoved(index, a, [blocks[2]!.blockHash])).toEqual({ kind: "applied", blocks: 1, unknown: 0 });
    const m = findMatches(index, q(1n, 2n, 3n, 4n, 5n));
    expect(m.scores).toEqual(new Map([[workerKey(a), 2], [workerKey(b), 5]]));
    expect(m.treeSizes.get(workerKey(a))).toBe(4);
    // the dump names the removed block with zero copies, so a replica keeps the same chain
    expect([...index.dump()].filter((e) => e.worker === a || e.worker.workerId === a.workerId)).toEqual([
      { worker: a, parentHash: null, blocks: [blocks[0]!, blocks[1]!, { ...blocks[2]!, copies: 0 }, blocks[3]!, blocks[4]!] },
    ]);
    // the engine recomputes the evicted block and stores it again: the full overlap comes back
    expect(applyStored(index, a, blocks[1]!.blockHash, blocks.slice(2, 3))).toEqual({ kind: "applied", blocks: 1, unknown: 0 });
    expect(findMatches(index, q(1n, 2n, 3n, 4n, 5n)).scores.get(workerKey(a))).toBe(5);
    // descendants leave by their own removal: then nothing is left of a's chain below block 1
    applyRemoved(index, a, [blocks[2]!.blockHash]);
    applyRemoved(index, a, [blocks[4]!.blockHash, blocks[3]!.blockHash]);
    expect(index.treeSize(a)).toBe(2);
    index.removeWorker(b);
    expect(index.stats()).toMatchObject({ blocks: 2, residencies: 2 });
  });

  test("clearWorker drops every block of that worker only; removeWorker also forgets it", () => {
    const index = KvIndex.create({ blockSize: 16 });
    applyStored(index, a, null, chain(0, [1n, 2n]));
    applyStored(index, b, null, chain(1, [1n, 7n]));
    index.clearWorker(a);
    expect(findMatches(index, q(1n, 2n)).scores).toEqual(new Map([[workerKey(b), 1]]));
    expect(index.workers()).toEqual([a, b]);
    index.removeWorker(a);
    expect(index.workers()).toEqual([b]);
    expect(index.stats()).toMatchObject({ blocks: 2, residencies: 2, workers: 1 });
  });

  test("more than 64 workers share a prefix (worker bitsets widen)", () => {
    const index = KvIndex.create({ blockSize: 16 });
    const workers = Array.from({ length: 200 }, (_, i) => ({ workerId: `pod-${i}`, dpRank: i % 4 }));
    applyEvents(index, workers.map((w, i) => ({ kind: "stored" as const, worker: w, parentHash: null, blocks: chain(i, [1n, 2n, BigInt(3 + (i % 3))]) })));
    const m = findMatches(index, q(1n, 2n, 4n));
    expect(m.scores.size).toBe(200);
    for (const [key, score] of m.scores) {
      const i = Number(parseWorkerKey(key).workerId.slice(4));
      expect(score).toBe(i % 3 === 1 ? 3 : 2);
      expect(m.treeSizes.get(key)).toBe(3);
    }
  });

  test("a WorkerRef object reused after removeWorker, or changed in place, still names the right worker", () => {
    const index = KvIndex.create({ blockSize: 16 });
    const ref: WorkerRef = { workerId: "vllm-0", dpRank: 0 };
    applyStored(index, ref, null, chain(0, [1n]));
    index.removeWorker(ref);
    applyStored(index, b, null, chain(1, [1n])); // takes the freed slot
    applyStored(index, ref, null, chain(0, [2n])); // the same object again: a fresh slot, not b's
    expect(findMatches(index, q(1n)).scores).toEqual(new Map([[workerKey(b), 1]]));
    expect(findMatches(index, q(2n)).scores).toEqual(new Map([[workerKey(ref), 1]]));
    (ref as { dpRank: number }).dpRank = 1; // mutated in place: now another worker
    applyStored(index, ref, null, chain(2, [3n]));
    expect(findMatches(index, q(3n)).scores).toEqual(new Map([[workerKey({ workerId: "vllm-0", dpRank: 1 }), 1]]));
    expect(index.workers().length).toBe(3);
  });

  test("workerKey and parseWorkerKey round-trip ids that contain separators", () => {
    const w = { workerId: "ns/pod:0\u0000x", dpRank: 7 };
    expect(parseWorkerKey(workerKey(w))).toEqual(w);
  });

  test("a dump in progress survives changes to the index between workers", () => {
    const index = KvIndex.create({ blockSize: 16 });
    applyStored(index, a, null, chain(0, [1n, 2n]));
    applyStored(index, b, null, chain(1, [1n, 3n]));
    const it = index.dump()[Symbol.iterator]();
    const first = it.next();
    expect(first.done).toBe(false);
    index.removeWorker(b);
    applyStored(index, a, null, chain(0, [5n]));
    const rest = [];
    for (let r = it.next(); !r.done; r = it.next()) rest.push(r.value);
    expect(rest.every((e) => workerKey(e.worker) !== workerKey(b))).toBe(true);
  });
});

describe("KvIndex worker slots", () => {
  test("an index holds at most 4095 worker ranks (12-bit slots): the next one is a RangeError, not a wrap", () => {
    const ix = KvIndex.create({ blockSize: 16 });
    const b = ix.batch();
    for (let i = 0; i < 4095; i++) b.removed({ workerId: `w${i}`, dpRank: 0 }, []);
    expect(() => b.removed({ workerId: "one-too-many", dpRank: 0 }, [])).toThrow(RangeError);
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
      applyStored(index, w, null, blocks);
      live.push({ w, head });
    };
    for (let r = 0; r < 4000; r++) storeOne(r);
    // removed head first: the rest of the chain stays (zero copies at the head) until its own removals
    const warm = () => { for (let r = 0; r < 20_000; r++) { storeOne(r); const old = live.shift()!; applyRemoved(index, old.w, Array.from({ length: 8 }, (_, i) => old.head + BigInt(i))); } };
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
    applyStored(ix, a, null, chain(0, [1n]));
    expect(ix.trapped).toBe(false);
    // An event kind the module does not know (the batch builder never writes one): `unreachable`.
    const inner = ix as unknown as { applyWords(p: number, w: number): unknown; ex: { reserve(n: number): number; memory: WebAssembly.Memory } };
    const p = inner.ex.reserve(8);
    new BigUint64Array(inner.ex.memory.buffer, p, 1)[0] = 9n;
    expect(() => inner.applyWords(p, 1)).toThrow(WebAssembly.RuntimeError);
    expect(ix.trapped).toBe(true);
    expect(() => findMatches(ix, BigUint64Array.from([1n]))).toThrow(IndexTrappedError);
    expect(() => ix.stats()).toThrow(IndexTrappedError);
  });
});
