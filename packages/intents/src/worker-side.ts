// What a worker process calls at start: one intent per DP rank, built from what the worker already
// knows about itself (its ranks' KV-event endpoints, model, block size, topic).
import type { Logger } from "pino";
import type { Discovery } from "./discovery/types.ts";
import { registerIntents, type IntentOwner } from "./owner.ts";
import { indexerDomainOf, VLLM_KV_EVENTS_PROTOCOL, type IntentDescriptor } from "./protocol.ts";

export type WorkerRankInfo = { rank: number; kvEvents: string; replay?: string | null };

export type RegisterWorkerIntentsOptions = {
  discovery: Discovery;
  workerId: string;
  /** The KV-state host the intents are addressed to (the EPP's host instance). */
  controlTarget: string;
  model: string;
  tenant?: string;
  blockSize: number;
  topic: string;
  /** Connectable endpoints (not `tcp://*:…`): the mock worker's `MockWorker.ranks` fits as is. */
  ranks: readonly WorkerRankInfo[];
  /** ip:port the gateway calls; lets a host without pod discovery route to this worker. */
  address?: string;
  metricsUrl?: string;
  multimodalTokenIds?: number[];
  signal?: AbortSignal;
  log?: Logger;
};

export function workerDescriptors(o: Omit<RegisterWorkerIntentsOptions, "discovery" | "controlTarget" | "signal" | "log">): IntentDescriptor[] {
  const tenant = o.tenant ?? "default";
  const indexerDomain = indexerDomainOf(o.model, tenant);
  return o.ranks.map((r) => ({
    workerId: o.workerId,
    dpRank: r.rank,
    protocol: VLLM_KV_EVENTS_PROTOCOL,
    endpoint: r.kvEvents,
    ...(r.replay ? { replayEndpoint: r.replay } : {}),
    topic: o.topic,
    blockSize: o.blockSize,
    model: o.model,
    tenant,
    indexerDomain,
    cacheOwners: [{ id: "gpu", indexerDomain }],
    multimodalTokenIds: o.multimodalTokenIds ?? [],
    ...(o.address ? { address: o.address } : {}),
    ...(o.metricsUrl ? { metricsUrl: o.metricsUrl } : {}),
  }));
}

export function registerWorkerIntents(o: RegisterWorkerIntentsOptions): Promise<IntentOwner> {
  return registerIntents({
    discovery: o.discovery,
    workerId: o.workerId,
    controlTarget: o.controlTarget,
    descriptors: workerDescriptors(o),
    signal: o.signal,
    log: o.log,
  });
}
