// Limits on a trace that no routing passes, and one reference that is not a limit.
//
// - pooled LRU (a reference): every request, in arrival order, served by one LRU prefix cache holding all
//   the workers' capacity together. Not a bound: one LRU over a working set much larger than itself
//   can do worse than caches split per worker (with heavy eviction every policy passes it).
// - pooled optimal (a bound on the hit rate): the same pooled capacity with Belady's offline rule
//   (on a miss, keep the block only if it is used again sooner than the cached block used furthest in
//   the future, which it then replaces), counting a hit on any cached block a worker could reuse, not
//   only a cached prefix. Why it bounds every routing: the union of the workers' caches never holds
//   more than workers x capacity blocks and gains a block only when a request computes it, so it is
//   one demand-filled cache of that size over the same accesses, and a worker's hit is a hit in it;
//   Belady's rule maximises the hits of such a cache. Valid for the arrival order (a request held in a
//   worker's queue is admitted later; at these loads requests rarely wait).
// - unbounded (a bound): a cache that never evicts, so only a block's first sight misses.
// - TTFT p50 bound: the lowest p50 any routing can reach. A request's TTFT is at least its prefill with
//   no wait; its cached prefix is at most what the unbounded cache finds, and all requests together hit
//   at most the pooled optimum's tokens. The bound is the smallest p50 for which the requests it needs
//   at or under it can be given their hits within that total.
import { chainBlockIds, DEFAULT_TIMING, idleTtftMs, PrefixCacheSim, type TimingParams } from "@kv-epp/mock-worker";
import { recordTokens } from "../tokens.ts";
import type { TraceRecord } from "../trace.ts";
import { adapterOf } from "./lora-mix.ts";
import { cacheIdentity } from "./request.ts";
import { percentileRank } from "./recorder.ts";

export type CacheBounds = {
  /** cached / prompt tokens with one LRU of workers x capacityBlocks (a reference, not a bound) */
  pooledLru: number;
  /** cached / prompt tokens of the same capacity under Belady's offline rule: no routing does better */
  pooledOptimal: number;
  /** cached / prompt tokens with an unbounded cache */
  unbounded: number;
  /** no routing's TTFT p50 is lower (virtual ms) */
  ttftP50BoundMs: number;
};

export type BoundsOptions = { workers: number; capacityBlocks: number; blockSize: number; timing?: Partial<TimingParams>; loraAdapters?: number };

export function cacheBounds(trace: readonly TraceRecord[], o: BoundsOptions): CacheBounds {
  const pooled = new PrefixCacheSim({ blockSize: o.blockSize, capacityBlocks: o.workers * o.capacityBlocks });
  const ids = new Map<bigint, number>();
  const seen = new Set<number>();
  /** Every block access of the trace in order (interned block ids), and whether a worker could reuse it there. */
  const access: number[] = [];
  const reusable: boolean[] = [];
  const prompts: number[] = [];
  const unboundedHits: number[] = [];
  let promptTokens = 0;
  for (const rec of trace) {
    const tokens = recordTokens(rec);
    const identity = cacheIdentity({ adapter: adapterOf(rec, o.loraAdapters ?? 0) });
    // Requests hold nothing past their own lookup, so no slot is ever pinned by a running one.
    pooled.release(pooled.acquire(tokens, identity).lease);
    const blocks = chainBlockIds(tokens, o.blockSize, identity);
    // As the worker's cache: the last prompt token is always computed, so the block holding it never hits.
    const maxHit = Math.min(blocks.length, tokens.length > 0 ? Math.floor((tokens.length - 1) / o.blockSize) : 0);
    let prefix = 0;
    let prefixOpen = true;
    blocks.forEach((b, i) => {
      let id = ids.get(b.hash);
      if (id === undefined) ids.set(b.hash, (id = ids.size));
      if (prefixOpen && i < maxHit && seen.has(id)) prefix++;
      else prefixOpen = false;
      seen.add(id);
      access.push(id);
      reusable.push(i < maxHit);
    });
    prompts.push(tokens.length);
    unboundedHits.push(prefix * o.blockSize);
    promptTokens += tokens.length;
  }
  const rate = (hitTokens: number) => (promptTokens > 0 ? hitTokens / promptTokens : 0);
  const optimalTokens = beladyHits(access, reusable, ids.size, o.workers * o.capacityBlocks) * o.blockSize;
  return {
    pooledLru: rate(pooled.hitTokens),
    pooledOptimal: rate(optimalTokens),
    unbounded: rate(unboundedHits.reduce((a, b) => a + b, 0)),
    ttftP50BoundMs: ttftP50Bound(prompts, unboundedHits, optimalTokens, { ...DEFAULT_TIMING, ...o.timing }, o.blockSize),
  };
}

/** Hits of a cache of `capacity` blocks over `access` under Belady's rule with bypass (offline optimal). */
export function beladyHits(access: readonly number[], reusable: readonly boolean[], keys: number, capacity: number): number {
  const n = access.length;
  const never = n;
  // next[i]: the next access of the same block after i (never: none).
  const next = new Int32Array(n);
  const last = new Int32Array(keys).fill(never);
  for (let i = n - 1; i >= 0; i--) {
    next[i] = last[access[i]!]!;
    last[access[i]!] = i;
  }
  // nextUse[k]: when cached block k is used next (-1: not cached). A max-heap of (next use, block) with
  // stale entries skipped when they surface.
  const nextUse = new Int32Array(keys).fill(-1);
  const heapAt = new Int32Array(n + 1);
  const heapKey = new Int32Array(n + 1);
  let size = 0;
  let cached = 0;
  const push = (at: number, key: number) => {
    let i = size++;
    while (i > 0) {
      const p = (i - 1) >> 1;
      if (heapAt[p]! >= at) break;
      heapAt[i] = heapAt[p]!;
      heapKey[i] = heapKey[p]!;
      i = p;
    }
    heapAt[i] = at;
    heapKey[i] = key;
  };
  const pop = () => {
    const at = heapAt[--size]!;
    const key = heapKey[size]!;
    let i = 0;
    for (;;) {
      let c = 2 * i + 1;
      if (c >= size) break;
      if (c + 1 < size && heapAt[c + 1]! > heapAt[c]!) c++;
      if (heapAt[c]! <= at) break;
      heapAt[i] = heapAt[c]!;
      heapKey[i] = heapKey[c]!;
      i = c;
    }
    heapAt[i] = at;
    heapKey[i] = key;
  };
  /** The cached block used furthest ahead (stale heap entries dropped). */
  const furthest = () => {
    while (size > 0 && nextUse[heapKey[0]!] !== heapAt[0]) pop();
    return size > 0 ? heapKey[0]! : -1;
  };
  let hits = 0;
  for (let i = 0; i < n; i++) {
    const k = access[i]!;
    const nu = next[i]!;
    if (nextUse[k]! >= 0) {
      if (reusable[i]) hits++;
      if (nu === never) {
        nextUse[k] = -1;
        cached--;
      } else {
        nextUse[k] = nu;
        push(nu, k);
      }
      continue;
    }
    if (nu === never) continue; // never used again: not worth a slot
    if (cached >= capacity) {
      const victim = furthest();
      if (victim < 0 || nextUse[victim]! <= nu) continue; // everything cached is needed sooner
      nextUse[victim] = -1;
      cached--;
      pop();
    }
    nextUse[k] = nu;
    cached++;
    push(nu, k);
  }
  return hits;
}

/**
 * The lowest TTFT p50 reachable when request i can have at most `maxHit[i]` cached tokens and all
 * together at most `budget`: the smallest uncached size u such that the requests the p50 needs at or
 * under u (the cheapest of those that can get there) need no more than the budget.
 */
export function ttftP50Bound(prompts: readonly number[], maxHit: readonly number[], budget: number, timing: TimingParams, blockSize: number): number {
  if (prompts.length === 0) return Number.NaN;
  const need = percentileRank(prompts.length, 0.5) + 1;
  const fits = (u: number) => {
    const costs: number[] = [];
    prompts.forEach((p, i) => {
      const c = Math.ceil(Math.max(0, p - u) / blockSize) * blockSize;
      if (c <= maxHit[i]!) costs.push(c);
    });
    if (costs.length < need) return false;
    costs.sort((a, b) => a - b);
    let sum = 0;
    for (let i = 0; i < need; i++) sum += costs[i]!;
    return sum <= budget;
  };
  let lo = 0;
  let hi = Math.max(...prompts);
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (fits(mid)) hi = mid;
    else lo = mid + 1;
  }
  return idleTtftMs(timing, lo, 0);
}
