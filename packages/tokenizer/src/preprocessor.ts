import { byteLevelDecoder } from "./byte-level-decode";
import { byteFallbackDecode, byteFallbackEncode, byteFallbackRenderChat } from "./byte-fallback";
import { chatRules, type ChatRules } from "./chat-rules";
import { HfPreprocessor } from "./hf-preprocessor";
import { DEFAULT_RESPONSE_ROLE } from "./vllm-chat";
import { DEFAULT_TOKENIZER_MODE, vllmOtherRenderer } from "./vllm-renderers";
import { servedConversationTemplate } from "./sglang-conversation";
import { registerPreprocessorMetrics } from "./metrics";
import { loadChatTemplate, loadSglangChatTemplate, loadTokenizerFiles, type TokenizerFiles } from "./tokenizer-files";
import { truncatePrompt } from "./truncation";
import { DEFAULT_INLINE_SYSTEM } from "./request/inline-system";
import { probeInlineSystem } from "./request/inline-system-probe";
import { DEFAULT_DISABLED_THINKING } from "./request/anthropic-thinking";
import { probeDisabledThinkingEffort } from "./request/disabled-thinking-probe";
import { NO_CACHE_STATS, type ChatMessage, type ChatOptions, type Preprocessor, type PreprocessorOptions } from "./types";

/**
 * The request preprocessor of one model: a Hugging Face tokenizer read from `tokenizerDir`, or the byte-level
 * fallback when no directory is given. Loading is synchronous (a few hundred ms for a 150k vocabulary) and happens
 * once per model at startup; a directory that is given but unreadable throws. `files`: that directory as read already
 * (a pool member's, read once for the pool), not read again.
 */
export function createPreprocessor(opts: PreprocessorOptions = {}, files?: TokenizerFiles): Preprocessor {
  const rules = chatRules(opts.chatRendering, opts);
  // SGLang's --chat-template naming a conversation template is no file to read here.
  const conversation = servedConversationTemplate(opts) ?? undefined;
  const read = opts.tokenizerDir === undefined ? undefined : (files ?? loadTokenizerFiles(opts.tokenizerDir));
  const pre: Preprocessor = read === undefined
    ? byteFallbackPreprocessor(rules)
    : new HfPreprocessor(read, opts.cache ?? {}, opts.fastBpe ?? true, {
      // It wins over the tokenizer's templates, tools or not (resolve_chat_template's first choice).
      chatTemplate: opts.chatTemplate === undefined || conversation !== undefined ? undefined
        : rules.engine === "sglang" ? loadSglangChatTemplate(opts.chatTemplate) : loadChatTemplate(opts.chatTemplate),
      conversationTemplate: conversation,
      otherRenderer: rules.engine === "vllm" ? vllmOtherRenderer(opts.tokenizerMode ?? DEFAULT_TOKENIZER_MODE, read.modelFiles) : undefined,
      contentFormat: opts.chatTemplateContentFormat,
      trustRequestChatTemplate: opts.trustRequestChatTemplate,
      renderBoundScale: opts.renderBoundScale,
    }, rules);
  if (pre instanceof HfPreprocessor && rules.engine === "vllm") settleMessagesRules(pre, read!, opts);
  if (opts.registry !== undefined) {
    registerPreprocessorMetrics(opts.registry, { model: opts.model ?? "", kind: pre.kind, cacheStats: () => pre.cacheStats() });
  }
  return pre;
}

/**
 * vLLM's "auto" for how its Anthropic server converts a Messages body: what its probes pick on the served renderer,
 * which this one mirrors. The probes' renders are no traffic: the cache forgets them. A probe that cannot even be
 * prepared (a tokenizer config the marker ids cannot be read from) leaves the unprobed modes, told to `opts.log`.
 */
function settleMessagesRules(pre: HfPreprocessor, files: TokenizerFiles, opts: PreprocessorOptions): void {
  const inline = (opts.anthropicInlineSystem ?? DEFAULT_INLINE_SYSTEM) === "auto";
  const disabled = (opts.anthropicDisabledThinkingEffort ?? DEFAULT_DISABLED_THINKING) === "auto";
  if (!inline && !disabled) return;
  const encodeBody = (body: Record<string, unknown>) => {
    const { kind: _, messages, ...chat } = pre.rules.readChat(body);
    return pre.encodeChat(messages, chat);
  };
  try {
    const settled = {
      ...(inline ? { inlineSystem: probeInlineSystem({ encodeBody, decode: byteLevelDecoder(files.tokenizerJson) ?? ((ids) => pre.decode(ids)), markerIds: pre.markerIds }).mode } : {}),
      ...(disabled ? { disabledThinkingEffort: probeDisabledThinkingEffort(encodeBody) } : {}),
    };
    pre.rules = { ...pre.rules, ...settled };
  } catch (err) {
    opts.log?.warn({ err: (err as Error).message }, "the Messages probes could not run: their unprobed modes are kept");
  }
  pre.resetCache();
}

/** How a preprocessor converts /v1/messages bodies (vLLM's rules; absent under rules that do not convert them). */
export type MessagesModes = Required<Pick<ChatRules, "inlineSystem" | "disabledThinkingEffort">>;

/** The modes `rules` convert Messages bodies by, or undefined where they convert none (SGLang's). */
export function messagesModes(rules: ChatRules): MessagesModes | undefined {
  const { inlineSystem, disabledThinkingEffort } = rules;
  return inlineSystem === undefined || disabledThinkingEffort === undefined ? undefined : { inlineSystem, disabledThinkingEffort };
}

/**
 * `pre` converts Messages bodies by `modes` from now on: a pool member started before its pool's probe decided, told
 * the verdict before its first job.
 */
export function adoptMessagesModes(pre: Preprocessor, modes: MessagesModes): void {
  (pre as { rules: ChatRules }).rules = { ...pre.rules, ...modes };
}

/** `opts` with its Messages modes set to `modes`, concrete options that need no probe; as they are without. */
function withModes<T extends Omit<PreprocessorOptions, "log">>(opts: T, modes: MessagesModes | undefined): T {
  return modes === undefined ? opts : { ...opts, anthropicInlineSystem: modes.inlineSystem, anthropicDisabledThinkingEffort: modes.disabledThinkingEffort };
}

/**
 * `opts` with the Messages modes it leaves to "auto" made concrete, by one probe of the preprocessor they describe:
 * for a pool, whose members and own reading then share that one verdict instead of each probing. `files`: the
 * tokenizer directory as read already; `log`: told if the probes cannot run. A preprocessor that cannot be built leaves the unprobed modes (its members
 * fail on it the same way).
 */
export function settledMessagesOptions<T extends Omit<PreprocessorOptions, "log">>(opts: T, files?: TokenizerFiles, log?: PreprocessorOptions["log"]): T {
  let rules: ChatRules;
  try {
    rules = createPreprocessor({ ...opts, registry: undefined, cache: false, log }, files).rules;
  } catch {
    rules = chatRules(opts.chatRendering, opts);
  }
  return withModes(opts, messagesModes(rules));
}

/**
 * `opts` with the Messages modes it leaves to "auto" at what they mean unprobed ("fold", "low"), so that a
 * preprocessor made by them does not probe: a pool member that starts while its pool probes, and adopts the verdict
 * (adoptMessagesModes) before any job.
 */
export function unprobedMessagesOptions<T extends Omit<PreprocessorOptions, "log">>(opts: T): T {
  return withModes(opts, messagesModes(chatRules(opts.chatRendering, opts)));
}

/**
 * A rendering flag set and ignored, by its CLI name, and why: `no_template`, no tokenizer directory (the byte-level
 * fallback has no chat template); `vllm_only`, a vLLM flag under SGLang's rules.
 */
export type IgnoredFlag = { flag: string; cause: "no_template" | "vllm_only" };

/**
 * The rendering flags `opts` sets away from their defaults that are ignored: for the caller to warn of, in its own
 * words for each cause. A preprocessor without a tokenizer directory ignores them all but the response role (the
 * fallback renders roles); SGLang's rules ignore those only vLLM has.
 */
export function ignoredRenderingFlags(opts: PreprocessorOptions): IgnoredFlag[] {
  const noTemplate = opts.tokenizerDir === undefined ? ("no_template" as const) : undefined;
  // What the fallback mirrors too (roles, Messages bodies) is ignored only under SGLang's rules.
  const underSglang = opts.chatRendering === "sglang" ? ("vllm_only" as const) : undefined;
  const vllmOnly = noTemplate ?? underSglang;
  const flags: [flag: string, set: boolean, cause: IgnoredFlag["cause"] | undefined][] = [
    ["--default-chat-template-kwargs", opts.defaultChatTemplateKwargs !== undefined, noTemplate],
    ["--chat-template", opts.chatTemplate !== undefined, noTemplate],
    ["--exclude-tools-when-tool-choice-none", opts.excludeToolsWhenToolChoiceNone === true, vllmOnly],
    ["--chat-template-content-format", (opts.chatTemplateContentFormat ?? "auto") !== "auto", vllmOnly],
    ["--trust-request-chat-template", opts.trustRequestChatTemplate === true, vllmOnly],
    // The fallback renders roles too, a reply's among them.
    ["--response-role", (opts.responseRole ?? DEFAULT_RESPONSE_ROLE) !== DEFAULT_RESPONSE_ROLE, underSglang],
    ["--tokenizer-mode", (opts.tokenizerMode ?? DEFAULT_TOKENIZER_MODE) !== DEFAULT_TOKENIZER_MODE, vllmOnly],
    // The fallback converts Messages bodies too, so a mode set is kept there.
    ["--anthropic-inline-system", (opts.anthropicInlineSystem ?? DEFAULT_INLINE_SYSTEM) !== DEFAULT_INLINE_SYSTEM, underSglang],
    ["--anthropic-disabled-thinking-effort", (opts.anthropicDisabledThinkingEffort ?? DEFAULT_DISABLED_THINKING) !== DEFAULT_DISABLED_THINKING, underSglang],
  ];
  return flags.flatMap(([flag, set, cause]) => (set && cause !== undefined ? [{ flag, cause }] : []));
}

const byteFallbackPreprocessor = (rules: ChatRules): Preprocessor => ({
  kind: "byte-fallback",
  rules,
  encodeCompletion: (prompt, opts = {}) => truncatePrompt(typeof prompt === "string" ? byteFallbackEncode(prompt) : Uint32Array.from(prompt), opts),
  encodeChat: (messages: readonly ChatMessage[], opts: ChatOptions = {}) => truncatePrompt(byteFallbackEncode(byteFallbackRenderChat(messages, opts)), opts),
  renderChat: byteFallbackRenderChat,
  // No template, so no engine's conversation to take an echo from.
  echoed: () => undefined,
  decode: byteFallbackDecode,
  cacheStats: () => NO_CACHE_STATS,
  resetCache: () => {},
});

