// The two record types of KV discovery and their JSON wire format (see README.md "Records"):
// a host advertisement (written by the EPP) and an attachment intent (written by a worker, one per
// DP rank). Payloads are versioned; a reader skips what it cannot decode instead of failing.
import { DP_LB_MODES, parseEndpoint, WORKER_ROLES, type DpLbMode, type WorkerRole } from "@kv-epp/protocol";
import { z } from "zod";

/** The one KV-event protocol a host can attach to: vLLM's ZeroMQ PUB stream (docs/CONTRACTS.md §4). */
export const VLLM_KV_EVENTS_PROTOCOL = "vllm-zmq-kv-events";
/** Version of the host advertisement; a worker only addresses hosts of this version. */
export const HOST_PROTOCOL_VERSION = 1;
/** Version of the intent payload. */
export const INTENT_RECORD_VERSION = 1;

/** Who owns a cache whose blocks the rank reports (e.g. the GPU KV cache, an offload tier). */
export type CacheOwner = {
  id: string;
  /** The indexer this cache's blocks belong to: `"<model>:<tenant>"` (docs/CONTRACTS.md §1). */
  indexerDomain: string;
};

/** What a worker declares for one of its DP ranks. */
export type IntentDescriptor = {
  workerId: string;
  dpRank: number;
  protocol: string;
  /** ZeroMQ PUB endpoint the host subscribes to, e.g. `tcp://10.0.0.5:5557`. */
  endpoint: string;
  /** Optional replay ROUTER endpoint. */
  replayEndpoint?: string;
  /** Raw ZeroMQ topic frame ("" subscribes to everything). */
  topic: string;
  blockSize: number;
  model: string;
  tenant: string;
  /** `"<model>:<tenant>"`. */
  indexerDomain: string;
  cacheOwners: CacheOwner[];
  /** Token ids the model uses as multimodal placeholders (they hash like any other token). */
  multimodalTokenIds: number[];
  /** ip:port the gateway is told to call, for workers no pod informer knows about. */
  address?: string;
  /** The worker's Prometheus endpoint. */
  metricsUrl?: string;
  /**
   * The worker's vLLM DP load-balancing mode (DpLbMode), which sets how its API server numbers this
   * rank in x-data-parallel-rank; absent: internal (global ranks). Older hosts ignore it.
   */
  dpLb?: DpLbMode;
  /** The worker's role in prefill/decode disaggregation (absent: a destination only). Older hosts ignore it. */
  role?: WorkerRole;
};

/** A registered intent as the host materializes it. */
export type AttachmentIntent = IntentDescriptor & {
  /** Random, 53-bit, never 0 (see ids.ts). */
  intentId: number;
  /** The host instance the intent is addressed to (the worker's control target). */
  host: string;
  /** The process instance that registered it. */
  producer: string;
  /** Epoch ms; a newer intent for the same worker rank supersedes an older one. */
  registeredAt: number;
};

export type HostAdvertisement = { version: number; hostInstance: string; producer: string };

export const indexerDomainOf = (model: string, tenant = "default"): string => `${model}:${tenant}`;

const CacheOwnerSchema = z.object({ id: z.string().min(1), indexerDomain: z.string().min(1) });

/** A KV-event endpoint a listener can dial: tcp://host:port, port 1-65535 (kv-events' own parser). */
export function isTcpEndpoint(s: string): boolean {
  try {
    return parseEndpoint(s).port > 0;
  } catch {
    return false;
  }
}
const TcpEndpoint = z.string().refine(isTcpEndpoint, "expected tcp://host:port");

const IntentSchema = z.object({
  v: z.literal(INTENT_RECORD_VERSION),
  intentId: z.number().int().min(1).max(Number.MAX_SAFE_INTEGER),
  host: z.string().min(1),
  producer: z.string().min(1),
  registeredAt: z.number(),
  workerId: z.string().min(1),
  dpRank: z.number().int().min(0),
  protocol: z.string(),
  endpoint: TcpEndpoint,
  replayEndpoint: TcpEndpoint.optional(),
  topic: z.string(),
  blockSize: z.number().int().min(1),
  model: z.string(),
  tenant: z.string(),
  indexerDomain: z.string(),
  cacheOwners: z.array(CacheOwnerSchema),
  multimodalTokenIds: z.array(z.number().int().min(0)),
  address: z
    .string()
    .regex(/^(\[[^\]\s]+\]|[^\s:/[\]]+):\d+$/, "expected host:port")
    .refine((s) => Number(s.slice(s.lastIndexOf(":") + 1)) <= 65535, "port above 65535")
    .optional(),
  metricsUrl: z.string().url().optional(),
  dpLb: z.enum(DP_LB_MODES as [DpLbMode, ...DpLbMode[]]).optional(),
  role: z.enum(WORKER_ROLES as [WorkerRole, ...WorkerRole[]]).optional(),
});

const HostSchema = z.object({ v: z.number().int(), hostInstance: z.string().min(1), producer: z.string().min(1) });

export class RecordDecodeError extends Error {
  override name = "RecordDecodeError";
}

export function encodeIntent(i: AttachmentIntent): Record<string, unknown> {
  return stripUndefined({ v: INTENT_RECORD_VERSION, ...i });
}

export function decodeIntent(payload: unknown): AttachmentIntent {
  const r = IntentSchema.safeParse(payload);
  if (!r.success) throw new RecordDecodeError(`undecodable intent: ${r.error.issues.map((i) => `${i.path.join(".")}: ${i.message}`).join("; ")}`);
  const { v: _v, ...intent } = r.data;
  return stripUndefined(intent) as AttachmentIntent;
}

export function encodeHost(h: HostAdvertisement): Record<string, unknown> {
  return { v: h.version, hostInstance: h.hostInstance, producer: h.producer };
}

/** Decodes any version (the reader filters on it); throws RecordDecodeError on a malformed payload. */
export function decodeHost(payload: unknown): HostAdvertisement {
  const r = HostSchema.safeParse(payload);
  if (!r.success) throw new RecordDecodeError(`undecodable host advertisement: ${r.error.issues.map((i) => `${i.path.join(".")}: ${i.message}`).join("; ")}`);
  return { version: r.data.v, hostInstance: r.data.hostInstance, producer: r.data.producer };
}

/** Lowercase alphanumerics and '-', trimmed: usable inside a Kubernetes object name or label value. */
export function nameSafe(s: string, max = 63): string {
  return s.toLowerCase().replace(/[^a-z0-9-]+/g, "-").replace(/^-+|-+$/g, "").slice(0, max).replace(/-+$/, "") || "x";
}

/**
 * Record names double as Kubernetes object names (deploy/README.md): `kvi-<worker>-r<rank>-<id base 36>`
 * for an intent (readable in `kubectl get leases`, unique by its random id), `kvh-<host instance>` for
 * the host advertisement (one shared record per host, whatever the replica count).
 */
export const intentRecordName = (i: Pick<AttachmentIntent, "workerId" | "dpRank" | "intentId">): string =>
  `kvi-${nameSafe(i.workerId, 200)}-r${i.dpRank}-${i.intentId.toString(36)}`;
export const hostRecordName = (hostInstance: string): string => `kvh-${nameSafe(hostInstance, 200)}`;

function stripUndefined<T extends object>(o: T): T {
  return Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined)) as T;
}
