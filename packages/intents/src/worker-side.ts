// What a worker process calls at start: one intent per DP rank, built from what the worker already
// knows about itself (its ranks' KV-event endpoints, model, block size, topic).
import { Backoff, bracketHost, pause, type DpLbMode, type WorkerRole } from "@kv-epp/protocol";
import pino, { type Logger } from "pino";
import type { Discovery } from "./discovery/types.ts";
import { HostLookupError } from "./host-lookup.ts";
import { IntentRegistrationError, registerIntents, type IntentOwner } from "./owner.ts";
import { decodeIntent, indexerDomainOf, VLLM_KV_EVENTS_PROTOCOL, type IntentDescriptor } from "./protocol.ts";
import { REGISTER_BACKOFF, type Sleep } from "./retry.ts";

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
  /** The mock worker's `MockWorker.ranks` fits as is. */
  ranks: readonly WorkerRankInfo[];
  /** ip:port the gateway calls; lets a host without pod discovery route to this worker. */
  address?: string;
  metricsUrl?: string;
  /**
   * The address other hosts reach this process on (the pod IP): replaces the host part of every
   * endpoint, of `address` and of `metricsUrl`, since a wildcard bind is reported as a loopback address.
   */
  advertiseHost?: string;
  multimodalTokenIds?: number[];
  /** The worker's vLLM DP load-balancing mode, stated in every intent (absent: internal). */
  dpLb?: DpLbMode;
  /** The worker's role in prefill/decode disaggregation, stated in every intent (absent: a destination only). */
  role?: WorkerRole;
  /**
   * Retry while no host is advertised yet (or a registration failed and was rolled back), with backoff
   * from 1 s doubling to 30 s, until it succeeds or `signal` aborts. Invalid descriptors never retry.
   */
  retry?: boolean;
  signal?: AbortSignal;
  log?: Logger;
  sleep?: Sleep;
};

/** `tcp://1.2.3.4:5557` or `1.2.3.4:8000` with its host replaced (IPv6 bracketed). */
export function replaceHost(endpoint: string, host: string): string {
  return endpoint.replace(/^(tcp:\/\/)?(\[[^\]]*\]|[^:/]+)(?=:\d+$)/, (_, scheme: string | undefined) => `${scheme ?? ""}${bracketHost(host)}`);
}

/** `http://1.2.3.4:8000/metrics` with its host replaced (IPv6 bracketed); left as is if not a URL. */
function replaceUrlHost(url: string, host: string): string {
  let u: URL;
  try {
    u = new URL(url);
  } catch {
    return url;
  }
  u.hostname = bracketHost(host);
  return u.toString();
}

export function workerDescriptors(o: Omit<RegisterWorkerIntentsOptions, "discovery" | "controlTarget" | "signal" | "log" | "retry" | "sleep">): IntentDescriptor[] {
  const tenant = o.tenant ?? "default";
  const indexerDomain = indexerDomainOf(o.model, tenant);
  const at = (e: string) => (o.advertiseHost ? replaceHost(e, o.advertiseHost) : e);
  return o.ranks.map((r) => ({
    workerId: o.workerId,
    dpRank: r.rank,
    protocol: VLLM_KV_EVENTS_PROTOCOL,
    endpoint: at(r.kvEvents),
    ...(r.replay ? { replayEndpoint: at(r.replay) } : {}),
    topic: o.topic,
    blockSize: o.blockSize,
    model: o.model,
    tenant,
    indexerDomain,
    cacheOwners: [{ id: "gpu", indexerDomain }],
    multimodalTokenIds: o.multimodalTokenIds ?? [],
    ...(o.address ? { address: at(o.address) } : {}),
    // Rewritten like the endpoints: with a wildcard bind the worker reports its loopback here too.
    ...(o.metricsUrl ? { metricsUrl: o.advertiseHost ? replaceUrlHost(o.metricsUrl, o.advertiseHost) : o.metricsUrl } : {}),
    ...(o.dpLb ? { dpLb: o.dpLb } : {}),
    ...(o.role ? { role: o.role } : {}),
  }));
}

/**
 * Withdraws intents of this worker left by an earlier process of it. A restarted container keeps its
 * pod, so the pod-owned records of its previous incarnation outlive it, possibly for ranks it no longer
 * has. Best effort: a failure is logged, and the host prefers the newest intent per rank anyway.
 */
async function withdrawStaleIntents(discovery: Discovery, workerId: string, host: string, log: Logger): Promise<number> {
  let withdrawn = 0;
  try {
    for (const rec of await discovery.list({ kind: "intent" })) {
      if (rec.producer === discovery.producer) continue;
      let intent;
      try {
        intent = decodeIntent(rec.payload);
      } catch {
        continue;
      }
      if (intent.workerId !== workerId || intent.host !== host) continue;
      if ((await discovery.unregister({ kind: "intent", name: rec.name, producer: rec.producer })) === "removed") withdrawn++;
      log.info({ worker: workerId, rank: intent.dpRank, record: rec.name, producer: rec.producer }, "withdrew a stale intent of an earlier process");
    }
  } catch (err) {
    log.warn({ worker: workerId, err: String(err) }, "withdrawing stale intents failed");
  }
  return withdrawn;
}

export async function registerWorkerIntents(o: RegisterWorkerIntentsOptions): Promise<IntentOwner> {
  const log = o.log ?? pino({ level: "silent" });
  const sleep = o.sleep ?? pause;
  const descriptors = workerDescriptors(o);
  await withdrawStaleIntents(o.discovery, o.workerId, o.controlTarget, log);
  const backoff = new Backoff(REGISTER_BACKOFF);
  for (;;) {
    try {
      return await registerIntents({ discovery: o.discovery, workerId: o.workerId, controlTarget: o.controlTarget, descriptors, signal: o.signal, log });
    } catch (err) {
      const retriable = err instanceof HostLookupError || err instanceof IntentRegistrationError;
      if (!o.retry || !retriable || o.signal?.aborted) throw err;
      const delay = backoff.next();
      log.warn({ worker: o.workerId, err: String(err), ms: delay }, "registering KV intents failed, retrying");
      await sleep(delay, o.signal ?? new AbortController().signal);
      if (o.signal?.aborted) throw err;
    }
  }
}
