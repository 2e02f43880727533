// Ours: the EPP's decision (epp picker/decide.ts) over the exact KV index (fed by the workers' KV
// events) and the load of its routing decisions.
import { decide } from "../upstream.ts";
import { withRouterLoad } from "./router-load.ts";
import type { PolicySpec } from "./types.ts";

export const kvAware: PolicySpec = {
  name: "kv-aware",
  knows: "KV index from the workers' events + load of routing decisions (the EPP's decide())",
  usesRouterLoad: true,
  usesIndex: true,
  create(ctx) {
    return withRouterLoad(ctx, (req) => {
      const { scores } = ctx.index.findMatches(req.localHashes);
      const candidates = ctx.workerKeys.map((key, i) => ({
        index: i,
        endpoint: key,
        overlap: scores.get(key) ?? 0,
        activeBlocks: ctx.load.blocks(key),
        // As if scraped at this instant (the EPP scrapes vLLM's num_requests_waiting every few seconds).
        waiting: ctx.workers[i]!.waitingCount,
      }));
      const d = decide({ requestBlocks: req.requestBlocks, candidates, weights: ctx.weights, queueThreshold: ctx.queueThreshold, random: ctx.random });
      if (d.kind === "none") throw new Error(`no worker to route to (${d.reason})`);
      return d.chosen.candidate.index;
    });
  },
};
