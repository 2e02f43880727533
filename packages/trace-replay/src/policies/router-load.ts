import type { LoadLease, PrefixKeys } from "../upstream.ts";
import type { SimRequest } from "../sim/request.ts";
import type { ReplicaContext, Router } from "./types.ts";

/** What a pick knows about its lease: the blocks the worker still prefills, the request's prefix keys. */
export type LeaseShape = { prefillBlocks: number; prefix?: PrefixKeys };

/**
 * Router-side load bookkeeping, as the EPP does it: a lease on the chosen worker for the request's
 * blocks from routing until its response ends, its prefill blocks counted until the first token comes
 * back, carrying the request's prefix keys into the replica's in-flight prefixes (`shapeOf`: what the
 * pick computed; absent, no prefill blocks and no prefix).
 */
export function withRouterLoad(ctx: ReplicaContext, pick: (req: SimRequest) => number, shapeOf?: (req: SimRequest) => LeaseShape | undefined): Router {
  const leases = new Map<number, LoadLease>();
  return {
    pick,
    routed(req, worker) {
      const shape = shapeOf?.(req);
      leases.set(req.id, ctx.ownLoad.acquire(ctx.workerKeys[worker]!, req.requestBlocks, shape?.prefillBlocks ?? 0, shape?.prefix));
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
