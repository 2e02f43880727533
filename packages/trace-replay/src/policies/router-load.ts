import type { LoadLease } from "../upstream.ts";
import type { SimRequest } from "../sim/request.ts";
import type { ReplicaContext, Router } from "./types.ts";

/**
 * Router-side load bookkeeping, as the EPP does it: a lease on the chosen worker for the request's
 * blocks from routing until its response ends.
 */
export function withRouterLoad(ctx: ReplicaContext, pick: (req: SimRequest) => number): Router {
  const leases = new Map<number, LoadLease>();
  return {
    pick,
    routed(req, worker) {
      leases.set(req.id, ctx.ownLoad.acquire(ctx.workerKeys[worker]!, req.requestBlocks));
    },
    finished(req) {
      leases.get(req.id)?.release();
      leases.delete(req.id);
    },
  };
}
