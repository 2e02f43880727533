export { createPreprocessor } from "./preprocessor";
export { byteFallbackEncode, byteFallbackDecode, byteFallbackRenderChat } from "./byte-fallback";
export { SegmentCache, DEFAULT_CACHE_MAX_BYTES } from "./segment-cache";
export { ChatTemplateError } from "./messages";
export { PyFloat, parseJsonKeepingFloats } from "./py-values";
export { keepsTail, truncatePrompt, truncates, type Truncation } from "./truncation";
export { EncodeStopped, type EncodeControl, type KnownPrefix } from "./segmenter";
export { responsesChat, ResponsesInputError, type ResponsesChat } from "./responses";
export { firstMediaPosition, isMediaPart, mediaPositions, type MediaPosition } from "./media";
export type {
  CacheOptions, CacheStats, ChatMessage, ChatOptions, CompletionOptions, ContentPart, Preprocessor, PreprocessorKind, PreprocessorOptions,
} from "./types";
export { TokenizerPool, TokenizeCancelled, type FallbackCause, type PoolObserver, type PoolOptions, type PoolStats, type TokenizeOutcome } from "./pool/tokenizer-pool";
export { encodeJob, type TokenizeJob } from "./job";
export { cpuLimit } from "./pool/cpu-limit";
export { eventLoopLag, poolMetrics } from "./pool/pool-metrics";
