import { describe, expect, test } from "bun:test";
import fc from "fast-check";
import { DEFAULT_TIMING, idleTtftMs } from "@kv-epp/mock-worker";
import { POLICY_NAMES } from "../policies/index.ts";
import type { TraceRecord } from "../trace.ts";
import { beladyHits, cacheBounds, ttftP50Bound } from "./bounds.ts";
import { EventQueue } from "./event-queue.ts";
import { replayPolicy } from "./replay.ts";
import type { SimRequest } from "./request.ts";
import { SimWorker, type FirstToken } from "./worker.ts";

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
    // The optimum of the same capacity keeps what is used again soonest: never below the LRU, never above unbounded.
    expect(small.pooledOptimal).toBeGreaterThanOrEqual(small.pooledLru);
    expect(small.pooledOptimal).toBeLessThanOrEqual(small.unbounded);
    expect(big.pooledOptimal).toBeCloseTo(big.unbounded, 9);
  });

  test("Belady's rule with bypass: a block never used again takes no slot, the one used furthest ahead leaves first", () => {
    const all = (n: number) => Array.from({ length: n }, () => true);
    // One slot: a b a b a. Keeping a (used again at 2 and 4) and bypassing b hits a twice.
    expect(beladyHits([0, 1, 0, 1, 0], all(5), 2, 1)).toBe(2);
    // Two slots hold both: every repeat hits.
    expect(beladyHits([0, 1, 0, 1, 0], all(5), 2, 2)).toBe(3);
    // A hit where no worker could reuse the block (a prompt's last block) is not counted.
    expect(beladyHits([0, 0], [true, false], 1, 1)).toBe(0);
  });

  test("the optimum hits at least as often as an LRU of the same size on any access sequence", () => {
    fc.assert(
      fc.property(fc.array(fc.integer({ min: 0, max: 7 }), { maxLength: 60 }), fc.integer({ min: 1, max: 5 }), (seq, capacity) => {
        const lru: number[] = [];
        let lruHits = 0;
        for (const k of seq) {
          const at = lru.indexOf(k);
          if (at >= 0) {
            lruHits++;
            lru.splice(at, 1);
          } else if (lru.length >= capacity) lru.shift();
          lru.push(k);
        }
        expect(beladyHits(seq, seq.map(() => true), 8, capacity)).toBeGreaterThanOrEqual(lruHits);
      }),
    );
  });

  test("the TTFT p50 bound: the cheapest half of the requests within the hit budget", () => {
    const timing = DEFAULT_TIMING;
    // Three requests of 1000 tokens: the p50 (nearest rank) is the second lowest.
    // Unlimited budget and hits: two of them fully cached down to one computed token.
    expect(ttftP50Bound([1000, 1000, 1000], [992, 992, 992], 1e9, timing, 16)).toBe(idleTtftMs(timing, 8, 0));
    // No hits possible: the whole prompt.
    expect(ttftP50Bound([1000, 1000, 1000], [0, 0, 0], 1e9, timing, 16)).toBe(idleTtftMs(timing, 1000, 0));
    // A budget of 1000 tokens for two requests: 500 each, so 500 stay uncached.
    expect(ttftP50Bound([1000, 1000, 1000], [992, 992, 992], 1000, timing, 16)).toBe(idleTtftMs(timing, 504, 0));
  });

  test("no policy passes a bound: with eviction heavy enough that policies pass the pooled LRU, each stays under the pooled optimum and above the TTFT p50 bound", () => {
    const trace = conversations(8, 4);
    const opts = { workers: 3, capacityBlocks: 160, blockSize: 16 };
    const b = cacheBounds(trace, { ...opts, timing: DEFAULT_TIMING });
    const rates = POLICY_NAMES.map((policy) => {
      const r = replayPolicy(trace, policy, {
        ...opts, timeScale: 1, replicas: 1, replicaAgg: true, eventLagMs: 10, seed: 1, timing: DEFAULT_TIMING,
        weights: { prefillLoadScale: 16, decodeLoadScale: 1, queueWeight: 0, temperature: 0 }, bucketMs: 10_000,
      });
      expect(r.hitRate).toBeLessThanOrEqual(b.pooledOptimal + 1e-12);
      expect(r.ttftP50Ms).toBeGreaterThanOrEqual(b.ttftP50BoundMs);
      return r.hitRate;
    });
    // The scenario is one where the pooled LRU is no bound.
    expect(Math.max(...rates)).toBeGreaterThan(b.pooledLru);
  }, 60_000);
});

/** Conversations of `turns` turns, each turn extending the last by two trace blocks, 5 s apart. */
function conversations(n: number, turns: number): TraceRecord[] {
  const out: TraceRecord[] = [];
  let nextId = 1;
  const convs = Array.from({ length: n }, () => [0] as number[]);
  for (let t = 0; t < turns; t++)
    convs.forEach((ids, c) => {
      ids.push(nextId++, nextId++);
      out.push({ timestamp: t * 5000 + c * 50, inputLength: ids.length * 512 - 100, outputLength: 20, hashIds: [...ids] });
    });
  return out.sort((a, b) => a.timestamp - b.timestamp);
}

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

  test("predicted before the submit, it is what the simulated worker then measures: the steps ahead of it, then its own prefill of the uncached part", () => {
    const queue = new EventQueue();
    const first: FirstToken[] = [];
    const w = new SimWorker(0, { blockSize: 16, capacityBlocks: 1000, timing: { ...DEFAULT_TIMING, maxNumSeqs: 2, maxNumBatchedTokens: 256 } }, queue, {
      onFirstToken: (f) => first.push(f),
      onFinished: () => {},
    });
    // 20 full blocks and a partial one (a prompt of whole blocks would recompute its last, as vLLM does).
    const a = tokens(330, 1);
    // Idle worker, cold cache: the whole prompt, in chunks of the token budget.
    expect(w.ttftIfSubmitted(a, 0, 0)).toBe(idleTtftMs(w.timing, 330, 0));
    w.submit(request(1, a, 50), 0);
    const b = tokens(160, 2);
    w.submit(request(2, b, 30), 0); // shares request 1's second step
    queue.runUntil(5);
    // A third request with request 1's prompt waits for a running slot, and finds that prompt cached.
    const c = a.slice();
    const predicted = w.ttftIfSubmitted(c, 320, 5);
    w.submit(request(3, c, 10), 5);
    queue.runUntil(Number.POSITIVE_INFINITY);
    const third = first.find((x) => x.req.id === 3)!;
    expect(third.cachedTokens).toBe(320);
    expect(third.atMs - 5).toBeCloseTo(predicted, 6);
    expect(predicted).toBeGreaterThan(idleTtftMs(w.timing, 330, 320) + 29 * DEFAULT_TIMING.stepBaseMs);
    // A limit below the answer gives up.
    expect(w.ttftIfSubmitted(c, 320, third.atMs, 1)).toBe(Number.POSITIVE_INFINITY);
  });
});
