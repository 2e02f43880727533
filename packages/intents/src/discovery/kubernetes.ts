// Kubernetes discovery, following the convention in deploy/README.md: each record is a
// coordination.k8s.io/v1 Lease in the pod's namespace, labelled `kv-epp.dev/record=attachment-intent|kv-host`
// (plus `kv-epp.dev/host`, `kv-epp.dev/protocol-version`), its JSON payload in the annotation
// `kv-epp.dev/payload`, owned (ownerReferences) by the pod that registered it so the garbage collector
// removes a dead pod's records, and renewed (spec.renewTime every third of leaseDurationSeconds) so a
// process that dies while its pod lives on expires too. deploy/base/rbac.yaml grants the verbs.
import { randomUUID } from "node:crypto";
import { CoordinationV1Api, V1MicroTime, type KubeConfig, type V1Lease, type V1OwnerReference } from "@kubernetes/client-node";
import { DEFAULT_BACKOFF, listWatch, statusOf } from "@kv-epp/kube";
import pino, { type Logger } from "pino";
import { nameSafe } from "../protocol.ts";
import { HOLDERS_ANNOTATION, HOST_LABEL, PAYLOAD_ANNOTATION, PRODUCER_ANNOTATION, RECORD_LABEL, RECORD_LABEL_VALUES, VERSION_LABEL } from "./lease-names.ts";
import { RecordExistsError, type Discovery, type DiscoveryRecord, type Query, type RecordKind, type RecordSpec, type Registration, type WatchHandle } from "./types.ts";

export type KubernetesDiscoveryOptions = {
  kubeConfig: KubeConfig;
  namespace: string;
  /** The registering pod (POD_NAME, POD_UID): its records are garbage-collected with it. */
  pod?: { name: string; uid: string };
  /** This process instance; default `<pod name or "proc">-<random>`. */
  producer?: string;
  log?: Logger;
  /** Pause before restarting a failed watch. */
  retryMs?: number;
  /**
   * Lease of this producer's records (default 30 s, renewed every third of it). Readers treat a record
   * not renewed for that long as gone; the producer's own `lease` signal ends when it could not renew
   * for that long (its records are gone for everyone by then). 0: no renewal, no expiry.
   */
  leaseDurationSeconds?: number;
  /** Readers re-evaluate expiry this often even without watch events (default: a third of the lease). */
  resyncMs?: number;
  now?: () => number;
};

// A DNS subdomain (Lease names), at most 253 characters.
const NAME = /^(?=.{1,253}$)[a-z0-9]([-a-z0-9.]*[a-z0-9])?$/;
const DEFAULT_LEASE_SECONDS = 30;

const selectorOf = (q: Query) => `${RECORD_LABEL}=${RECORD_LABEL_VALUES[q.kind]}${q.host !== undefined ? `,${HOST_LABEL}=${nameSafe(q.host)}` : ""}`;

/** A renewed record is live until renewTime (or its creation) + leaseDurationSeconds. */
function expired(lease: V1Lease, now: number): boolean {
  const seconds = lease.spec?.leaseDurationSeconds;
  if (!seconds) return false;
  const renewed = lease.spec?.renewTime ?? lease.spec?.acquireTime ?? lease.metadata?.creationTimestamp;
  if (renewed === undefined) return false;
  return new Date(renewed).getTime() + seconds * 1000 < now;
}

function toRecord(kind: RecordKind, lease: V1Lease): DiscoveryRecord {
  const ann = lease.metadata?.annotations ?? {};
  let payload: unknown;
  try {
    payload = JSON.parse(ann[PAYLOAD_ANNOTATION] ?? "");
  } catch {
    payload = undefined; // the reader's decoder reports it as undecodable
  }
  return { kind, name: lease.metadata?.name ?? "", payload, producer: ann[PRODUCER_ANNOTATION] ?? lease.spec?.holderIdentity ?? "" };
}

function holdersOf(lease: V1Lease): string[] {
  try {
    const h = JSON.parse(lease.metadata?.annotations?.[HOLDERS_ANNOTATION] ?? "[]");
    return Array.isArray(h) ? h.filter((x): x is string => typeof x === "string") : [];
  } catch {
    return [];
  }
}

export function kubernetesDiscovery(o: KubernetesDiscoveryOptions): Discovery {
  const api = o.kubeConfig.makeApiClient(CoordinationV1Api);
  const log = o.log ?? pino({ level: "silent" });
  const producer = o.producer ?? `${o.pod?.name ?? "proc"}-${randomUUID().slice(0, 8)}`;
  const namespace = o.namespace;
  const now = o.now ?? Date.now;
  const leaseSeconds = o.leaseDurationSeconds ?? DEFAULT_LEASE_SECONDS;
  const resyncMs = o.resyncMs ?? Math.max(1000, (leaseSeconds * 1000) / 3);
  const lease = new AbortController();
  const watches = new Set<WatchHandle>();
  /** Records this producer holds and renews (re-creating them from their spec if deleted). */
  const held = new Map<string, RecordSpec>();
  let lastRenewed = now();
  const live = (l: V1Lease) => !expired(l, now());
  const ownerRef: V1OwnerReference | undefined = o.pod && { apiVersion: "v1", kind: "Pod", name: o.pod.name, uid: o.pod.uid };

  const body = (spec: RecordSpec): V1Lease => ({
    apiVersion: "coordination.k8s.io/v1",
    kind: "Lease",
    metadata: {
      name: spec.name,
      namespace,
      labels: {
        [RECORD_LABEL]: RECORD_LABEL_VALUES[spec.kind],
        ...(spec.host !== undefined ? { [HOST_LABEL]: nameSafe(spec.host) } : {}),
        ...(spec.version !== undefined ? { [VERSION_LABEL]: String(spec.version) } : {}),
        "app.kubernetes.io/part-of": "kv-epp",
      },
      annotations: {
        [PAYLOAD_ANNOTATION]: JSON.stringify(spec.payload),
        [PRODUCER_ANNOTATION]: producer,
        ...(spec.shared ? { [HOLDERS_ANNOTATION]: JSON.stringify([producer]) } : {}),
      },
      ...(ownerRef ? { ownerReferences: [ownerRef] } : {}),
    },
    spec: {
      holderIdentity: o.pod?.name ?? producer,
      ...(leaseSeconds > 0 ? { leaseDurationSeconds: leaseSeconds, acquireTime: new V1MicroTime(now()), renewTime: new V1MicroTime(now()) } : {}),
    },
  });

  /**
   * Creates the record, or joins it when shared and already there. A shared record that vanishes
   * between the conflict and the join (its last holder left) is created again.
   */
  async function ensure(spec: RecordSpec): Promise<void> {
    for (let attempt = 0; attempt < 5; attempt++) {
      try {
        await api.createNamespacedLease({ namespace, body: body(spec) });
        return;
      } catch (err) {
        if (statusOf(err) !== 409) throw err;
        if (!spec.shared) throw new RecordExistsError(`${spec.kind} record ${spec.name} exists`);
      }
      if ((await join(spec.name)) === "joined") return;
    }
    throw new Error(`lease ${spec.name}: keeps vanishing while joining`);
  }

  /** Removes a record (plain: delete; shared: leave, deleting it with the last holder). */
  async function remove(reg: Registration): Promise<"removed" | "missing"> {
    if (reg.kind === "host") return leave(reg);
    try {
      await api.deleteNamespacedLease({ name: reg.name, namespace });
      return "removed";
    } catch (err) {
      if (statusOf(err) === 404) return "missing";
      throw err;
    }
  }

  /**
   * One renewal round: every held record gets a fresh renewTime. A held record that is gone (deleted by
   * hand, or by a cleanup that raced a restart) is created again: this producer is alive, so its record
   * must be too, or new workers cannot find the host and the host loses the intent. A record deleted by
   * the garbage collector is not at risk of resurrection: the pod object (the owner) outlives its
   * containers, so by then this process is gone; and the collector removes a dependent whose owner is
   * absent anyway.
   */
  async function renewAll(): Promise<void> {
    let ok = true;
    for (const [name, spec] of [...held]) {
      try {
        let cur: V1Lease | undefined;
        try {
          cur = await api.readNamespacedLease({ name, namespace });
        } catch (err) {
          if (statusOf(err) !== 404) throw err;
        }
        if (!cur) {
          await ensure(spec);
          log.info({ record: name, kind: spec.kind }, "re-created a discovery record that had been deleted");
          // Withdrawn while it was being re-created: withdraw it again.
          if (held.get(name) !== spec) await remove({ kind: spec.kind, name, producer });
          continue;
        }
        cur.spec = { ...cur.spec, renewTime: new V1MicroTime(now()) };
        // A shared record re-created by another holder does not list this one: join it in the same write.
        if (spec.shared && cur.metadata) addHolder(cur);
        await api.replaceNamespacedLease({ name, namespace, body: cur });
      } catch (err) {
        // A conflict is retried at the next round; anything else is a failure to renew.
        if (statusOf(err) !== 409) {
          ok = false;
          log.warn({ record: name, err: String(err) }, "renewing a discovery record failed");
        }
      }
    }
    if (ok) lastRenewed = now();
    else if (now() - lastRenewed > leaseSeconds * 1000) lease.abort(new Error(`lease of ${producer} ended: not renewed for ${leaseSeconds} s`));
  }
  let renewing = false;
  const renewTimer =
    leaseSeconds > 0
      ? setInterval(() => {
          if (renewing || lease.signal.aborted) return;
          renewing = true;
          void renewAll().finally(() => (renewing = false));
        }, (leaseSeconds * 1000) / 3)
      : undefined;
  renewTimer?.unref?.();

  /** Lists this producer (and its pod as an owner) in a shared record; false when it already was. */
  function addHolder(cur: V1Lease): boolean {
    const holders = holdersOf(cur);
    if (holders.includes(producer)) return false;
    const meta = cur.metadata!;
    meta.annotations = { ...meta.annotations, [HOLDERS_ANNOTATION]: JSON.stringify([...holders, producer]) };
    const refs = meta.ownerReferences ?? [];
    if (ownerRef && !refs.some((r) => r.uid === ownerRef.uid)) meta.ownerReferences = [...refs, ownerRef];
    return true;
  }

  /** Adds this producer to an existing shared record, retried on conflicts; "missing" if it is gone. */
  async function join(name: string): Promise<"joined" | "missing"> {
    for (let attempt = 0; attempt < 5; attempt++) {
      let cur: V1Lease;
      try {
        cur = await api.readNamespacedLease({ name, namespace });
      } catch (err) {
        if (statusOf(err) === 404) return "missing";
        throw err;
      }
      if (!cur.metadata?.annotations?.[HOLDERS_ANNOTATION]) throw new RecordExistsError(`lease ${name} exists and is not shared`);
      if (!addHolder(cur)) return "joined";
      try {
        await api.replaceNamespacedLease({ name, namespace, body: cur });
        return "joined";
      } catch (err) {
        if (statusOf(err) === 404) return "missing";
        if (statusOf(err) !== 409) throw err;
      }
    }
    throw new Error(`lease ${name}: too many update conflicts`);
  }

  /** Drops this producer from a shared record; deletes it when no holder is left. */
  async function leave(reg: Registration): Promise<"removed" | "missing"> {
    for (let attempt = 0; attempt < 5; attempt++) {
      let cur: V1Lease;
      try {
        cur = await api.readNamespacedLease({ name: reg.name, namespace });
      } catch (err) {
        if (statusOf(err) === 404) return "missing";
        throw err;
      }
      const holders = holdersOf(cur);
      if (!holders.includes(reg.producer)) return "missing";
      const rest = holders.filter((h) => h !== reg.producer);
      try {
        if (rest.length === 0) {
          await api.deleteNamespacedLease({ name: reg.name, namespace, body: { preconditions: { resourceVersion: cur.metadata?.resourceVersion } } });
        } else {
          cur.metadata!.annotations![HOLDERS_ANNOTATION] = JSON.stringify(rest);
          // Another replica of this pod's kind may still hold it: keep every owner but ours.
          if (ownerRef) cur.metadata!.ownerReferences = (cur.metadata!.ownerReferences ?? []).filter((r) => r.uid !== ownerRef.uid);
          await api.replaceNamespacedLease({ name: reg.name, namespace, body: cur });
        }
        return "removed";
      } catch (err) {
        if (statusOf(err) === 404) return "missing";
        if (statusOf(err) !== 409) throw err;
      }
    }
    throw new Error(`lease ${reg.name}: too many update conflicts`);
  }

  return {
    producer,
    lease: lease.signal,

    async register(spec) {
      if (!NAME.test(spec.name)) throw new Error(`record name ${JSON.stringify(spec.name)} is not a valid object name`);
      if (lease.signal.aborted) throw new Error(`lease of ${producer} has ended`);
      await ensure(spec);
      held.set(spec.name, spec);
      return { kind: spec.kind, name: spec.name, producer };
    },

    async unregister(reg) {
      held.delete(reg.name);
      return remove(reg);
    },

    async list(q: Query) {
      const res = await api.listNamespacedLease({ namespace, labelSelector: selectorOf(q) });
      return res.items.filter(live).map((l) => toRecord(q.kind, l));
    },

    listAndWatch(q, onSnapshot) {
      const labelSelector = selectorOf(q);
      let stopped = false;
      // While the cache does not follow the store (no list succeeded since the last error), nobody can
      // renew a lease in it either, so expiring records by age would drop live workers during an
      // API-server outage: the last set stays until a list succeeds (`fresh`).
      const publish = () => {
        if (!stopped && leases.fresh) onSnapshot(leases.items().filter(live).map((l) => toRecord(q.kind, l)));
      };
      const leases = listWatch<V1Lease>({
        kubeConfig: o.kubeConfig,
        path: `/apis/coordination.k8s.io/v1/namespaces/${namespace}/leases`,
        labelSelector,
        list: () => api.listNamespacedLease({ namespace, labelSelector }),
        backoff: { initialMs: o.retryMs ?? DEFAULT_BACKOFF.initialMs, maxMs: DEFAULT_BACKOFF.maxMs },
        // Level-triggered: every change hands over the whole cached set.
        onSnapshot: publish,
        onError: (err, { synced }) => log.warn({ err: String(err), kind: q.kind }, synced ? "lease watch failed, restarting" : "listing leases failed, retrying"),
        // Not allowed (RBAC) or no such resource: retrying cannot help, and a caller waiting for the
        // first snapshot (readiness) must not wait forever.
        giveUpBeforeSync: (err) => [401, 403, 404].includes(statusOf(err) ?? 0),
      });
      // Expiry happens without a watch event: re-evaluate the cache now and then.
      const resync = leaseSeconds > 0 ? setInterval(publish, resyncMs) : undefined;
      resync?.unref?.();
      const handle: WatchHandle = {
        ready: leases.synced.then(
          () => {},
          (err: unknown) => {
            if (resync) clearInterval(resync);
            throw err;
          },
        ),
        close: () => {
          stopped = true;
          if (resync) clearInterval(resync);
          watches.delete(handle);
          void leases.stop();
        },
      };
      watches.add(handle);
      return handle;
    },

    async close() {
      if (renewTimer) clearInterval(renewTimer);
      lease.abort(new Error(`discovery client ${producer} closed`));
      for (const w of [...watches]) w.close();
    },
  };
}
