// @kv-epp/intents: KV event sources registered by the workers (attachment intents) and consumed by
// the KV-state host (the EPP). Both the worker side (mock-worker) and the host side (epp) use it.
export type { Discovery, DiscoveryRecord, Query, RecordKind, RecordSpec, Registration, WatchHandle } from "./discovery/types.ts";
export { RecordExistsError } from "./discovery/types.ts";
export { MemoryDiscoveryStore } from "./discovery/memory.ts";
// The Kubernetes backend is loaded by openDiscovery only when chosen: this entry does not load
// @kubernetes/client-node. Its Leases' names are here for what reads those records.
export { HOLDERS_ANNOTATION, PAYLOAD_ANNOTATION, RECORD_LABEL, RECORD_LABEL_VALUES } from "./discovery/lease-names.ts";
export {
  VLLM_KV_EVENTS_PROTOCOL,
  HOST_PROTOCOL_VERSION,
  INTENT_RECORD_VERSION,
  indexerDomainOf,
  encodeIntent,
  decodeIntent,
  encodeHost,
  decodeHost,
  intentRecordName,
  hostRecordName,
  nameSafe,
  RecordDecodeError,
  type CacheOwner,
  type IntentDescriptor,
  type AttachmentIntent,
  type HostAdvertisement,
} from "./protocol.ts";
export { newIntentId, maskIntentId, type RandomFill } from "./ids.ts";
export { validateDescriptors, IntentValidationError, type ValidationCode } from "./validate.ts";
export { findHost, HostLookupError } from "./host-lookup.ts";
export { registerIntents, IntentOwner, IntentRegistrationError, type RegisterIntentsOptions } from "./owner.ts";
export { WITHDRAW_BACKOFF, REGISTER_BACKOFF, type Sleep } from "./retry.ts";
export { advertiseHost, IntentWatcher, desiredAttachments, startIntentHost, type HostAdvertiser, type IntentHost, type IntentHostOptions, type IntentHostState, type IntentWatcherOptions } from "./host.ts";
export {
  intentWorkers,
  mergeWorkerSets,
  hostOf,
  type MergeMode,
  type MergedWorkers,
  type MergedAlias,
  type UnroutableWorker,
  type IntentWorker, type IntentWorkerSpec } from "./workers.ts";
export { registerWorkerIntents, workerDescriptors, replaceHost, type RegisterWorkerIntentsOptions, type WorkerRankInfo } from "./worker-side.ts";
export { serveDiscoveryStore, type DiscoveryServer } from "./discovery/http-server.ts";
export { connectHttpDiscovery, type HttpDiscoveryOptions } from "./discovery/http.ts";
export { parseDiscoveryConfig, openDiscovery, type DiscoveryConfig } from "./discovery/open.ts";
export { readReportedSources, ReportedSourcesError, UnusableReportError, GET_KV_EVENT_SOURCES, type ReportedSource, type ReportedSources } from "./reported-sources.ts";
export { registerReportedIntents, type RegisterReportedIntentsOptions } from "./reported-intents.ts";
