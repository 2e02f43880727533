// The upper bound: the same cost function over the workers' true cache contents and true load, read
// from the simulated workers at the instant of the pick (no event lag, no estimate).
import { chainBlockIds, choose, cost } from "../upstream.ts";
import type { PolicySpec } from "./types.ts";

export const oracle: PolicySpec = {
  name: "oracle",
  knows: "the workers' caches and load, read directly",
  usesRouterLoad: false,
  usesIndex: false,
  create(ctx) {
    // Mirror of each cache's resident blocks, updated synchronously on every change the cache makes, so
    // the request's external block ids (the cache's own hashing) are computed once per pick rather than
    // once per worker as PrefixCacheSim.peekHitBlocks would; the answer is the same.
    const resident = ctx.workers.map((w) => {
      const set = w.cache.residentHashes();
      w.onCacheEvents((events) => {
        for (const e of events) {
          if (e.kind === "stored") for (const h of e.hashes) set.add(h);
          else if (e.kind === "removed") for (const h of e.hashes) set.delete(h);
          else set.clear();
        }
      });
      return set;
    });
    return {
      pick(req) {
        const ids = chainBlockIds(req.tokens!, ctx.blockSize);
        const costs = ctx.workers.map((w, i) => {
          const set = resident[i]!;
          let overlap = 0;
          while (overlap < ids.length && set.has(ids[overlap]!.hash)) overlap++;
          return cost(ctx.weights, req.requestBlocks, { overlap, activeBlocks: w.activeBlocks, waiting: 0 });
        });
        return choose(costs, ctx.weights.temperature, ctx.random);
      },
    };
  },
};
