// The worker side's checks before anything is registered; each failure is its own clear error.
import { isTcpEndpoint, VLLM_KV_EVENTS_PROTOCOL, type IntentDescriptor } from "./protocol.ts";

export type ValidationCode =
  | "no-descriptors"
  | "duplicate-rank"
  | "duplicate-cache-owner"
  | "block-size"
  | "indexer-domain-mismatch"
  | "unsupported-protocol"
  | "bad-endpoint"
  | "worker-mismatch";

export class IntentValidationError extends Error {
  override name = "IntentValidationError";
  constructor(
    readonly code: ValidationCode,
    message: string,
  ) {
    super(message);
  }
}

/** Throws IntentValidationError on the first problem found. */
export function validateDescriptors(descriptors: readonly IntentDescriptor[], processWorkerId: string): void {
  const fail = (code: ValidationCode, msg: string): never => {
    throw new IntentValidationError(code, msg);
  };
  if (descriptors.length === 0) fail("no-descriptors", "at least one intent descriptor is required");
  const ranks = new Set<number>();
  for (const d of descriptors) {
    const at = `intent for worker ${JSON.stringify(d.workerId)} rank ${d.dpRank}`;
    if (d.workerId !== processWorkerId)
      fail("worker-mismatch", `${at}: worker id differs from this process's worker id ${JSON.stringify(processWorkerId)}`);
    if (ranks.has(d.dpRank)) fail("duplicate-rank", `${at}: DP rank ${d.dpRank} appears more than once`);
    ranks.add(d.dpRank);
    if (!(Number.isInteger(d.blockSize) && d.blockSize > 0)) fail("block-size", `${at}: block size must be a positive integer, got ${d.blockSize}`);
    if (d.protocol !== VLLM_KV_EVENTS_PROTOCOL)
      fail("unsupported-protocol", `${at}: protocol ${JSON.stringify(d.protocol)} is not supported (expected ${JSON.stringify(VLLM_KV_EVENTS_PROTOCOL)})`);
    if (!isTcpEndpoint(d.endpoint)) fail("bad-endpoint", `${at}: endpoint ${JSON.stringify(d.endpoint)} is not tcp://host:port`);
    if (d.replayEndpoint !== undefined && !isTcpEndpoint(d.replayEndpoint))
      fail("bad-endpoint", `${at}: replay endpoint ${JSON.stringify(d.replayEndpoint)} is not tcp://host:port`);
    const owners = new Set<string>();
    for (const o of d.cacheOwners) {
      if (owners.has(o.id)) fail("duplicate-cache-owner", `${at}: cache owner id ${JSON.stringify(o.id)} appears more than once`);
      owners.add(o.id);
      if (o.indexerDomain !== d.indexerDomain)
        fail(
          "indexer-domain-mismatch",
          `${at}: cache owner ${JSON.stringify(o.id)} has indexer domain ${JSON.stringify(o.indexerDomain)}, the intent has ${JSON.stringify(d.indexerDomain)}`,
        );
    }
  }
}
