import { describe, expect, test } from "bun:test";
import fc from "fast-check";
import { AwayWorkers, homeShare } from "./home.ts";

const ids = fc.uniqueArray(fc.string({ minLength: 1, maxLength: 6 }), { minLength: 1, maxLength: 5 });
const keys = fc.uniqueArray(fc.string({ minLength: 1, maxLength: 8 }), { maxLength: 40 });

describe("home share", () => {
  test("every replica computes its own share alone, and the shares are disjoint, cover every worker and differ by at most one", () => {
    fc.assert(
      fc.property(ids, keys, fc.func(fc.integer()), (replicas, workers, order) => {
        // Each replica may list the workers (and its peers) in its own order.
        const shuffled = (xs: string[], salt: number) => [...xs].sort((a, b) => order(a + salt) - order(b + salt));
        const shares = replicas.map((self, r) => homeShare(shuffled(workers, r), { self, peers: shuffled(replicas.filter((x) => x !== self), r) }));
        const owners = new Map<string, number>();
        for (const share of shares) for (const k of share) owners.set(k, (owners.get(k) ?? 0) + 1);
        expect([...owners.keys()].sort()).toEqual([...workers].sort());
        expect([...owners.values()].every((n) => n === 1)).toBe(true);
        const sizes = shares.map((s) => s.size);
        expect(Math.max(...sizes) - Math.min(...sizes)).toBeLessThanOrEqual(1);
      }),
    );
  });

  test("away: the workers outside the home share; none when alone", () => {
    const workers = ["w0", "w1", "w2", "w3"].map((key) => ({ key }));
    const away = new AwayWorkers();
    const a = away.of(workers, { self: "a", peers: ["b"] });
    expect(workers.map((w) => a(w.key))).toEqual([false, true, false, true]);
    const b = new AwayWorkers().of(workers, { self: "b", peers: ["a"] });
    expect(workers.map((w) => b(w.key))).toEqual([true, false, true, false]);
    // The peer left: every worker is home again.
    expect(workers.map((w) => away.of(workers, { self: "a", peers: [] })(w.key))).toEqual([false, false, false, false]);
    expect(workers.map((w) => away.of(workers, undefined)(w.key))).toEqual([false, false, false, false]);
    // A third replica re-deals the shares.
    const three = away.of(workers, { self: "a", peers: ["b", "c"] });
    expect(workers.map((w) => three(w.key))).toEqual([false, true, true, false]);
  });
});
