import { describe, expect, test } from "bun:test";
import fc from "fast-check";
import { EvictionRegret, FollowerWeight, REGRET_SATURATION } from "./eviction-regret.ts";
import { LatencyModel } from "./latency.ts";

const A = { workerId: "a", dpRank: 0 };
const B = { workerId: "b", dpRank: 0 };
const hashes = (from: number, n: number) => Array.from({ length: n }, (_, i) => BigInt(from + i) * 0x9e3779b97f4a7c15n & 0xffffffffffffffffn);

describe("EvictionRegret", () => {
  test("fresh blocks keep it at 0; blocks a rank stores again after evicting them raise it", () => {
    const r = new EvictionRegret(1 << 12);
    r.stored(A, hashes(0, 1000));
    expect(r.share).toBe(0);
    r.removed(A, hashes(0, 1000));
    r.stored(A, hashes(0, 1000));
    expect(r.share).toBeGreaterThan(0.04); // 1000 of 2000 blocks, the newest weigh most
    expect(r.observed).toBe(2000);
    const high = r.share;
    r.stored(A, hashes(5000, 5000));
    expect(r.share).toBeLessThan(high); // decays as fresh blocks come
  });

  test("a block is regretted once per eviction, and only on the rank that evicted it", () => {
    const r = new EvictionRegret(1 << 12);
    r.removed(A, hashes(0, 100));
    r.stored(B, hashes(0, 100)); // another rank computing them is not this cache's loss
    expect(r.share).toBe(0);
    r.stored(A, hashes(0, 100));
    const once = r.share;
    expect(once).toBeGreaterThan(0);
    r.stored(A, hashes(0, 100)); // a second copy: not evicted since
    expect(r.share).toBeLessThan(once);
  });

  test("a share in [0, 1] whatever hashes arrive, over a table of fixed size (property)", () => {
    fc.assert(
      fc.property(fc.array(fc.bigInt({ min: 0n, max: (1n << 64n) - 1n }), { maxLength: 200 }), (hs) => {
        const r = new EvictionRegret(1 << 4);
        r.removed(A, hs);
        r.stored(A, hs);
        expect(r.share).toBeGreaterThanOrEqual(0);
        expect(r.share).toBeLessThanOrEqual(1);
      }),
    );
    expect(() => new EvictionRegret(1000)).toThrow(RangeError);
  });
});

describe("FollowerWeight", () => {
  test("the base while nothing is regretted, the max from the saturation on, in proportion between", () => {
    const r = new EvictionRegret(1 << 12);
    const w = new FollowerWeight(1, 6, r);
    expect(w.value).toBe(1);
    let k = 0;
    while (r.share < REGRET_SATURATION / 2) {
      r.removed(A, hashes(k, 1));
      r.stored(A, hashes(k++, 1));
    }
    expect(w.value).toBeCloseTo(1 + 5 * (r.share / REGRET_SATURATION), 9);
    expect(w.value).toBeGreaterThan(3.4);
    while (r.share < REGRET_SATURATION) {
      r.removed(A, hashes(k, 1));
      r.stored(A, hashes(k++, 1));
    }
    expect(w.value).toBe(6);
    expect(new FollowerWeight(3, 3, r).value).toBe(3); // equal: fixed
    expect(() => new FollowerWeight(2, 1)).toThrow(RangeError);
  });

  test("the latency cost reads the weight at each cost", () => {
    const r = new EvictionRegret(1 << 12);
    const m = new LatencyModel({ baseMs: 0, msPerToken: 1, msPerWaiting: 0 }, new FollowerWeight(1, 6, r));
    const t = { promptTokens: 40, uncachedTokens: 10, aheadTokens: 0, waiting: 0 };
    expect(m.costMs(t)).toBe(20);
    for (let k = 0; r.share < REGRET_SATURATION; k++) {
      r.removed(A, hashes(k, 1));
      r.stored(A, hashes(k, 1));
    }
    expect(m.costMs(t)).toBe(70);
    expect(new LatencyModel({ baseMs: 0, msPerToken: 1, msPerWaiting: 0 }, 2).costMs(t)).toBe(30);
    // Outside the home share: the away weight x the whole prompt's prefill on top.
    expect(new LatencyModel({ baseMs: 0, msPerToken: 1, msPerWaiting: 0 }, 2, 0.5).costMs(t, true)).toBe(30 + 20);
  });
});
