// @kv-epp/recovery: peer KV-index recovery before readiness (docs/CONTRACTS.md §7-§8). See README.md for the wiring.
export type { DumpExtras, DumpFormat, DumpModel, DumpSizes, DumpSource, DumpStaging, DumpTarget, EmptyBootstrapReason, Peer, RecoveryOutcome, RecoveryStateName } from "./types.ts";
export { RECOVERY_STATES } from "./types.ts";
export { dumpStream, dumpChunks } from "./dump/writer.ts";
export { dumpBinaryChunks } from "./dump/binary-writer.ts";
export { BinaryDumpParser, type BinaryDumpSinks } from "./dump/binary-parser.ts";
export { toRouterEvents, type IndexDumpEvent } from "./dump/router-events.ts";
export { DumpParser, DumpFormatError, DumpTooLargeError, readDump, DEFAULT_PARSER_LIMITS, type DumpParserLimits, type DumpParserOptions, type DumpSink, type DumpBatchSink, type DumpBatchOptions, type DumpCursorSink, type DumpAdapterSink } from "./dump/parser.ts";
export { DumpBatch } from "./dump/batch.ts";
export { EventRunWriter, runEvents } from "./dump/event-run.ts";
export { dumpBodyParser, stageEvents, type DumpBodyParser } from "./dump/staging-feed.ts";
export { fetchDump, dumpAccept, DumpFetchError, DEFAULT_MIN_RATE, type DumpFailureReason, type DumpFetchResult, type FetchDumpOptions, type MinRate } from "./dump/client.ts";
export { dumpHandler, wantsBinary, type DumpHandlerOptions } from "./dump/handler.ts";
export { PeerSet, type FailureRecord } from "./peer-set.ts";
export type { PeerDiscovery } from "./discovery/types.ts";
export { staticPeerDiscovery, probePeer, type StaticDiscoveryOptions } from "./discovery/static.ts";
export { runRecovery, type RecoveryState, type RunRecoveryOptions } from "./recovery.ts";
export { recoveryStateMetric, recoveryAttemptMetrics } from "./metrics.ts";
