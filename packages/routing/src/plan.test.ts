import { describe, expect, test } from "bun:test";
import fc from "fast-check";
import { DEFAULT_WEIGHTS } from "./cost.ts";
import { decide, overlapOf } from "./decide.ts";
import { decideDisagg } from "./disagg.ts";
import { planCost, type PlanCandidate, type PlanInput } from "./plan.ts";

type Destination = PlanCandidate & { local: number };

/** The plan as it was: every destination scans every prefill rank (O(D x P) a pick), kept as the reference. */
function scanPlan(input: PlanInput, local: (c: Destination) => number): (c: Destination) => number {
  const { promptTokens, blockSize, thresholdTokens, msPerToken, prefillRanks, prefillCosts: remoteCosts } = input;
  const decodeLoadMs = (activeBlocks: number) => (DEFAULT_WEIGHTS.decodeLoadScale / DEFAULT_WEIGHTS.prefillLoadScale) * activeBlocks * blockSize * msPerToken;
  return (c) => {
    let cheapest = Infinity;
    let others = 0;
    for (let i = 0; i < prefillRanks.length; i++)
      if (prefillRanks[i]!.ref.workerId !== c.ref.workerId) {
        others++;
        if (remoteCosts[i]! < cheapest) cheapest = remoteCosts[i]!;
      }
    const v = decideDisagg({ promptTokens, decodeOverlap: overlapOf(c), blockSize, thresholdTokens, prefillCandidates: others });
    if (!v.disaggregate) return local(c) + decodeLoadMs(c.activeBlocks);
    const pulled = Math.ceil(v.uncachedTokens / blockSize);
    return cheapest + decodeLoadMs(c.activeBlocks + pulled);
  };
}

// Few workers, so destinations share workers with prefill ranks (`both` ranks, several ranks a worker),
// and few costs, so ranks tie; Infinity, and for a prefill rank NaN (which no scan ever takes as its cheapest).
const worker = fc.constantFrom("a", "b", "c", "d", "e");
const costValue = fc.oneof(fc.constantFrom(0, -0, 1, 2.5, 40, Infinity), fc.double({ min: 0, max: 1e4, noNaN: true }));
const destination = fc.record({
  workerId: worker,
  overlap: fc.nat(40),
  pendingOverlap: fc.nat(40),
  activeBlocks: fc.nat(500),
  waiting: fc.nat(3),
  local: costValue,
});
const cluster = fc.record({
  destinations: fc.array(destination, { minLength: 1, maxLength: 12 }),
  prefill: fc.array(fc.record({ workerId: worker, cost: fc.oneof(costValue, fc.constant(NaN)) }), { maxLength: 12 }),
  promptTokens: fc.nat(700),
  blockSize: fc.constantFrom(1, 4, 16),
  thresholdTokens: fc.constantFrom(0, 1, 8, 64, 512),
  msPerToken: fc.constantFrom(0, 0.1, 0.37),
  random: fc.double({ min: 0, max: 1, maxExcluded: true, noNaN: true }),
});

describe("a destination's plan cost", () => {
  test("property: the same cost for every destination, and so the same pick, as a scan of every prefill rank per destination", () => {
    fc.assert(
      fc.property(cluster, (k) => {
        const destinations: Destination[] = k.destinations.map((d, i) => ({ ...d, ref: { workerId: d.workerId }, endpoint: `10.0.0.${i}:8000`, activeRequests: 1 }));
        const input: PlanInput = {
          ...k,
          prefillRanks: k.prefill.map((p) => ({ ref: { workerId: p.workerId } })),
          prefillCosts: k.prefill.map((p) => p.cost),
        };
        const local = (c: Destination) => c.local;
        const plan = planCost(input, local);
        const reference = scanPlan(input, local);
        for (const c of destinations) expect(Object.is(plan(c), reference(c))).toBe(true);
        const pick = (latency: (c: Destination) => number) =>
          decide({ requestBlocks: 0, candidates: destinations, weights: { ...DEFAULT_WEIGHTS, queueWeight: 0, temperature: 0 }, queueThreshold: 0, random: () => k.random, latency });
        const [a, b] = [pick(plan), pick(reference)];
        if (a.kind !== "chosen" || b.kind !== "chosen") throw new Error("no candidate");
        expect(a.chosen.candidate).toBe(b.chosen.candidate);
      }),
      { numRuns: 2000 },
    );
  });
});
