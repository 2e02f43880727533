import { describe, expect, test } from "bun:test";
import { DEFAULT_TIMING } from "@kv-epp/mock-worker";
import type { TraceRecord } from "../trace.ts";
import { replayPd, type PdOptions } from "./pd-replay.ts";

const OPTS: PdOptions = {
  prefillWorkers: 2,
  decodeWorkers: 2,
  transferMsPerBlock: 0.1,
  thresholdTokens: 512,
  capacityBlocks: 4000,
  blockSize: 16,
  timeScale: 1,
  replicas: 1,
  replicaAgg: true,
  eventLagMs: 5,
  seed: 3,
  timing: DEFAULT_TIMING,
  weights: { prefillLoadScale: 1, decodeLoadScale: 1, queueWeight: 0, temperature: 0 },
  inflightPrefix: "own",
  bucketMs: 10_000,
};

/** Six conversations of three turns, each turn adding two 512-token blocks to its conversation's prefix. */
function turns(): TraceRecord[] {
  const out: TraceRecord[] = [];
  let next = 100;
  const convs = Array.from({ length: 6 }, () => [] as number[]);
  for (let t = 0; t < 3; t++)
    convs.forEach((ids, c) => {
      ids.push(next++, next++);
      out.push({ timestamp: t * 4000 + c * 300, inputLength: ids.length * 512 - 40, outputLength: 12, hashIds: [...ids] });
    });
  return out.sort((a, b) => a.timestamp - b.timestamp);
}

describe("a P/D pool in the simulation", () => {
  for (const policy of ["llm-d", "kv-epp"] as const)
    test(`${policy}: prompts with more than the threshold uncached are prefilled on a prefill worker, then read`, () => {
      const r = replayPd(turns(), policy, OPTS);
      expect(r.requests).toBe(18);
      // Every turn brings 1024 new tokens: over the threshold wherever it goes.
      expect(r.disaggregated).toBe(18);
      expect(r.transferP50Ms).toBeGreaterThan(0);
      // A later turn finds its conversation's earlier turns on the prefill worker that computed them.
      expect(r.hitRate).toBeGreaterThan(0);
      expect(r.ttftP50Ms).toBeGreaterThan(r.transferP50Ms);
    });

  test("threshold 0 never disaggregates: every request runs whole on its decode worker", () => {
    const r = replayPd(turns(), "kv-epp", { ...OPTS, thresholdTokens: 0 });
    expect(r.disaggregated).toBe(0);
    expect(Number.isNaN(r.transferP50Ms) || r.transferP50Ms === 0).toBe(true);
    expect(r.prefillImbalance).toBeLessThanOrEqual(1);
  });

  test("a threshold above every prompt keeps them local; the decode workers' hits count", () => {
    const r = replayPd(turns(), "kv-epp", { ...OPTS, thresholdTokens: 100_000 });
    expect(r.disaggregated).toBe(0);
    expect(r.hitRate).toBeGreaterThan(0);
  });

  test("two routers sharing their load over replica-agg route every request, the same way on every run", () => {
    const a = replayPd(turns(), "kv-epp", { ...OPTS, replicas: 2 });
    const b = replayPd(turns(), "kv-epp", { ...OPTS, replicas: 2 });
    expect(a.label).toBe("kv-epp P/D x2 agg");
    expect(a.requests).toBe(18);
    expect({ ...a, durationMs: 0 }).toEqual({ ...b, durationMs: 0 });
  });
});
