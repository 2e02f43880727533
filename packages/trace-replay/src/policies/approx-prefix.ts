// The GAIE reference EPP's way (prefix-cache scorer in "estimation mode"): it never sees the workers'
// caches, only its own routing history. It remembers, per worker, the chained prefix-block hashes of the
// requests it sent there (an LRU of the worker's capacity, as GAIE's autoTune sizes it), scores a worker
// by the fraction of the request's leading blocks it remembers there, and adds GAIE's load scorers over
// scraped worker metrics. Default profile weights: prefix 3, queue 2, kv-cache utilization 2.
import type { SimRequest } from "../sim/request.ts";
import type { PolicySpec } from "./types.ts";

/** GAIE's MaxPrefixBlocksToMatch default: blocks past it are not matched. */
const MAX_PREFIX_BLOCKS = 256;
const W_PREFIX = 3;
const W_QUEUE = 2;
const W_KV_UTIL = 2;

/**
 * Prefix-chained block keys (block i names blocks 0..i), as GAIE hashes its blocks, folded to doubles so
 * the LRU maps stay cheap. 52 bits are ample for this many blocks.
 */
function chainKeys(req: SimRequest): number[] {
  const n = Math.min(req.localHashes.length, MAX_PREFIX_BLOCKS);
  const halves = new Uint32Array(req.localHashes.buffer, req.localHashes.byteOffset, n * 2);
  const keys: number[] = new Array(n);
  let hi = 0x811c9dc5;
  let lo = 0x01000193;
  for (let i = 0; i < n; i++) {
    hi = Math.imul(hi ^ halves[2 * i]!, 0x85ebca6b) ^ (lo >>> 13);
    lo = Math.imul(lo ^ halves[2 * i + 1]!, 0xc2b2ae35) ^ (hi >>> 16);
    keys[i] = (hi >>> 0) * 0x100000 + ((lo >>> 0) & 0xfffff);
  }
  return keys;
}

export const approxPrefix: PolicySpec = {
  name: "approx-prefix",
  knows: "its own routing history (GAIE prefix scorer; xN = active-active, each replica only its share, which GAIE warns against: its default HA is active-passive, one leader routing all, the one-router row) + scraped worker queue and KV usage",
  usesRouterLoad: false,
  usesIndex: false,
  create(ctx) {
    // Map insertion order is the LRU order: first key = least recently routed.
    const remembered = ctx.workers.map(() => new Map<number, true>());
    let pending: number[] = [];
    let hits: number[] = [];
    return {
      pick(req) {
        pending = chainKeys(req);
        // GAIE's queue scorer reads num_requests_waiting alone (WaitingQueueSize); the running load
        // reaches it through the KV-cache utilization scorer (kv_cache_usage_perc: the slots running
        // requests reference).
        const queues = ctx.workers.map((w) => w.waitingCount);
        const qMin = Math.min(...queues);
        const qSpan = Math.max(...queues) - qMin;
        let best = -Infinity;
        let ties = 0;
        let chosen = 0;
        hits = ctx.workers.map(() => 0);
        ctx.workers.forEach((w, i) => {
          const lru = remembered[i]!;
          let hit = 0;
          while (hit < pending.length && lru.has(pending[hit]!)) hit++;
          hits[i] = hit;
          const prefix = pending.length > 0 ? hit / pending.length : 0;
          const queue = qSpan > 0 ? 1 - (queues[i]! - qMin) / qSpan : 1;
          const score = W_PREFIX * prefix + W_QUEUE * queue + W_KV_UTIL * (1 - w.cache.usage);
          if (score > best) {
            best = score;
            chosen = i;
            ties = 1;
          } else if (score === best && ctx.random() * ++ties < 1) chosen = i;
        });
        return chosen;
      },
      matchedBlocks: (worker) => hits[worker] ?? 0,
      routed(_req, worker) {
        const lru = remembered[worker]!;
        for (const k of pending) {
          lru.delete(k);
          lru.set(k, true);
        }
        for (const k of lru.keys()) {
          if (lru.size <= ctx.capacityBlocks) break;
          lru.delete(k);
        }
      },
    };
  },
};
