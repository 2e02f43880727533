export { createPreprocessor } from "./preprocessor";
export { byteFallbackEncode, byteFallbackDecode, byteFallbackRenderChat } from "./byte-fallback";
export { SegmentCache, DEFAULT_CACHE_MAX_BYTES } from "./segment-cache";
export { ChatTemplateError } from "./messages";
export { PyFloat, parseJsonKeepingFloats } from "./py-values";
export { truncatePrompt, type Truncation } from "./truncation";
export { firstMediaPosition, isMediaPart, mediaPositions, type MediaPosition } from "./media";
export type {
  CacheOptions, CacheStats, ChatMessage, ChatOptions, CompletionOptions, ContentPart, Preprocessor, PreprocessorKind, PreprocessorOptions,
} from "./types";
