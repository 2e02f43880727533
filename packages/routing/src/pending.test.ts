import { describe, expect, test } from "bun:test";
import fc from "fast-check";
import { ActiveLoad } from "./load.ts";
import { combinedPending, DEFAULT_PENDING, PendingPrefixes, prefixKeys } from "./pending.ts";

const WORKERS = ["w0", "w1", "w2"];
const SCOPE = "m:t";

/** Prompts over a 3-hash alphabet, so they share prefixes of every length. */
const prompt = fc.array(fc.constantFrom(11n, 22n, 33n), { minLength: 0, maxLength: 10 }).map((hs) => BigUint64Array.from(hs));

const op = fc.oneof(
  fc.record({ kind: fc.constant("add" as const), worker: fc.constantFrom(...WORKERS), hashes: prompt }),
  fc.record({ kind: fc.constant("end" as const), pick: fc.nat() }),
);

function commonPrefix(a: BigUint64Array, b: BigUint64Array): number {
  let i = 0;
  while (i < a.length && i < b.length && a[i] === b[i]) i++;
  return i;
}

/** Each worker's longest prefix of `query` over the live entries, the long way. */
function expected(live: { worker: string; hashes: BigUint64Array }[], query: BigUint64Array): Map<string, number> {
  const out = new Map<string, number>();
  for (const e of live) {
    const n = commonPrefix(e.hashes, query);
    if (n > 0 && n > (out.get(e.worker) ?? 0)) out.set(e.worker, n);
  }
  return out;
}

describe("in-flight prefixes", () => {
  test("a worker's pending overlap is the longest prefix of the query among the requests in flight there", () => {
    fc.assert(
      fc.property(fc.array(op, { maxLength: 30 }), fc.array(prompt, { minLength: 1, maxLength: 5 }), (ops, queries) => {
        const pending = new PendingPrefixes({ maxBlocks: 1 << 20, maxEntries: 1 << 20, ttlMs: 1e9, now: () => 0 });
        const live: { id: number; worker: string; hashes: BigUint64Array }[] = [];
        for (const o of ops) {
          if (o.kind === "add") live.push({ id: pending.add(o.worker, prefixKeys(SCOPE, o.hashes)), worker: o.worker, hashes: o.hashes });
          else if (live.length > 0) {
            const [e] = live.splice(o.pick % live.length, 1);
            expect(pending.remove(e!.id)).toBe(true);
            expect(pending.remove(e!.id)).toBe(false);
          }
        }
        const out = new Map<string, number>();
        for (const q of queries) {
          pending.overlapsInto(prefixKeys(SCOPE, q), out);
          expect(out).toEqual(expected(live, q));
        }
        expect(pending.size).toBe(live.length);
        expect(pending.blocks).toBe(live.reduce((n, e) => n + e.hashes.length, 0));
      }),
    );
  });

  test("the blocks and requests held never pass their caps: the oldest requests leave first, and the survivors still match", () => {
    fc.assert(
      fc.property(fc.array(op, { maxLength: 40 }), fc.integer({ min: 1, max: 16 }), fc.integer({ min: 1, max: 8 }), prompt, (ops, cap, maxEntries, query) => {
        const pending = new PendingPrefixes({ maxBlocks: cap, maxEntries, ttlMs: 1e9, now: () => 0 });
        const live: { id: number; worker: string; hashes: BigUint64Array }[] = [];
        let evicted = 0;
        for (const o of ops) {
          if (o.kind === "add") {
            const kept = o.hashes.subarray(0, cap);
            // Oldest first, until the new entry fits.
            let held = live.reduce((n, e) => n + e.hashes.length, 0);
            while (held + kept.length > cap || live.length >= maxEntries) {
              held -= live.shift()!.hashes.length;
              evicted++;
            }
            live.push({ id: pending.add(o.worker, prefixKeys(SCOPE, o.hashes)), worker: o.worker, hashes: kept });
          } else if (live.length > 0) pending.remove(live.splice(o.pick % live.length, 1)[0]!.id);
          expect(pending.blocks).toBeLessThanOrEqual(cap);
          expect(pending.size).toBeLessThanOrEqual(maxEntries);
        }
        expect(pending.drops.evicted).toBe(evicted);
        const out = new Map<string, number>();
        pending.overlapsInto(prefixKeys(SCOPE, query), out);
        expect(out).toEqual(expected(live, query));
      }),
    );
  });

  test("an entry older than the TTL no longer counts, and is counted as expired", () => {
    let now = 0;
    const pending = new PendingPrefixes({ maxBlocks: 100, maxEntries: 100, ttlMs: 1000, now: () => now });
    const keys = prefixKeys(SCOPE, BigUint64Array.from([1n, 2n, 3n]));
    pending.add("w0", keys);
    now = 500;
    pending.add("w1", keys.subarray(0, 2));
    const out = new Map<string, number>();
    pending.overlapsInto(keys, out);
    expect(out).toEqual(new Map([["w0", 3], ["w1", 2]]));
    now = 1000;
    pending.overlapsInto(keys, out);
    expect(out).toEqual(new Map([["w1", 2]]));
    expect(pending.drops.expired).toBe(1);
    now = 1500;
    pending.overlapsInto(keys, out);
    expect(out.size).toBe(0);
    expect(pending.size).toBe(0);
    expect(pending.blocks).toBe(0);
  });

  test("prefix keys name the blocks before them and the scope: a shared prefix shares keys, anything else does not", () => {
    const a = prefixKeys(SCOPE, BigUint64Array.from([5n, 6n, 7n, 8n]));
    const b = prefixKeys(SCOPE, BigUint64Array.from([5n, 6n, 9n, 8n]));
    expect([...b.subarray(0, 2)]).toEqual([...a.subarray(0, 2)]);
    // Block 3 has the same tokens but follows another block 2.
    expect(b[2]).not.toBe(a[2]);
    expect(b[3]).not.toBe(a[3]);
    // Another model's index (or identity) shares nothing.
    expect(prefixKeys("other:t", BigUint64Array.from([5n]))[0]).not.toBe(a[0]);
    expect(prefixKeys(SCOPE, BigUint64Array.from([5n, 6n, 7n, 8n]), 2)).toEqual(a.subarray(0, 2));
  });

  test("a lease carries its request's prefix: pending where it was routed until released (twice is once)", () => {
    const pending = new PendingPrefixes({ maxBlocks: 100, maxEntries: 100, ttlMs: 1e9 });
    const load = new ActiveLoad(pending);
    const keys = prefixKeys(SCOPE, BigUint64Array.from([1n, 2n, 3n, 4n]));
    const lease = load.acquire("w1", 4, 4, keys);
    load.acquire("w2", 4, 4); // no prefix: load only
    const out = new Map<string, number>();
    pending.overlapsInto(keys, out);
    expect(out).toEqual(new Map([["w1", 4]]));
    lease.release();
    lease.release();
    pending.overlapsInto(keys, out);
    expect(out.size).toBe(0);
    expect(pending.blocks).toBe(0);
    expect(load.inflight).toBe(1);
  });

  test("a cap of 0 blocks or 0 requests is refused", () => {
    expect(() => new PendingPrefixes({ maxBlocks: 0, maxEntries: 1, ttlMs: 1 })).toThrow(RangeError);
    expect(() => new PendingPrefixes({ maxBlocks: 1, maxEntries: 0, ttlMs: 1 })).toThrow(RangeError);
  });
});

test("a combined view gives, per worker, the longest pending prefix of any of its views", () => {
  const own = new PendingPrefixes(DEFAULT_PENDING);
  const peers = new PendingPrefixes(DEFAULT_PENDING);
  own.add("a", Float64Array.of(1, 2));
  peers.add("a", Float64Array.of(1, 2, 3));
  peers.add("b", Float64Array.of(1));
  own.add("c", Float64Array.of(1, 2, 3, 4));
  const out = new Map<string, number>();
  combinedPending([own, peers])!.overlapsInto(Float64Array.of(1, 2, 3, 9), out);
  expect(out).toEqual(new Map([["a", 3], ["b", 1], ["c", 3]]));
  // absent views are left out: one is itself, none is no view
  expect(combinedPending([own, undefined])).toBe(own);
  expect(combinedPending([undefined, undefined])).toBeUndefined();
});
