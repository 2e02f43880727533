// Ours: the EPP's cost function over the exact KV index (fed by the workers' KV events) and the load of
// its routing decisions.
import { choose, cost } from "../upstream.ts";
import { withRouterLoad } from "./router-load.ts";
import type { PolicySpec } from "./types.ts";

export const kvAware: PolicySpec = {
  name: "kv-aware",
  knows: "KV index from the workers' events + load of routing decisions",
  usesRouterLoad: true,
  usesIndex: true,
  create(ctx) {
    return withRouterLoad(ctx, (req) => {
      const { scores } = ctx.index.findMatches(req.localHashes);
      const costs = ctx.workerKeys.map((key) =>
        cost(ctx.weights, req.requestBlocks, { overlap: scores.get(key) ?? 0, activeBlocks: ctx.load.blocks(key), waiting: 0 }),
      );
      return choose(costs, ctx.weights.temperature, ctx.random);
    });
  },
};
