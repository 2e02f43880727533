// Which API server serves each rank of a worker, so that x-data-parallel-rank numbers a rank the way
// that server numbers it (DpLbMode in @kv-epp/protocol).
import type { ApiServer, DpLbMode } from "@kv-epp/protocol";

/**
 * The API servers of a worker whose global ranks start at `start`, `dpSize` behind each address:
 * - several addresses (hybrid or external LB, one server per port): `dpSize` ranks behind each, in order;
 * - one address under internal LB: none listed, every rank is behind it and the header names the global rank;
 * - one address under hybrid or external LB: one server for all its ranks, which it numbers from 0.
 */
export function apiServers(addresses: readonly string[], dpSize: number, start: number, lb: DpLbMode): ApiServer[] | undefined {
  if (addresses.length === 1 && lb === "internal") return undefined;
  return addresses.map((address, i) => ({ address, ranks: Array.from({ length: dpSize }, (_, r) => start + i * dpSize + r) }));
}
