import type { Registry } from "prom-client";
import type { Truncation } from "./truncation";
import type { EncodeControl } from "./segmenter";
import type { ContentFormatOption } from "./content-format";
import type { ChatEngine, ChatRules } from "./chat-rules";
import type { InlineSystemOption } from "./request/inline-system";
import type { DisabledThinkingOption } from "./request/anthropic-thinking";

/** An OpenAI chat message; of its other fields, those vLLM knows (tool_calls, reasoning, name, ...) reach the chat template (see conversation.ts). */
export type ChatMessage = {
  role: string;
  content?: string | ContentPart[] | null;
  [field: string]: unknown;
};
export type ContentPart = { type: string; text?: string; [field: string]: unknown };

/** The request's `add_special_tokens` (default true for /v1/completions) and truncate_prompt_tokens. */
export type CompletionOptions = Truncation & { addSpecialTokens?: boolean };

export type ChatOptions = Truncation & {
  /** OpenAI `tools` of the request; the template sees them as `tools`. */
  tools?: unknown[];
  /** The request's `tool_choice` as sent: "none" drops the tools under --exclude-tools-when-tool-choice-none. */
  toolChoice?: unknown;
  /** The request's own `chat_template` (see PreprocessorOptions.trustRequestChatTemplate). */
  chatTemplate?: string;
  /**
   * Extra template variables: vLLM's `chat_template_kwargs` (e.g. `{ enable_thinking: false }`) with what the request's
   * `documents` and `reasoning_effort` add to them (see templateKwargsOf).
   */
  templateKwargs?: Record<string, unknown>;
  /** The request's `add_generation_prompt` (vLLM's default, and ours, is true). */
  addGenerationPrompt?: boolean;
  /**
   * The request's `continue_final_message`: the rendering ends right after the final message's text
   * (no end of turn), so the model continues it. Used with addGenerationPrompt false.
   */
  continueFinalMessage?: boolean;
  /** The request's `add_special_tokens`: vLLM's chat default is false (the template places them). */
  addSpecialTokens?: boolean;
  /**
   * The messages stop before the request's final message (a chat cut at the routing bound, job.ts's renderOptions):
   * their last renders as any earlier one (SGLang's final-turn rule is for the request's final message).
   */
  beforeFinal?: boolean;
  /** SGLang's request-level `reasoning_effort`, which it hands the template beside `chat_template_kwargs` (sglang-chat.ts). */
  reasoningEffort?: unknown;
};

export type CacheOptions = {
  maxEntries?: number;
  maxBytes?: number;
  /**
   * A section longer than this (characters) is cached in pieces cut at the tokenizer's proven cut points, the
   * first at or after every `pieceChars` from the previous cut (default DEFAULT_PIECE_CHARS); 0 caches whole
   * sections. See Segmenter.
   */
  pieceChars?: number;
};

export type PreprocessorOptions = {
  /** Directory holding tokenizer.json and tokenizer_config.json; absent → byte-level fallback. */
  tokenizerDir?: string;
  /**
   * The workers' engine, whose OpenAI server's rules chats are read and rendered by (chat-rules.ts): "vllm" (the
   * default) or "sglang". The flags below are vLLM's; SGLang's rules read only defaultChatTemplateKwargs, chatTemplate
   * and modelPath.
   */
  chatRendering?: ChatEngine;
  /** Segment cache bounds, or false to disable it (the EPP's --tokenizer-cache-bytes 0, the bench's "no cache" arm). */
  cache?: CacheOptions | false;
  /** Registry for the cache and fallback metrics; absent → no Prometheus metrics (plain numbers still kept). */
  registry?: Registry;
  /** Told when the Messages probes cannot run (their unprobed modes are kept): once, at startup. */
  log?: { warn(obj: object, msg: string): void };
  /**
   * Tokenize with the purpose-built BPE (src/fast) when it implements the model's tokenizer.json (default true);
   * false keeps `@huggingface/tokenizers` (the bench's baseline). Both give the same ids.
   */
  fastBpe?: boolean;
  /** Label value for the metrics (the model name). */
  model?: string;
  /**
   * vLLM's `--default-chat-template-kwargs` of the server rendering these chats, as its JSON text (parsed here as
   * Python's json parses it, `1.0` a float): template variables every chat renders with unless its own kwargs set
   * them (to a value other than null or "auto").
   */
  defaultChatTemplateKwargs?: string;
  /** vLLM's `--exclude-tools-when-tool-choice-none`: a chat whose tool_choice is "none" renders without its tools. */
  excludeToolsWhenToolChoiceNone?: boolean;
  /**
   * vLLM's `--chat-template`: a file's path, or the template itself (told apart as vLLM does, see loadChatTemplate).
   * It replaces the tokenizer's templates, for requests with tools too. SGLang's: a `.jinja` file; any other value
   * names one of its conversation templates, whose chats are routed by load (sglang-conversation.ts).
   */
  chatTemplate?: string;
  /**
   * SGLang's `--model-path` of the workers: a model whose path SGLang's conversation.py matchers recognize (or whose
   * config.json there names a model_type they map) is served with one of SGLang's conversation templates, and its
   * chats are routed by load (sglang-conversation.ts). Without it no such guess is made.
   */
  modelPath?: string;
  /**
   * vLLM's `--chat-template-content-format`: "string" or "openai" gives every message's content to the template in
   * that shape; "auto" (the default) detects it on the template (see content-format.ts).
   */
  chatTemplateContentFormat?: ContentFormatOption;
  /**
   * vLLM's `--trust-request-chat-template`: a request's own template (`chat_template`, or chat_template_kwargs'
   * `chat_template`) renders it; without it, such a request is refused (ChatTemplateError, a 400), as vLLM refuses it.
   */
  trustRequestChatTemplate?: boolean;
  /**
   * vLLM's `--response-role` ("assistant" by default): the role of the reply to a chat rendered with a generation
   * prompt. A reply's next turn sends it back in that role, and `echo` repeats a final message of that role.
   */
  responseRole?: string;
  /**
   * vLLM's `--tokenizer-mode` ("auto" by default). Chats of a model vLLM renders otherwise than with a Jinja template
   * (gpt-oss through Harmony, a tokenizer mode with a renderer of its own: vllm-renderers.ts) are routed by load
   * (ChatUnrenderable).
   */
  tokenizerMode?: string;
  /**
   * Where vLLM's Anthropic server puts a /v1/messages body's inline system messages (request/inline-system.ts):
   * "preserve", "fold", or "auto" (the default), which probes the served template at startup as vLLM's server does
   * (request/inline-system-probe.ts).
   */
  anthropicInlineSystem?: InlineSystemOption;
  /**
   * The reasoning_effort vLLM's Anthropic server gives a /v1/messages body's `thinking: {type: "disabled"}`
   * (request/anthropic-thinking.ts): "none", an effort, or "auto" (the default), which probes the served template at
   * startup as vLLM's server does (request/disabled-thinking-probe.ts).
   */
  anthropicDisabledThinkingEffort?: DisabledThinkingOption;
  /**
   * How many times over a chat template's render may spend its bound on work (RenderBound in py-template.ts, past
   * which the chat is ChatUnrenderable): 1, the default, is the EPP's. vLLM's jinja2 has no such bound.
   */
  renderBoundScale?: number;
};

export type CacheStats = {
  hits: number; misses: number; entries: number; bytes: number; evictions: number; freshTokens: number;
  /** Tokens found cached only because a background warm put them there (see SegmentCache.warmedHitTokens). */
  warmedHitTokens: number;
};

/** What a preprocessor without a segment cache reports. */
export const NO_CACHE_STATS: CacheStats = { hits: 0, misses: 0, entries: 0, bytes: 0, evictions: 0, freshTokens: 0, warmedHitTokens: 0 };

export type PreprocessorKind = "hf" | "byte-fallback";

export interface Preprocessor {
  readonly kind: PreprocessorKind;
  /** The engine's rules its chats are read and rendered by (a body's reader takes them from here). */
  readonly rules: ChatRules;
  /** `/v1/completions`: a text prompt gets the model's special-token rules; a token-id prompt is used as given. */
  encodeCompletion(prompt: string | readonly number[], opts?: CompletionOptions, control?: EncodeControl): Uint32Array;
  /** `/v1/chat/completions`: chat template with add_generation_prompt, then tokenized without adding special tokens. */
  encodeChat(messages: readonly ChatMessage[], opts?: ChatOptions, control?: EncodeControl): Uint32Array;
  /**
   * The rendered chat text. encodeChat tokenizes it, except that SGLang's continued final message (its rules'
   * `continuation`, appended here) is tokenized on its own and its ids appended, so they may differ where they meet.
   */
  renderChat(messages: readonly ChatMessage[], opts?: ChatOptions): string;
  /** What the engine's `echo` repeats of a chat's final message before its reply (ChatRules.echoed); undefined: not mirrored. */
  echoed(message: ChatMessage, opts: ChatOptions): string | undefined;
  decode(ids: ArrayLike<number>): string;
  cacheStats(): CacheStats;
  /** Forgets every cached section and zeroes the cache's counters (after a warm-up: what it cached is not traffic). */
  resetCache(): void;
}
