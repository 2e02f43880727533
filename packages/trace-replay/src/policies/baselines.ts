// Policies that ignore the cache: the floor the KV-aware policy must clear.
import { choose } from "@kv-epp/routing";
import { withRouterLoad } from "./router-load.ts";
import type { PolicySpec } from "./types.ts";

export const roundRobin: PolicySpec = {
  name: "round-robin",
  knows: "nothing: next worker in turn (per replica)",
  usesRouterLoad: false,
  usesIndex: false,
  create(ctx) {
    let next = 0;
    return { pick: () => next++ % ctx.workers.length };
  },
};

export const random: PolicySpec = {
  name: "random",
  knows: "nothing: uniform choice",
  usesRouterLoad: false,
  usesIndex: false,
  create(ctx) {
    return { pick: () => Math.floor(ctx.random() * ctx.workers.length) };
  },
};

export const leastLoaded: PolicySpec = {
  name: "least-loaded",
  knows: "requests in flight from its routing decisions",
  usesRouterLoad: true,
  usesIndex: false,
  create(ctx) {
    return withRouterLoad(ctx, () =>
      choose(ctx.workerKeys.map((k) => ctx.load.of(k).requests), 0, ctx.random),
    );
  },
};
