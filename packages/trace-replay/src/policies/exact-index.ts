// The EPP's decision over the workers' true cache contents and true load, read from the simulated
// workers at the instant of the pick (no event lag, no estimate): what kv-aware would do with a perfect
// index. It agrees with kv-aware by construction when events arrive in time, so it bounds the index,
// not the routing; ttft-oracle and the pooled-cache bounds bound the routing.
import { decide } from "@kv-epp/routing";
import { residentOverlaps } from "./resident.ts";
import type { PolicySpec } from "./types.ts";

export const exactIndex: PolicySpec = {
  name: "exact-index",
  knows: "the workers' caches and load, read directly, under the EPP's decide()",
  usesRouterLoad: false,
  usesIndex: false,
  create(ctx) {
    const overlaps = residentOverlaps(ctx);
    return {
      pick(req) {
        const hits = overlaps(req);
        const candidates = ctx.workers.map((w, i) => ({
          index: i,
          endpoint: ctx.workerKeys[i]!,
          overlap: hits[i]!,
          activeBlocks: w.activeBlocks,
          activeRequests: w.inflight,
          waiting: w.waitingCount,
        }));
        const d = decide({ requestBlocks: req.requestBlocks, candidates, weights: ctx.weights, queueThreshold: ctx.queueThreshold, random: ctx.random });
        if (d.kind === "none") throw new Error(`no worker to route to (${d.reason})`);
        return d.chosen.candidate.index;
      },
    };
  },
};
