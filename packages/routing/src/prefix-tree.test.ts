import { describe, expect, test } from "bun:test";
import fc from "fast-check";
import { prefixKeys, type PrefixKeys } from "./pending.ts";
import { PrefixTree, type PrefixEntry } from "./prefix-tree.ts";

type Scanned = { workerKey: string; keys: PrefixKeys };

/** The lookup as it was: entries bucketed by their first key, each bucket scanned with a binary search per entry. Kept as the reference. */
class BucketScan {
  private readonly byFirst = new Map<number, Set<Scanned>>();
  add(e: Scanned): void {
    let set = this.byFirst.get(e.keys[0]!);
    if (!set) this.byFirst.set(e.keys[0]!, (set = new Set()));
    set.add(e);
  }
  remove(e: Scanned): void {
    const set = this.byFirst.get(e.keys[0]!)!;
    set.delete(e);
    if (set.size === 0) this.byFirst.delete(e.keys[0]!);
  }
  overlapsInto(keys: PrefixKeys, out: Map<string, number>): void {
    out.clear();
    if (keys.length === 0) return;
    const set = this.byFirst.get(keys[0]!);
    if (!set) return;
    for (const e of set) {
      const best = out.get(e.workerKey) ?? 0;
      const max = Math.min(e.keys.length, keys.length);
      if (max <= best) continue;
      let lo = 1;
      let hi = max;
      while (lo < hi) {
        const mid = (lo + hi + 1) >>> 1;
        if (e.keys[mid - 1] === keys[mid - 1]) lo = mid;
        else hi = mid - 1;
      }
      if (lo > best) out.set(e.workerKey, lo);
    }
  }
}

const WORKERS = ["w0", "w1", "w2", "w3"];
/** Prompts over a 2-hash alphabet behind an optional shared head, so they branch at every depth and many share a first block. */
const prompt = fc
  .tuple(fc.boolean(), fc.array(fc.constantFrom(1n, 2n), { minLength: 1, maxLength: 24 }))
  .map(([head, hs]) => prefixKeys("m", BigUint64Array.from(head ? [7n, 7n, 7n, 7n, ...hs] : hs)));
const op = fc.oneof(
  { weight: 3, arbitrary: fc.record({ kind: fc.constant("add" as const), worker: fc.constantFrom(...WORKERS), keys: prompt }) },
  // A second entry with the very same keys (a request's prefill and decode leases carry one prefix).
  { weight: 1, arbitrary: fc.record({ kind: fc.constant("again" as const), worker: fc.constantFrom(...WORKERS), pick: fc.nat() }) },
  { weight: 2, arbitrary: fc.record({ kind: fc.constant("remove" as const), pick: fc.nat() }) },
);

describe("the in-flight prefix tree", () => {
  test("property: after any adds and removes, each worker's longest match is the bucket scan's", () => {
    fc.assert(
      fc.property(fc.array(op, { minLength: 20, maxLength: 120 }), fc.array(prompt, { minLength: 1, maxLength: 4 }), (ops, queries) => {
        const tree = new PrefixTree();
        const scan = new BucketScan();
        const live: { scanned: Scanned; entry: PrefixEntry }[] = [];
        const add = (workerKey: string, keys: PrefixKeys) => {
          const scanned = { workerKey, keys };
          scan.add(scanned);
          live.push({ scanned, entry: tree.add(workerKey, keys) });
        };
        const [got, want] = [new Map<string, number>(), new Map<string, number>()];
        for (const o of ops) {
          if (o.kind === "add") add(o.worker, o.keys);
          else if (live.length === 0) continue;
          else if (o.kind === "again") add(o.worker, live[o.pick % live.length]!.scanned.keys);
          else {
            const [e] = live.splice(o.pick % live.length, 1);
            scan.remove(e!.scanned);
            tree.remove(e!.entry);
          }
          // The live entries' own keys, then the queries: paths through every node the ops split or merged.
          for (const q of [...live.slice(-3).map((e) => e.scanned.keys), ...queries]) {
            got.clear();
            tree.longestInto(q, got);
            scan.overlapsInto(q, want);
            expect(got).toEqual(want);
          }
        }
      }),
      { numRuns: 300 },
    );
  });

  test("the requests that leave leave nothing of their keys behind: the nodes they shaped hold the survivors'", () => {
    const tree = new PrefixTree();
    // Built out of the test's frame, so no stray reference keeps them alive.
    const { entries, keys } = (() => {
      const entries = Array.from({ length: 32 }, (_, i) => tree.add(WORKERS[i % 4]!, prefixKeys("m", BigUint64Array.from([7n, 7n, BigInt(i % 3), BigInt(i % 5), BigInt(i)]))));
      return { entries, keys: entries.map((e) => new WeakRef(e.keys)) };
    })();
    // Added last, so the branch point they keep (after [7, 7]) was made from a gone request's keys.
    tree.add("w0", prefixKeys("m", BigUint64Array.from([7n, 7n, 0n, 0n, 99n])));
    tree.add("w1", prefixKeys("m", BigUint64Array.from([7n, 7n, 1n, 1n, 99n])));
    for (const e of entries) tree.remove(e);
    entries.length = 0;
    Bun.gc(true);
    expect(keys.filter((k) => k.deref() !== undefined).length).toBe(0);
    const out = new Map<string, number>();
    tree.longestInto(prefixKeys("m", BigUint64Array.from([7n, 7n, 0n, 1n])), out);
    expect(out).toEqual(new Map([["w0", 3], ["w1", 2]]));
  });
});
