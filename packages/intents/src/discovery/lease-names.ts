// The label and annotation names of the Kubernetes backend's Leases (deploy/README.md), apart from the backend so
// that what only reads or selects those records (the cluster simulator) does not load @kubernetes/client-node.
import type { RecordKind } from "./types.ts";

export const RECORD_LABEL = "kv-epp.dev/record";
export const HOST_LABEL = "kv-epp.dev/host";
export const VERSION_LABEL = "kv-epp.dev/protocol-version";
/** The label value of each record kind. */
export const RECORD_LABEL_VALUES: Record<RecordKind, string> = { intent: "attachment-intent", host: "kv-host" };
export const PAYLOAD_ANNOTATION = "kv-epp.dev/payload";
export const PRODUCER_ANNOTATION = "kv-epp.dev/producer";
/** Producers holding a shared record (JSON array). */
export const HOLDERS_ANNOTATION = "kv-epp.dev/holders";
