import { describe, expect, test } from "bun:test";
import fc from "fast-check";
import { choose, cost, costs, prefixLeadLoss, SCORE_SHAPE, type CostShape, type ShapedLoad } from "./cost.ts";

const W = { prefillLoadScale: 1, decodeLoadScale: 1, queueWeight: 0, temperature: 0 };

describe("cost and choice", () => {
  test("score shape: prefixLeadLoss bounds what a holder's prefix lead loses on a prompt of any other length", () => {
    fc.assert(
      fc.property(
        fc.record({ cap: fc.nat(40), held: fc.integer({ min: 1, max: 60 }), other: fc.nat(59), est: fc.nat(80), whole: fc.nat(400), more: fc.nat(400) }),
        ({ cap, held, other, est, whole, more }) => {
          const shape = { ...SCORE_SHAPE, prefixCapBlocks: cap };
          const o = Math.min(other, held - 1);
          const at = (overlap: number) => ({ overlap, activeBlocks: 0, waiting: 0, activeRequests: 0 });
          // The lead of the rank holding `h` blocks over the one holding o, on a request of R blocks (loads equal).
          const lead = (R: number, h: number) => {
            const [c, s] = costs({ ...W, shape }, R, [at(h), at(o)]);
            return s! - c!;
          };
          // Estimated at held + est blocks; the whole prompt has at least the known prefix, and its holder may hold more.
          const R = held + whole;
          expect(lead(R, Math.min(held + more, R))).toBeGreaterThanOrEqual(lead(held + est, held) - prefixLeadLoss(shape, held + est, held, o) - 1e-9);
        },
      ),
    );
  });

  test("cost = prefill_load_scale * max(request_blocks - overlap, 0) + decode load", () => {
    expect(cost({ ...W, prefillLoadScale: 2 }, 10, { overlap: 4, activeBlocks: 3, waiting: 0 })).toBe(2 * 6 + 3);
    expect(cost(W, 10, { overlap: 12, activeBlocks: 0, waiting: 0 })).toBe(0);
    expect(cost({ ...W, queueWeight: 5 }, 0, { overlap: 0, activeBlocks: 0, waiting: 2 })).toBe(10);
  });

  test("score shape: prefix x cached share of min(request blocks, cap) + load x (max - own) / (max - min), negated", () => {
    const shape: CostShape = { kind: "score", prefix: 3, load: 2, loadBy: "requests", prefixCapBlocks: 8 };
    const cs: ShapedLoad[] = [
      { overlap: 2, activeBlocks: 0, activeRequests: 1, waiting: 0 },
      { overlap: 8, activeBlocks: 0, activeRequests: 5, waiting: 0 },
      { overlap: 20, activeBlocks: 0, activeRequests: 3, waiting: 1 },
    ];
    // 20 request blocks, capped at 8: 2/8, 8/8 and (capped) 8/8 cached; loads 1, 5, 3 over a span of 4.
    expect(costs({ ...W, shape }, 20, cs)).toEqual([-(3 * 0.25 + 2 * 1), -(3 * 1 + 0), -(3 * 1 + 2 * 0.5)]);
    // Under the cap the share is of the request's own blocks; no cap: of all of them; a queue weight adds per waiting request.
    expect(costs({ ...W, shape }, 4, [cs[0]!])).toEqual([-(3 * 0.5 + 2)]);
    expect(costs({ ...W, shape: { ...shape, prefixCapBlocks: 0 } }, 20, [cs[1]!])).toEqual([-(3 * 0.4 + 2)]);
    expect(costs({ ...W, queueWeight: 0.5, shape }, 20, [cs[2]!])).toEqual([0.5 - (3 + 2)]);
    // By blocks: the active blocks are the load.
    const byBlocks = costs({ ...W, shape: { ...shape, loadBy: "blocks" } }, 0, [
      { overlap: 0, activeBlocks: 10, activeRequests: 9, waiting: 0 },
      { overlap: 0, activeBlocks: 30, activeRequests: 1, waiting: 0 },
    ]);
    expect(byBlocks).toEqual([-2, 0]);
  });

  test("score shape: both terms lie in [0, 1] and scaling every load leaves the costs unchanged", () => {
    const load = fc.record({ overlap: fc.nat(300), activeBlocks: fc.nat(5000), activeRequests: fc.nat(60), waiting: fc.constant(0) });
    fc.assert(
      fc.property(fc.array(load, { minLength: 1, maxLength: 12 }), fc.nat(300), fc.integer({ min: 2, max: 9 }), fc.constantFrom<"requests" | "blocks">("requests", "blocks"), (cs, blocks, k, loadBy) => {
        const w = { ...W, shape: { ...SCORE_SHAPE, loadBy } };
        const c = costs(w, blocks, cs);
        for (const x of c) expect(-x).toBeGreaterThanOrEqual(0), expect(-x).toBeLessThanOrEqual(5 + 1e-9);
        const scaled = costs(w, blocks, cs.map((x) => ({ ...x, activeBlocks: x.activeBlocks * k, activeRequests: x.activeRequests * k })));
        scaled.forEach((x, i) => expect(x).toBeCloseTo(c[i]!, 12));
      }),
    );
  });

  test("blocks shape: costs() is cost() per candidate", () => {
    const cs = [
      { overlap: 4, activeBlocks: 3, activeRequests: 1, waiting: 2 },
      { overlap: 0, activeBlocks: 9, activeRequests: 2, waiting: 0 },
    ];
    const w = { ...W, queueWeight: 3, shape: { kind: "blocks" } as const };
    expect(costs(w, 10, cs)).toEqual(cs.map((c) => cost(w, 10, c)));
  });

  test("temperature 0 always picks a minimum-cost candidate", () => {
    fc.assert(
      fc.property(fc.array(fc.integer({ min: 0, max: 50 }), { minLength: 1, maxLength: 20 }), fc.double({ min: 0, max: 0.999999, noNaN: true }), (costs, r) => {
        const i = choose(costs, 0, () => r);
        expect(costs[i]).toBe(Math.min(...costs));
      }),
    );
  });

  test("ties are broken at random over every tied candidate", () => {
    const seen = new Set<number>();
    let s = 1;
    const random = () => ((s = (s * 48271) % 2147483647) / 2147483647);
    for (let k = 0; k < 400; k++) seen.add(choose([3, 1, 1, 5, 1], 0, random));
    expect(seen).toEqual(new Set([1, 2, 4]));
  });

  test("with a temperature, lower cost is chosen more often but not always", () => {
    let s = 7;
    const random = () => ((s = (s * 48271) % 2147483647) / 2147483647);
    const counts = [0, 0];
    for (let k = 0; k < 2000; k++) counts[choose([0, 10], 0.5, random)]!++;
    expect(counts[0]!).toBeGreaterThan(counts[1]!);
    expect(counts[1]!).toBeGreaterThan(0);
  });
});
