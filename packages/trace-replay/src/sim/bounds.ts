// Hit-rate limits no routing can pass on a trace: every request served, in arrival order, by one prefix
// cache holding all the workers' capacity together (one LRU, nothing duplicated, no request ever
// routed away from its prefix), and by a cache that never evicts (only the first sight of a block
// misses).
import { PrefixCacheSim } from "../upstream.ts";
import { recordTokens } from "../tokens.ts";
import type { TraceRecord } from "../trace.ts";

export type CacheBounds = {
  /** cached / prompt tokens with one LRU of workers x capacityBlocks */
  pooledLru: number;
  /** cached / prompt tokens with an unbounded cache */
  unbounded: number;
};

export function cacheBounds(trace: readonly TraceRecord[], o: { workers: number; capacityBlocks: number; blockSize: number }): CacheBounds {
  const pooled = new PrefixCacheSim({ blockSize: o.blockSize, capacityBlocks: o.workers * o.capacityBlocks });
  // Capacity for every block of the trace: nothing is ever evicted.
  const allBlocks = trace.reduce((n, r) => n + Math.floor(r.inputLength / o.blockSize), 0);
  const unbounded = new PrefixCacheSim({ blockSize: o.blockSize, capacityBlocks: Math.max(1, allBlocks) });
  for (const rec of trace) {
    const tokens = recordTokens(rec);
    // Requests hold nothing past their own lookup: a bound, so no slot is ever pinned by a running one.
    pooled.release(pooled.acquire(tokens).lease);
    unbounded.release(unbounded.acquire(tokens).lease);
  }
  const rate = (c: PrefixCacheSim) => (c.queriedTokens > 0 ? c.hitTokens / c.queriedTokens : 0);
  return { pooledLru: rate(pooled), unbounded: rate(unbounded) };
}
