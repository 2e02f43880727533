// The TTFT limit of routing one request at a time: for each request, the worker whose simulated TTFT is
// lowest given the exact caches and queues at that instant (SimWorker.ttftIfSubmitted). It sees what no
// router can (every cache, every queue, the engine itself) and is greedy: it does not weigh what
// a choice does to later requests, so a policy may beat it on a later request's account, rarely overall.
import { choose, uncachedTokens } from "@kv-epp/routing";
import { residentOverlaps } from "./resident.ts";
import type { PolicySpec } from "./types.ts";

export const ttftOracle: PolicySpec = {
  name: "ttft-oracle",
  knows: "every cache, queue and the engine itself: lowest simulated TTFT per request",
  usesRouterLoad: false,
  usesIndex: false,
  create(ctx) {
    const overlaps = residentOverlaps(ctx);
    return {
      pick(req) {
        const hits = overlaps(req);
        const now = req.arrivalMs;
        // Each forecast gives up past the best so far: only the least matters.
        let best = Number.POSITIVE_INFINITY;
        const ttfts = ctx.workers.map((w, i) => {
          const cached = req.promptTokens - uncachedTokens(req.promptTokens, hits[i]!, ctx.blockSize);
          const t = w.ttftIfSubmitted(req.tokens!, cached, now, best);
          best = Math.min(best, t);
          return t;
        });
        return choose(ttfts, 0, ctx.random);
      },
    };
  },
};
