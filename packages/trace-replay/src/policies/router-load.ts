import type { LoadLease, PrefixKeys } from "../upstream.ts";
import type { SimRequest } from "../sim/request.ts";
import type { ReplicaContext, Router } from "./types.ts";

/**
 * Router-side load bookkeeping, as the EPP does it: a lease on the chosen worker for the request's
 * blocks from routing until its response ends, carrying the request's prefix keys (`prefixOf`, what
 * the pick computed) into the replica's in-flight prefixes when it has them.
 */
export function withRouterLoad(ctx: ReplicaContext, pick: (req: SimRequest) => number, prefixOf?: (req: SimRequest) => PrefixKeys | undefined): Router {
  const leases = new Map<number, LoadLease>();
  return {
    pick,
    routed(req, worker) {
      leases.set(req.id, ctx.ownLoad.acquire(ctx.workerKeys[worker]!, req.requestBlocks, 0, prefixOf?.(req)));
    },
    finished(req) {
      leases.get(req.id)?.release();
      leases.delete(req.id);
    },
  };
}
