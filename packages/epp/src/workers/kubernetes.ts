// Kubernetes mode: the InferencePool (inference.networking.k8s.io/v1) gives the pod selector and the
// target ports; a list-watch of its pods keeps the worker set (Running, has an IP, Ready, not terminating).
// Every target port is an endpoint of its own ("Every port will be treated as a distinctive endpoint
// by EPP", api/v1/inferencepool_types.go), as vLLM's external DP load balancing runs them: the API
// server on targetPorts[i] serves ranks i*dpSize .. i*dpSize+dpSize-1, each publishing KV events on
// the KV port + its global rank.
import { CoreV1Api, CustomObjectsApi, type KubeConfig, type V1ObjectMeta, type V1Pod } from "@kubernetes/client-node";
import { listWatch, type ListWatch } from "@kv-epp/kube";
import { bracketHost, DP_LB_MODES, formatEndpoint, parseEndpoint, publisherBinds, rankSources, ROLE_LABEL, roleOfLabel, type DpLbMode, type TcpEndpoint, type WorkerRole, type WorkerSpec } from "@kv-epp/protocol";
import { isIP } from "node:net";
import type { Logger } from "pino";
import { apiServers } from "./api-servers.ts";

export type PoolWorkersOptions = {
  kubeConfig: KubeConfig;
  poolName: string;
  namespace: string;
  kvEventsPort: number;
  kvReplayPort?: number;
  dpSize: number;
  log: Logger;
  onWorkers: (specs: WorkerSpec[]) => void;
  /**
   * The pool is there and its pods have been listed (true), or it was deleted or marked for deletion
   * (false: the workers were just cleared). Told on changes only, the first true once the pods are listed.
   */
  onPoolPresence?: (present: boolean) => void;
  onError: (err: unknown) => void;
  signal?: AbortSignal;
};

type InferencePool = {
  spec?: {
    selector?: { matchLabels?: Record<string, string> } | Record<string, string>;
    targetPorts?: { number: number }[];
    targetPortNumber?: number;
  };
};

/** v1 uses {matchLabels}; v1alpha2 used a plain label map. */
export function poolSelector(pool: InferencePool): string {
  const sel = pool.spec?.selector ?? {};
  const labels = (typeof (sel as { matchLabels?: unknown }).matchLabels === "object"
    ? (sel as { matchLabels: Record<string, string> }).matchLabels
    : sel) as Record<string, string>;
  const parts = Object.entries(labels).map(([k, v]) => `${k}=${v}`);
  if (parts.length === 0) throw new Error("InferencePool has an empty selector");
  return parts.join(",");
}

/** The pool's target ports, in order (v1 `targetPorts`, v1alpha2 `targetPortNumber`). */
export function poolTargetPorts(pool: InferencePool): number[] {
  const ports = pool.spec?.targetPorts?.map((p) => p.number) ?? (pool.spec?.targetPortNumber ? [pool.spec.targetPortNumber] : []);
  if (ports.length === 0 || ports.some((p) => !Number.isInteger(p) || p < 1 || p > 65535))
    throw new Error(`InferencePool has no valid targetPorts (${JSON.stringify(pool.spec?.targetPorts ?? null)})`);
  if (new Set(ports).size !== ports.length) throw new Error(`InferencePool repeats a target port (${ports.join(", ")})`);
  return ports;
}

export function isServingPod(pod: V1Pod): boolean {
  if (pod.metadata?.deletionTimestamp) return false;
  if (pod.status?.phase !== "Running" || !pod.status.podIP) return false;
  return (pod.status.conditions ?? []).some((c) => c.type === "Ready" && c.status === "True");
}

/**
 * Pod annotation with the global DP rank of the pod's first rank (vLLM's --data-parallel-start-rank):
 * the second pod of a multi-node DP group publishes on the KV port + its global ranks.
 */
export const DP_START_RANK_ANNOTATION = "kv-epp.dynamo.nvidia.com/data-parallel-start-rank";

/** The annotation's value; 0 when it is absent or not a rank (0..4095). */
export function podDpStartRank(pod: V1Pod): number {
  const v = pod.metadata?.annotations?.[DP_START_RANK_ANNOTATION];
  if (v === undefined || !/^\d{1,4}$/.test(v) || Number(v) > 4095) return 0;
  return Number(v);
}

/**
 * Pod annotation with the pod's vLLM DP load-balancing mode (DpLbMode: internal | hybrid | external),
 * which sets how its API server numbers the ranks in x-data-parallel-rank.
 */
export const DP_LB_ANNOTATION = "kv-epp.dynamo.nvidia.com/data-parallel-lb";

/**
 * The pod's LB mode. Absent: internal at start rank 0, hybrid past it: under internal LB only the head
 * node (start rank 0) runs an API server, so a pod serving requests with a later start rank runs hybrid
 * or external LB (llm-d's wide-EP layout, one API server per pod), and both number its ranks from 0.
 * A value that is not a mode keeps that default and says why.
 */
export function podDpLb(pod: V1Pod): { mode: DpLbMode; invalid?: string } {
  const mode: DpLbMode = podDpStartRank(pod) > 0 ? "hybrid" : "internal";
  const v = pod.metadata?.annotations?.[DP_LB_ANNOTATION];
  if (v === undefined) return { mode };
  if ((DP_LB_MODES as readonly string[]).includes(v)) return { mode: v as DpLbMode };
  return { mode, invalid: `${DP_LB_ANNOTATION} ${JSON.stringify(v)} is not one of ${DP_LB_MODES.join(", ")}` };
}

/**
 * Pod annotation with the pod's vLLM KV-event endpoint (`kv_events_config.endpoint`). vLLM binds a
 * wildcard endpoint (`tcp://*:5557`: the EPP dials the pod IP at that port + rank) and connects its PUB
 * to any other (`tcp://<EPP>:5557`: the EPP binds that port + rank, on the named IP or, for a name such
 * as a Service, on every interface). Absent: the pod binds `--kv-events-port`.
 */
export const KV_EVENTS_ENDPOINT_ANNOTATION = "kv-epp.dynamo.nvidia.com/kv-events-endpoint";

export type PodKvSource = { kvEvents: string; kvBind: boolean; invalid?: string };

/** Where a pod's KV events are read (see KV_EVENTS_ENDPOINT_ANNOTATION); a bad annotation keeps the default and says why. */
export function podKvSource(pod: V1Pod, kvEventsPort: number): PodKvSource {
  const podHost = pod.status!.podIP!;
  const fallback = { kvEvents: formatEndpoint(podHost, kvEventsPort), kvBind: false };
  const v = pod.metadata?.annotations?.[KV_EVENTS_ENDPOINT_ANNOTATION];
  if (v === undefined) return fallback;
  let at: TcpEndpoint;
  try {
    at = parseEndpoint(v);
  } catch (err) {
    return { ...fallback, invalid: (err as Error).message };
  }
  if (at.port === 0) return { ...fallback, invalid: `${KV_EVENTS_ENDPOINT_ANNOTATION} ${JSON.stringify(v)} has no fixed port` };
  if (publisherBinds(v)) return { kvEvents: formatEndpoint(podHost, at.port), kvBind: false };
  return { kvEvents: formatEndpoint(isIP(at.host) ? at.host : "0.0.0.0", at.port), kvBind: true };
}

/**
 * The pod's role in prefill/decode disaggregation, from llm-d's label (ROLE_LABEL): prefill, decode,
 * prefill-decode (both). Absent: no role, a destination only (llm-d's decode filter takes unlabelled
 * pods too). Another value (an encode role) is ignored, and says why: the pod stays a destination.
 */
export function podRole(pod: V1Pod): { role?: WorkerRole; invalid?: string } {
  const v = pod.metadata?.labels?.[ROLE_LABEL];
  if (v === undefined) return {};
  const role = roleOfLabel(v);
  return role ? { role } : { invalid: `${ROLE_LABEL} ${JSON.stringify(v)} is not one of prefill, decode, prefill-decode` };
}

/**
 * Pod annotation limiting which of the pool's target ports are endpoints on this pod (llm-d's datastore,
 * extractActivePorts): comma-separated port numbers, e.g. `8000,8002`. The older GAIE key is read only
 * when the llm-d one is absent.
 */
export const ACTIVE_PORTS_ANNOTATION = "llm-d.ai/active-ports";
export const LEGACY_ACTIVE_PORTS_ANNOTATION = "inference.networking.k8s.io/active-ports";

/**
 * The pod's active target ports, in the pool's order. Absent annotation: every target port. Present,
 * llm-d's rules exactly: each comma-separated item, trimmed, counts by its leading integer (Go's
 * Sscanf %d: `8000abc` is 8000, `+8000` too) when that is > 0 and a target port; anything else is
 * skipped (reported in `invalid`), so a value naming no target port (empty included) leaves none.
 */
export function podActivePorts(pod: V1Pod, ports: readonly number[]): { ports: readonly number[]; invalid?: string } {
  const annotations = pod.metadata?.annotations ?? {};
  const key = annotations[ACTIVE_PORTS_ANNOTATION] !== undefined ? ACTIVE_PORTS_ANNOTATION : LEGACY_ACTIVE_PORTS_ANNOTATION;
  const v = annotations[key];
  if (v === undefined) return { ports };
  const active = new Set<number>();
  const skipped: string[] = [];
  for (const item of v.split(",")) {
    const m = /^[+-]?\d+/.exec(item.trim());
    const n = m ? Number(m[0]) : NaN;
    if (n > 0 && ports.includes(n)) active.add(n);
    else skipped.push(item.trim());
  }
  const invalid = skipped.length > 0 ? `${key} ${JSON.stringify(v)}: ${skipped.map((x) => JSON.stringify(x)).join(", ")} not among the target ports ${ports.join(", ")}` : undefined;
  return { ports: ports.filter((p) => active.has(p)), ...(invalid ? { invalid } : {}) };
}

/**
 * `dpSize` ranks per target port; with one port every rank is behind it, numbered as its LB mode says (podDpLb).
 * `active` (podActivePorts, non-empty): the ranks behind the other ports are left out, listed rank by
 * rank so the rest keep their global numbers (and KV ports).
 */
export function podWorker(pod: V1Pod, o: Pick<PoolWorkersOptions, "kvEventsPort" | "kvReplayPort" | "dpSize">, ports: readonly number[], active: readonly number[] = ports): WorkerSpec {
  const spec = allPortsWorker(pod, o, ports);
  if (active.length === ports.length) return spec;
  // Several ports (one port is all active or none), so every port has its server.
  const kept = spec.servers!.filter((_, i) => active.includes(ports[i]!));
  const ranks = new Set(kept.flatMap((s) => s.ranks));
  const inactiveRanks = spec.servers!.flatMap((s) => s.ranks).filter((r) => !ranks.has(r));
  const first = kept[0]!.address;
  return { ...spec, address: first, servers: kept, ranks: rankSources(spec).filter((r) => ranks.has(r.dpRank)), dpSize: ranks.size, inactiveRanks, metricsUrl: `http://${first}/metrics` };
}

function allPortsWorker(pod: V1Pod, o: Pick<PoolWorkersOptions, "kvEventsPort" | "kvReplayPort" | "dpSize">, ports: readonly number[]): WorkerSpec {
  const ip = pod.status!.podIP!;
  const host = bracketHost(ip);
  const start = podDpStartRank(pod);
  const kv = podKvSource(pod, o.kvEventsPort);
  const servers = apiServers(ports.map((p) => `${host}:${p}`), o.dpSize, start, podDpLb(pod).mode);
  const role = podRole(pod).role;
  return {
    id: pod.metadata!.name!,
    address: `${host}:${ports[0]}`,
    ...(servers ? { servers } : {}),
    kvEvents: kv.kvEvents,
    ...(kv.kvBind ? { kvBind: true } : {}),
    replay: o.kvReplayPort ? `tcp://${host}:${o.kvReplayPort}` : undefined,
    dpSize: o.dpSize * ports.length,
    ...(start > 0 ? { dpStartRank: start } : {}),
    // With several target ports each API server is scraped on its own port (scrapeTargets).
    metricsUrl: `http://${host}:${ports[0]}/metrics`,
    ...(role ? { role } : {}),
  };
}

type Target = { selector: string; ports: number[] };
type NamedPool = InferencePool & { apiVersion?: string; kind?: string; metadata?: Pick<V1ObjectMeta, "name" | "deletionTimestamp"> };

/**
 * Resolves once the pool has been seen and its pods have been listed (the initial worker set is known).
 * Level-triggered on both: the pool's list-watch follows the pool (a changed selector or port replaces
 * the pods' list-watch), and every pod change recomputes the whole worker set. A pool that is gone
 * (NotFound) or has a deletionTimestamp clears the workers, as llm-d's InferencePool reconciler clears
 * its datastore; a pool created again is followed afresh.
 */
export async function startPoolWorkers(o: PoolWorkersOptions): Promise<{ stop(): Promise<void> }> {
  const custom = o.kubeConfig.makeApiClient(CustomObjectsApi);
  const core = o.kubeConfig.makeApiClient(CoreV1Api);
  const group = "inference.networking.k8s.io";
  let target: Target | undefined;
  let pods: ListWatch<V1Pod> | undefined;
  /** The pool is there and its pods were listed (onPoolPresence). */
  let present = false;
  let firstPods!: () => void;
  const podsListed = new Promise<void>((resolve) => (firstPods = resolve));

  // Once per pod, annotation and value: a bad annotation is logged, and its default is used.
  const warned = new Map<string, string>();
  const warnOnce = (pod: V1Pod, annotation: string, invalid: string | undefined, msg: string) => {
    const key = `${pod.metadata!.name!}\u0000${annotation}`;
    if (invalid === undefined) return void warned.delete(key);
    if (warned.get(key) === invalid) return;
    warned.set(key, invalid);
    o.log.warn({ pod: pod.metadata!.name!, annotation, reason: invalid }, msg);
  };
  // A pod that left takes its marks along (pods churn: the map would only grow); back, it is warned again.
  const forgetGone = (serving: readonly V1Pod[]) => {
    if (warned.size === 0) return;
    const names = new Set(serving.map((p) => p.metadata!.name!));
    for (const key of warned.keys()) if (!names.has(key.slice(0, key.indexOf("\u0000")))) warned.delete(key);
  };
  const warnBadAnnotations = (pod: V1Pod) => {
    warnOnce(pod, KV_EVENTS_ENDPOINT_ANNOTATION, podKvSource(pod, o.kvEventsPort).invalid, "pod's KV-event endpoint annotation ignored; reading the default port");
    const lb = podDpLb(pod);
    warnOnce(pod, DP_LB_ANNOTATION, lb.invalid, `pod's DP load-balancing annotation ignored; numbering its ranks as ${lb.mode} LB does`);
    warnOnce(pod, ROLE_LABEL, podRole(pod).invalid, "pod's role label ignored; routing it as a destination without a role");
  };

  const watchPods = (t: Target) => {
    const old = pods;
    // The list-watch publishes nothing until a list has succeeded: a failed list is "unknown", not "no pods".
    const lw: ListWatch<V1Pod> = listWatch<V1Pod>({
      kubeConfig: o.kubeConfig,
      path: `/api/v1/namespaces/${o.namespace}/pods`,
      labelSelector: t.selector,
      list: () => core.listNamespacedPod({ namespace: o.namespace, labelSelector: t.selector }),
      onSnapshot: (items) => {
        if (pods !== lw) return;
        const serving = items.filter(isServingPod);
        forgetGone(serving);
        for (const p of serving) warnBadAnnotations(p);
        o.onWorkers(
          serving.flatMap((p) => {
            const active = podActivePorts(p, t.ports);
            warnOnce(p, ACTIVE_PORTS_ANNOTATION, active.invalid, "pod's active-ports annotation names ports that are not target ports; those are skipped");
            return active.ports.length > 0 ? [podWorker(p, o, t.ports, active.ports)] : [];
          }),
        );
        if (!present) {
          present = true;
          o.onPoolPresence?.(true);
        }
        firstPods();
      },
      onError: o.onError,
    });
    pods = lw;
    void old?.stop();
  };

  const onPool = (pool: NamedPool) => {
    let next: Target;
    try {
      next = { selector: poolSelector(pool), ports: poolTargetPorts(pool) };
    } catch (err) {
      o.onError(err);
      return;
    }
    if (target && target.selector === next.selector && target.ports.join() === next.ports.join()) return;
    target = next;
    o.log.info({ pool: o.poolName, namespace: o.namespace, selector: next.selector, ports: next.ports }, "inference pool read");
    watchPods(next);
  };

  const pools = listWatch<NamedPool>({
    kubeConfig: o.kubeConfig,
    path: `/apis/${group}/v1/namespaces/${o.namespace}/inferencepools`,
    list: () => custom.listNamespacedCustomObject({ group, version: "v1", namespace: o.namespace, plural: "inferencepools" }),
    onSnapshot: (items) => {
      const pool = items.find((p) => p.metadata?.name === o.poolName);
      if (pool && !pool.metadata?.deletionTimestamp) return onPool(pool);
      if (!target) return; // not followed yet (never seen, or already cleared)
      // No pool, no endpoints (llm-d: Datastore.Clear, readiness NOT_SERVING, requests 503) until it is back.
      o.log.warn({ pool: o.poolName, deleting: pool !== undefined }, "inference pool deleted; workers cleared");
      target = undefined;
      void pods?.stop();
      pods = undefined;
      o.onWorkers([]);
      if (present) {
        present = false;
        o.onPoolPresence?.(false);
      }
    },
    onError: o.onError,
  });
  void pools.synced.then((listed) => {
    if (listed && !target) o.log.warn({ pool: o.poolName, namespace: o.namespace }, "inference pool not found yet, waiting for it");
  });

  const stop = async () => {
    await Promise.allSettled([pools.stop(), pods?.stop()]);
  };
  // The pool may be created after the EPP: wait for it (shutdown aborts the wait) rather than crash-loop.
  await new Promise<void>((resolve, reject) => {
    const onAbort = () => {
      void stop();
      reject(o.signal?.reason);
    };
    o.signal?.addEventListener("abort", onAbort, { once: true });
    void podsListed.then(() => {
      o.signal?.removeEventListener("abort", onAbort);
      resolve();
    });
  });
  return { stop };
}
