import { parseJsonKeepingFloats } from "./py-values";
import { byteFallbackDecode, byteFallbackEncode, byteFallbackRenderChat } from "./byte-fallback";
import { HfPreprocessor } from "./hf-preprocessor";
import { registerPreprocessorMetrics } from "./metrics";
import { loadChatTemplate, loadTokenizerFiles } from "./tokenizer-files";
import { truncatePrompt } from "./truncation";
import { NO_CACHE_STATS, type ChatMessage, type ChatOptions, type Preprocessor, type PreprocessorOptions } from "./types";

/**
 * The request preprocessor of one model: a Hugging Face tokenizer read from `tokenizerDir`, or the byte-level
 * fallback when no directory is given. Loading is synchronous (a few hundred ms for a 150k vocabulary) and happens
 * once per model at startup; a directory that is given but unreadable throws.
 */
export function createPreprocessor(opts: PreprocessorOptions = {}): Preprocessor {
  const pre: Preprocessor = opts.tokenizerDir === undefined
    ? byteFallbackPreprocessor
    : new HfPreprocessor(loadTokenizerFiles(opts.tokenizerDir), opts.cache ?? {}, opts.fastBpe ?? true, {
      defaultKwargs: defaultKwargs(opts.defaultChatTemplateKwargs),
      excludeToolsWhenToolChoiceNone: opts.excludeToolsWhenToolChoiceNone,
      // It wins over the tokenizer's templates, tools or not (resolve_chat_template's first choice).
      chatTemplate: opts.chatTemplate === undefined ? undefined : loadChatTemplate(opts.chatTemplate),
      contentFormat: opts.chatTemplateContentFormat,
      trustRequestChatTemplate: opts.trustRequestChatTemplate,
    });
  if (opts.registry !== undefined) {
    registerPreprocessorMetrics(opts.registry, { model: opts.model ?? "", kind: pre.kind, cacheStats: () => pre.cacheStats() });
  }
  return pre;
}

/**
 * The vLLM rendering flags `opts` sets away from their defaults that a preprocessor without a tokenizer directory
 * ignores (the byte-level fallback has no chat template), by their CLI names: for the caller to warn of.
 */
export function ignoredRenderingFlags(opts: PreprocessorOptions): string[] {
  if (opts.tokenizerDir !== undefined) return [];
  const set: [string, boolean][] = [
    ["--default-chat-template-kwargs", opts.defaultChatTemplateKwargs !== undefined],
    ["--chat-template", opts.chatTemplate !== undefined],
    ["--exclude-tools-when-tool-choice-none", opts.excludeToolsWhenToolChoiceNone === true],
    ["--chat-template-content-format", (opts.chatTemplateContentFormat ?? "auto") !== "auto"],
    ["--trust-request-chat-template", opts.trustRequestChatTemplate === true],
  ];
  return set.filter(([, on]) => on).map(([flag]) => flag);
}

const byteFallbackPreprocessor: Preprocessor = {
  kind: "byte-fallback",
  encodeCompletion: (prompt, opts = {}) => truncatePrompt(typeof prompt === "string" ? byteFallbackEncode(prompt) : Uint32Array.from(prompt), opts),
  encodeChat: (messages: readonly ChatMessage[], opts: ChatOptions = {}) => truncatePrompt(byteFallbackEncode(byteFallbackRenderChat(messages, opts)), opts),
  renderChat: byteFallbackRenderChat,
  decode: byteFallbackDecode,
  cacheStats: () => NO_CACHE_STATS,
  resetCache: () => {},
};

/** The server's default template kwargs from their JSON text (a JSON object: the options checked it). */
function defaultKwargs(text: string | undefined): Record<string, unknown> {
  if (text === undefined) return {};
  const parsed = parseJsonKeepingFloats(text);
  if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed)) throw new Error("default chat template kwargs must be a JSON object");
  return parsed as Record<string, unknown>;
}
