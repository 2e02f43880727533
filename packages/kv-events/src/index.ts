// @kv-epp/kv-events: vLLM KV-event codec and ZMTP 3.x sockets in pure TypeScript (Bun and Node).
export type {
  AllBlocksCleared, BlockRemoved, BlockStored, DecodeStats, DropReason, EventEncoding, ExtraKeys, ExtraKeyValue, HashMode, KvEvent, KvEventBatch, Medium, MmKey,
} from "./codec/types.ts";
export { EVENT_ENCODINGS, KvDecodeError, isGpuMedium, newDecodeStats } from "./codec/types.ts";
export { decodeBatch } from "./codec/decode.ts";
export { unpackUntrusted } from "./codec/msgpack-shape.ts";
export { encodeBatch, type EncodeOptions } from "./codec/encode.ts";
export { foldHashBytes, hashToDigest } from "./codec/hash.ts";
export { batchBound, DEFAULT_KV_MAX_MESSAGE_SIZE, REFERENCE_STEP, type BatchShape } from "./batch-bound.ts";
export { PubSocket } from "./zmtp/pub.ts";
export { SubSocket } from "./zmtp/sub.ts";
export { RouterSocket } from "./zmtp/router.ts";
export { DealerSocket } from "./zmtp/dealer.ts";
export { type SocketCounters, type SocketOptions } from "./zmtp/base.ts";
export type { Heartbeat } from "./zmtp/connection.ts";
export { KvEventPublisher, type PublisherOptions, type PublishOptions } from "./publisher.ts";
export {
  KvEventListener, LISTENER_HEARTBEAT, listenerHeartbeat, type ListenerCounters, type ListenerOptions, type ListenerSignal, type MalformedKind, type ResetReason,
} from "./listener.ts";
export { END_SEQ, decodeSeq, encodeSeq } from "./replay.ts";
export { replayRange, type ReplayRangeOptions, type ReplayRangeResult, type ReplayedBatch } from "./replay-client.ts";
export type { Logger } from "./logger.ts";
