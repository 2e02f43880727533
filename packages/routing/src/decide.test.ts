import { describe, expect, test } from "bun:test";
import fc from "fast-check";
import { costs, type CostShape, type Weights } from "./cost.ts";
import { decide, overlapOf, ttftInput, type CandidateState } from "./decide.ts";

// Pods with one or two target ports; a subset hint names pod IPs (GAIE matches the hint by IP).
const ips = ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4", "10.0.0.5", "10.0.0.6"];
const endpoints = ips.flatMap((ip, i) => (i % 2 === 0 ? [`${ip}:8000`, `${ip}:8001`] : [`${ip}:8000`]));
const ipOf = (endpoint: string) => endpoint.slice(0, endpoint.lastIndexOf(":"));

const candidate = fc.record({
  endpoint: fc.constantFrom(...endpoints),
  overlap: fc.integer({ min: 0, max: 80 }),
  // In-flight prefixes: absent (off), or the leading blocks pending on the candidate.
  pendingOverlap: fc.option(fc.integer({ min: 0, max: 80 }), { nil: undefined }),
  activeBlocks: fc.integer({ min: 0, max: 2000 }),
  activeRequests: fc.integer({ min: 0, max: 40 }),
  waiting: fc.integer({ min: 0, max: 10 }),
});
const weights: fc.Arbitrary<Weights> = fc.record({
  prefillLoadScale: fc.integer({ min: 0, max: 64 }),
  decodeLoadScale: fc.integer({ min: 0, max: 4 }),
  queueWeight: fc.integer({ min: 0, max: 100 }),
  temperature: fc.constant(0),
  shape: fc.oneof(
    fc.constant<CostShape>({ kind: "blocks" }),
    fc.record({
      kind: fc.constant("score" as const),
      prefix: fc.integer({ min: 0, max: 8 }),
      load: fc.integer({ min: 0, max: 8 }),
      loadBy: fc.constantFrom("requests" as const, "blocks" as const),
      prefixCapBlocks: fc.integer({ min: 0, max: 64 }),
    }),
  ),
});
const input = fc.record({
  requestBlocks: fc.integer({ min: 0, max: 64 }),
  candidates: fc.array(candidate, { minLength: 1, maxLength: 12 }),
  weights,
  queueThreshold: fc.integer({ min: 0, max: 8 }),
  subset: fc.option(fc.subarray(ips, { minLength: 1 }), { nil: undefined }),
  r: fc.double({ min: 0, max: 0.999999, noNaN: true }),
});

/** The candidates the filters let through, computed the long way. */
function allowed(cs: readonly CandidateState[], subset: readonly string[] | undefined, threshold: number): CandidateState[] {
  const inSubset = subset ? cs.filter((c) => subset.includes(ipOf(c.endpoint))) : [...cs];
  if (threshold <= 0) return inSubset;
  const under = inSubset.filter((c) => c.waiting <= threshold);
  return under.length > 0 ? under : inSubset;
}

describe("decide", () => {
  test("the choice minimises the cost, under either shape, over the candidates the subset and queue filters allow", () => {
    fc.assert(
      fc.property(input, ({ requestBlocks, candidates, weights, queueThreshold, subset, r }) => {
        const d = decide({ requestBlocks, candidates, weights, queueThreshold, subset: subset && new Set(subset), random: () => r });
        const ok = allowed(candidates, subset, queueThreshold);
        if (ok.length === 0) {
          expect(d).toEqual({ kind: "none", reason: "subset_empty" });
          return;
        }
        if (d.kind !== "chosen") throw new Error(`expected a choice, got ${d.reason}`);
        expect(d.scored.map((s): CandidateState => s.candidate)).toEqual(ok);
        // The blocks counted as cached: the index's overlap or the pending one, the longer. The score shape
        // normalises over the candidates that passed the filters, so the costs are of those.
        const counted = (c: CandidateState) => ({ ...c, overlap: Math.max(c.overlap, c.pendingOverlap ?? 0) });
        const expected = costs(weights, requestBlocks, ok.map(counted));
        expect(d.scored.map((s) => s.cost)).toEqual(expected);
        expect(d.chosen.cost).toBe(Math.min(...expected));
      }),
    );
  });

  test("under the latency cost the choice minimises the predicted TTFT, within the same filters", () => {
    fc.assert(
      fc.property(input, fc.integer({ min: 1, max: 50 }), ({ requestBlocks, candidates, weights, queueThreshold, subset, r }, msPerBlock) => {
        const ttft = (c: CandidateState) => c.waiting * 40 + Math.max(requestBlocks - c.overlap, 0) * msPerBlock;
        const d = decide({ requestBlocks, candidates, weights, queueThreshold, subset: subset && new Set(subset), random: () => r, latency: ttft });
        const ok = allowed(candidates, subset, queueThreshold);
        if (d.kind !== "chosen") return expect(ok).toEqual([]);
        expect(d.chosen.cost).toBe(Math.min(...ok.map(ttft)));
      }),
    );
  });

  test("a subset hint is never left: the chosen endpoint is on a pod the gateway named", () => {
    fc.assert(
      fc.property(input, ({ requestBlocks, candidates, weights, subset, r }) => {
        fc.pre(subset !== undefined);
        const d = decide({ requestBlocks, candidates, weights, queueThreshold: 0, subset: new Set(subset), random: () => r });
        if (d.kind === "chosen") expect(subset).toContain(ipOf(d.chosen.candidate.endpoint));
        else expect(candidates.some((c) => subset!.includes(ipOf(c.endpoint)))).toBe(false);
      }),
    );
  });

  test("a worker over the queue threshold is chosen only when every allowed worker is over it", () => {
    fc.assert(
      fc.property(input, ({ requestBlocks, candidates, weights, queueThreshold, r }) => {
        fc.pre(queueThreshold > 0);
        const d = decide({ requestBlocks, candidates, weights, queueThreshold, random: () => r });
        if (d.kind !== "chosen") throw new Error("no choice");
        if (d.chosen.candidate.waiting > queueThreshold) expect(candidates.every((c) => c.waiting > queueThreshold)).toBe(true);
      }),
    );
  });

  test("no candidates: no_workers, whatever the subset", () => {
    const w = { prefillLoadScale: 16, decodeLoadScale: 1, queueWeight: 0, temperature: 0 };
    expect(decide({ requestBlocks: 4, candidates: [], weights: w, queueThreshold: 0, subset: new Set(["x"]), random: Math.random })).toEqual({
      kind: "none",
      reason: "no_workers",
    });
  });

  test("pending blocks count as cached exactly as the index's overlap does, and never raise a cost", () => {
    fc.assert(
      fc.property(input, ({ requestBlocks, candidates, weights, r }) => {
        const asIndexed = candidates.map((c) => ({ endpoint: c.endpoint, overlap: overlapOf(c), activeBlocks: c.activeBlocks, activeRequests: c.activeRequests, waiting: c.waiting }));
        const withoutPending = candidates.map((c) => ({ ...c, pendingOverlap: undefined }));
        const run = (cs: CandidateState[]) => decide({ requestBlocks, candidates: cs, weights, queueThreshold: 0, random: () => r });
        const d = run(candidates), same = run(asIndexed), none = run(withoutPending);
        if (d.kind !== "chosen" || same.kind !== "chosen" || none.kind !== "chosen") throw new Error("no choice");
        expect(d.scored.map((s) => s.cost)).toEqual(same.scored.map((s) => s.cost));
        expect(d.chosen.candidate.endpoint).toBe(same.chosen.candidate.endpoint);
        d.scored.forEach((s, i) => expect(s.cost).toBeLessThanOrEqual(none.scored[i]!.cost));
      }),
    );
  });

  test("score shape: the longer overlap wins at equal load, the lower load at equal overlap, and a long cached prefix outweighs the load span", () => {
    const w: Weights = { prefillLoadScale: 16, decodeLoadScale: 1, queueWeight: 0, temperature: 0, shape: { kind: "score", prefix: 3, load: 2, loadBy: "requests", prefixCapBlocks: 256 } };
    const pick = (requestBlocks: number, cs: CandidateState[]) => {
      const d = decide({ requestBlocks, candidates: cs, weights: w, queueThreshold: 0, random: () => 0.5 });
      return d.kind === "chosen" ? d.chosen.candidate.endpoint : d.reason;
    };
    const at = (endpoint: string, overlap: number, activeRequests: number) => ({ endpoint, overlap, activeBlocks: 0, activeRequests, waiting: 0 });
    expect(pick(20, [at("a", 10, 4), at("b", 2, 4)])).toBe("a");
    expect(pick(20, [at("a", 2, 9), at("b", 2, 4)])).toBe("b");
    // 3 x 20/20 beats 2 x the whole load span; only the cap's share counts on a 1000-block request.
    expect(pick(20, [at("a", 20, 30), at("b", 0, 0)])).toBe("a");
    expect(pick(1000, [at("a", 256, 30), at("b", 10, 0)])).toBe("a");
    // A small cached share does not: 3 x 4/20 < 2.
    expect(pick(20, [at("a", 4, 30), at("b", 0, 0)])).toBe("b");
  });

  test("more cached blocks wins at equal load; more load loses at equal overlap", () => {
    const w = { prefillLoadScale: 16, decodeLoadScale: 1, queueWeight: 0, temperature: 0 };
    const a = { endpoint: "a", overlap: 10, activeBlocks: 100, activeRequests: 1, waiting: 0 };
    const b = { endpoint: "b", overlap: 2, activeBlocks: 100, activeRequests: 1, waiting: 0 };
    const pick = (cs: CandidateState[]) => {
      const d = decide({ requestBlocks: 20, candidates: cs, weights: w, queueThreshold: 0, random: () => 0.5 });
      return d.kind === "chosen" ? d.chosen.candidate.endpoint : d.reason;
    };
    expect(pick([a, b])).toBe("a");
    expect(pick([{ ...a, overlap: 2, activeBlocks: 300 }, b])).toBe("b");
  });

  test("the latency model's queue term counts only the scraped waiting requests beyond the ones the load holds as prefilling there", () => {
    const c = { endpoint: "10.0.0.1:8000", overlap: 2, activeBlocks: 9, activeRequests: 3, prefillBlocks: 5, prefillRequests: 2 };
    expect(ttftInput({ ...c, waiting: 3 }, 64, 16)).toEqual({ promptTokens: 64, uncachedTokens: 32, aheadTokens: 80, waiting: 1 });
    // The load's prefilling requests may be running, not waiting: never below zero.
    expect(ttftInput({ ...c, waiting: 1 }, 64, 16).waiting).toBe(0);
    expect(ttftInput({ ...c, prefillRequests: undefined, waiting: 1 }, 64, 16).waiting).toBe(1);
  });
});
