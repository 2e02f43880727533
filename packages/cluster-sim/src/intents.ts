// What the scenario reads of the KV discovery records (attachment intents, the host advertisement):
// the Leases in the fake API server, decoded with the intents package's own codecs and label names,
// and the attachments an EPP last logged. The records' convention is deploy/README.md's.
import {
  decodeHost,
  decodeIntent,
  hostRecordName,
  HOLDERS_ANNOTATION,
  PAYLOAD_ANNOTATION,
  RECORD_LABEL,
  RECORD_LABEL_VALUES,
  type AttachmentIntent,
  type HostAdvertisement,
} from "@kv-epp/intents";
import type { FakeKubeApi, KubeObject } from "@kv-epp/testkit";
import { logRecords } from "./observe.ts";

export type OwnerRef = { apiVersion: string; kind: string; name: string; uid: string; blockOwnerDeletion?: boolean };

export type IntentLease = { name: string; owners: OwnerRef[]; holder: string | undefined; intent: AttachmentIntent };
export type HostLease = { name: string; owners: OwnerRef[]; holders: string[]; host: HostAdvertisement };

const ownersOf = (l: KubeObject) => (l.metadata?.ownerReferences ?? []) as OwnerRef[];
const payloadOf = (l: KubeObject) => JSON.parse(l.metadata?.annotations?.[PAYLOAD_ANNOTATION] ?? "null") as unknown;
const holderOf = (l: KubeObject) => (l.spec as { holderIdentity?: string } | undefined)?.holderIdentity;

/** Every attachment-intent Lease of the namespace, decoded (a record that does not decode throws). */
export function intentLeases(api: FakeKubeApi, namespace: string): IntentLease[] {
  return api
    .list("Lease", namespace)
    .filter((l) => l.metadata?.labels?.[RECORD_LABEL] === RECORD_LABEL_VALUES.intent)
    .map((l) => ({ name: l.metadata!.name!, owners: ownersOf(l), holder: holderOf(l), intent: decodeIntent(payloadOf(l)) }));
}

/** The shared host advertisement of `hostInstance` (`kvh-<host instance>`), if it exists. */
export function hostLease(api: FakeKubeApi, namespace: string, hostInstance: string): HostLease | undefined {
  const l = api.get("Lease", namespace, hostRecordName(hostInstance));
  if (!l) return undefined;
  if (l.metadata?.labels?.[RECORD_LABEL] !== RECORD_LABEL_VALUES.host) throw new Error(`${l.metadata?.name} is not a host record`);
  return {
    name: l.metadata!.name!,
    owners: ownersOf(l),
    holders: JSON.parse(l.metadata?.annotations?.[HOLDERS_ANNOTATION] ?? "[]") as string[],
    host: decodeHost(payloadOf(l)),
  };
}

/**
 * The attachments (`<worker>/<rank>`, sorted) an EPP logged last ("intent attachments changed"), i.e.
 * the intents it attaches listeners for; undefined before its intent watcher reported.
 */
export function loggedAttachments(lines: readonly string[]): string[] | undefined {
  const last = logRecords(lines).findLast((r) => r.msg === "intent attachments changed");
  return last ? [...(last.attachments as string[])].sort() : undefined;
}
