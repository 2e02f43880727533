// Each simulated cache's resident blocks, mirrored from its change events, so a policy that reads the
// true caches hashes a request the cache's way once per pick rather than once per worker (as
// PrefixCacheSim.peekHitBlocks would); the answer is the same.
import { chainBlockIds } from "@kv-epp/mock-worker";
import { cacheIdentity, type SimRequest } from "../sim/request.ts";
import type { ReplicaContext } from "./types.ts";

/** Returns a function giving, per worker, the leading blocks of a request its cache holds right now. */
export function residentOverlaps(ctx: ReplicaContext): (req: SimRequest) => number[] {
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
  return (req) => {
    const ids = chainBlockIds(req.tokens!, ctx.blockSize, cacheIdentity(req));
    return resident.map((set) => {
      let overlap = 0;
      while (overlap < ids.length && set.has(ids[overlap]!.hash)) overlap++;
      return overlap;
    });
  };
}
