import { describe, expect, test } from "bun:test";
import { DEFAULT_TIMING } from "../upstream.ts";
import type { TraceRecord } from "../trace.ts";
import { cacheBounds } from "./bounds.ts";
import { EventQueue } from "./event-queue.ts";
import type { SimRequest } from "./request.ts";
import { SimWorker, type Admitted } from "./worker.ts";

const rec = (hashIds: number[], inputLength = hashIds.length * 512): TraceRecord => ({ timestamp: 0, inputLength, outputLength: 4, hashIds });

describe("pooled-cache bounds", () => {
  test("the unbounded cache misses only a block's first sight; a pooled cache too small for the trace misses more", () => {
    // 512-token trace blocks at block size 16: 32 router blocks each.
    const trace = [rec([1, 2]), rec([1, 2, 3]), rec([4]), rec([1, 2, 3, 5])];
    const big = cacheBounds(trace, { workers: 2, capacityBlocks: 1000, blockSize: 16 });
    // Hits: 0, 2 trace blocks, 0, 3 trace blocks of 2 + 3 + 1 + 4 = 10.
    expect(big.unbounded).toBeCloseTo(5 / 10, 9);
    expect(big.pooledLru).toBeCloseTo(big.unbounded, 9);
    // Room for 3 trace blocks (96 router blocks) in all: [4] evicts the tail of [1,2,3] before the last request.
    const small = cacheBounds(trace, { workers: 2, capacityBlocks: 48, blockSize: 16 });
    expect(small.unbounded).toBe(big.unbounded);
    expect(small.pooledLru).toBeLessThan(small.unbounded);
    expect(small.pooledLru).toBeGreaterThan(0);
  });
});

describe("the TTFT a request would see", () => {
  const tokens = (n: number, seed: number) => Uint32Array.from({ length: n }, (_, i) => seed * 100_000 + i + 1);
  const request = (id: number, t: Uint32Array, outputTokens: number): SimRequest => ({
    id,
    arrivalMs: 0,
    promptTokens: t.length,
    outputTokens,
    requestBlocks: Math.floor(t.length / 16),
    tokens: t,
    localHashes: new BigUint64Array(0),
  });

  test("predicted before the submit, it is what the simulated worker then measures: queue wait plus prefill of the uncached part", () => {
    const queue = new EventQueue();
    const admitted: Admitted[] = [];
    const w = new SimWorker(0, { blockSize: 16, capacityBlocks: 1000, timing: { ...DEFAULT_TIMING, maxRunning: 1 } }, queue, {
      onAdmitted: (a) => admitted.push(a),
      onFinished: () => {},
    });
    // 20 full blocks and a partial one (a prompt of whole blocks would recompute its last, as vLLM does).
    const a = tokens(330, 1);
    // Idle worker, cold cache: the whole prompt is prefilled.
    expect(w.ttftIfSubmitted(a, 0, 0)).toBe(DEFAULT_TIMING.prefillBaseMs + 330 * DEFAULT_TIMING.prefillMsPerToken);
    w.submit(request(1, a, 50), 0);
    const b = tokens(160, 2);
    w.submit(request(2, b, 30), 0); // waits behind request 1
    // A third request with request 1's prompt waits for both, and finds that prompt cached.
    const c = a.slice();
    const predicted = w.ttftIfSubmitted(c, 320, 0);
    w.submit(request(3, c, 10), 0);
    queue.runUntil(Number.POSITIVE_INFINITY);
    const third = admitted.find((x) => x.req.id === 3)!;
    expect(third.cachedTokens).toBe(320);
    expect(third.admittedMs + third.ttftMs).toBeCloseTo(predicted, 6);
    expect(predicted).toBeGreaterThan(w.timing.prefillMs(330, 320));
  });
});
