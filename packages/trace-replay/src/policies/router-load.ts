import type { Lease } from "@kv-epp/routing";
import type { SimRequest } from "../sim/request.ts";
import type { ReplicaContext, Router } from "./types.ts";

/**
 * Router-side load bookkeeping for a policy that picks by load alone: a lease on the chosen worker for
 * the request's blocks from routing until its response ends (the EPP's kv policies take theirs through
 * RoutedRequest, with their prefill blocks and prefix keys).
 */
export function withRouterLoad(ctx: ReplicaContext, pick: (req: SimRequest) => number): Router {
  const leases = new Map<number, Lease>();
  return {
    pick,
    routed(req, worker) {
      leases.set(req.id, ctx.ownLoad.acquire(ctx.workerKeys[worker]!, req.requestBlocks));
    },
    firstToken(req) {
      leases.get(req.id)?.prefilled();
    },
    finished(req) {
      leases.get(req.id)?.release();
      leases.delete(req.id);
    },
  };
}
