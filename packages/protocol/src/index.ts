// @kv-epp/protocol: the names and formats every package shares (README.md). No dependencies.
export { DP_LB_MODES, parseWorkerKey, workerKey, workerKeyOf, type ApiServer, type DpLbMode, type RankSource, type WorkerRef, type WorkerSpec } from "./rank.ts";
export type { BlockHash, StoredBlock, TokensHash } from "./hashes.ts";
export type { RouterEvent, StreamCursor } from "./router-event.ts";
export {
  DUMP_BINARY_CONTENT_TYPE, DUMP_BINARY_MAGIC, DUMP_CHUNK_BYTES, DUMP_CONTENT_TYPE, DUMP_CURSOR_FLAGS, DUMP_EVENT_FLAGS, DUMP_FIELDS, DUMP_FRAME,
  DUMP_JSON_CHUNK_BYTES, DUMP_PATH,
} from "./dump.ts";
export { bracketHost, formatEndpoint, hostPort, parseEndpoint, publisherBinds, rankEndpoint, type TcpEndpoint } from "./endpoint.ts";
export { Backoff, pause, sleep, type BackoffPolicy } from "./async.ts";
