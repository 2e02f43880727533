// @kv-epp/protocol: the names and formats every package shares (README.md). No dependencies.
export {
  DP_LB_MODES, parseWorkerKey, rankSources, workerKey, workerKeyOf, type ApiServer, type DpLbMode, type RankSource, type WorkerRef, type WorkerSpec,
} from "./rank.ts";
export { apiOfPath } from "./api-path.ts";
export {
  decodes, PD_SPLIT_PATHS, PREFILL_RANK_HEADER, PREFILLER_HOST_PORT_HEADER, prefills, ROLE_LABEL, roleOfLabel, splitPath, WORKER_ROLES, type PdSplitPath, type WorkerRole,
} from "./disagg.ts";
export type { BlockHash, StoredBlock, TokensHash } from "./hashes.ts";
export type { RouterEvent, StreamCursor } from "./router-event.ts";
export {
  DUMP_BINARY_CONTENT_TYPE, DUMP_BINARY_MAGIC, DUMP_CHUNK_BYTES, DUMP_CONTENT_TYPE, DUMP_CURSOR_FLAGS, DUMP_EVENT_FLAGS, DUMP_FIELDS, DUMP_FRAME,
  DUMP_JSON_CHUNK_BYTES, DUMP_PATH,
} from "./dump.ts";
export {
  DUMP_JSON_BLOCK, DUMP_JSON_BLOCKS, DUMP_JSON_COPIES, DUMP_JSON_DP_RANK, DUMP_JSON_EVENT_ID, DUMP_JSON_PARENT, DUMP_JSON_TOKENS, DUMP_JSON_WORKER,
} from "./dump-json.ts";
export { decodeEpoch, MAX_EPOCH_BYTES } from "./epoch.ts";
export { bracketHost, endpointHost, formatEndpoint, hostPort, parseEndpoint, publisherBinds, rankEndpoint, type TcpEndpoint } from "./endpoint.ts";
export { Backoff, pause, sleep, type BackoffPolicy } from "./async.ts";
