export { createPreprocessor, ignoredRenderingFlags, type IgnoredFlag } from "./preprocessor";
export { loadChatTemplate, loadSglangChatTemplate } from "./tokenizer-files";
export { servedConversationTemplate } from "./sglang-conversation";
export { CONTENT_FORMAT_OPTIONS, type ContentFormatOption } from "./content-format";
export { CHAT_ENGINES, chatRules, type ChatEngine, type ChatRules } from "./chat-rules";
export { DEFAULT_RESPONSE_ROLE } from "./vllm-chat";
export { DEFAULT_INLINE_SYSTEM, INLINE_SYSTEM_OPTIONS, type InlineSystemOption } from "./request/inline-system";
export { DEFAULT_DISABLED_THINKING, DISABLED_THINKING_OPTIONS, type DisabledThinkingOption } from "./request/anthropic-thinking";
export { DEFAULT_TOKENIZER_MODE, servedVllmRenderer } from "./vllm-renderers";
export { byteFallbackEncode, byteFallbackDecode, byteFallbackRenderChat } from "./byte-fallback";
export { SegmentCache, DEFAULT_CACHE_MAX_BYTES } from "./segment-cache";
export { ChatTemplateError, ChatUnrenderable } from "./messages";
export { PyFloat, parseJsonKeepingFloats } from "./py-values";
export { keepsTail, truncatePrompt, truncates, type Truncation } from "./truncation";
export { EncodeStopped, type EncodeControl, type KnownPrefix } from "./segmenter";
export { responsesChat, ResponsesInputError, type ResponsesChat } from "./responses";
export { firstMediaPosition, isMediaPart, mediaPositions, type MediaPosition } from "./media";
export type {
  CacheOptions, CacheStats, ChatMessage, ChatOptions, CompletionOptions, ContentPart, Preprocessor, PreprocessorKind, PreprocessorOptions,
} from "./types";
export {
  DEFAULT_MEMBER_NICE, TokenizerPool, TokenizeCancelled, type Decides, type FallbackCause, type PoolObserver, type PoolOptions, type PoolStats, type TokenizeOutcome,
} from "./pool/tokenizer-pool";
export type { BodyReading } from "./pool/protocol";
export { setThreadPriority, threadScheduling } from "./pool/thread-priority";
export { affinityKey } from "./pool/affinity";
export { joinBody } from "./pool/shared-body";
export { encodeJob, nextTurnJob, replyRole, type BodyJob, type PoolJob, type TokenizeJob, type Unrendered } from "./job";
// OpenAI request bodies, read the same way by the EPP's event loop and by a pool member.
export { BadRequest } from "./request/bad-request";
export {
  chatMessages, MAX_BODY_BYTES, MAX_JSON_DEPTH, parseBody, parseBodyBytes, readChatBody, responsesTemplateKwargs, templateKwargsOf, TooDeep,
  type ParsedBody, type RoutedInput,
} from "./request/openai-body";
export { glanceBody, readBody, readTokenIds, type BodyFields, type BodyRead, type BodyRequest } from "./request/read-body";
export { rewriteBodyModel } from "./request/body-model";
export { ruleTarget, type RewriteRules, type RuleTargets, type TargetModel } from "./request/rewrite-rules";
export { ROUTING_TEXT_CHARS, routingJob, routingPrefix } from "./request/routing-job";
export { cpuThrottlingReader, defaultPoolSize, poolSizing, type PoolSizing } from "./pool/cpu-limit";
export { cgroupDirs, readOrNull, tightest, type CgroupDirs, type ReadFile } from "./pool/cgroup";
export { mixedText, seeded, warmUp, type WarmUp } from "./warm-up";
export { eventLoopLag, poolMetrics } from "./pool/pool-metrics";
