// vLLM's and SGLang's OpenAI servers turn the same chat request into different prompts (the tools' shape, how
// content parts join, a final assistant turn, the template's variables). The EPP must render as the pool's engine
// renders, or its block hashes match nothing the workers store, so each engine's rules are one value, named here:
// vllm-chat.ts and sglang-chat.ts hold them.
import type { ChatTemplate } from "./chat-template";
import type { ContentFormat } from "./content-format";
import type { ServerRendering } from "./hf-preprocessor";
import type { InlineSystemMode, InlineSystemOption } from "./request/inline-system";
import type { RoutedInput } from "./request/openai-body";
import { sglangRules } from "./sglang-chat";
import type { ChatMessage, ChatOptions } from "./types";
import { DEFAULT_RESPONSE_ROLE, vllmRules } from "./vllm-chat";
import { DEFAULT_INLINE_SYSTEM, UNPROBED_INLINE_SYSTEM } from "./request/inline-system";
import { DEFAULT_DISABLED_THINKING, UNPROBED_DISABLED_THINKING, type DisabledThinkingEffort, type DisabledThinkingOption } from "./request/anthropic-thinking";
import { parseJsonKeepingFloats } from "./py-values";

/** The workers' serving engine, whose chat rendering is mirrored. */
export type ChatEngine = "vllm" | "sglang";
export const CHAT_ENGINES = ["vllm", "sglang"] as const satisfies readonly ChatEngine[];

export type ChatInput = Extract<RoutedInput, { kind: "chat" }>;

/** A chat rendered: its text, and the final assistant message's text that SGLang tokenizes apart and appends. */
export type RenderedChat = { text: string; continuation?: string };

/** What a server renders chats with, as the rules read it (an HfPreprocessor). */
export type ChatServer = {
  readonly flags: ServerRendering;
  /** The tokenizer's special tokens that are set, as transformers hands them to the template. */
  readonly specialTokens: Record<string, unknown>;
  /** The served template of a chat with tools or without: --chat-template, else the tokenizer's (get_chat_template). */
  template(hasTools: boolean): ChatTemplate | null;
  /** A multimodal processor's own template (chat_template.json, else processor_config.json's), null without one. */
  readonly processorTemplate: ChatTemplate | null;
  /** Whether the served templates are several, by name (transformers' `chat_template` a dict). */
  readonly namedTemplates: boolean;
  /** The request's own template under vLLM's trust rules, or null when a served one renders it. */
  requestTemplate(opts: ChatOptions): ChatTemplate | null;
};

export type ChatRules = {
  readonly engine: ChatEngine;
  /** A validated /v1/chat/completions body's chat, with the fields this engine's request model reads (throws BadRequest). */
  readChat(o: Record<string, unknown>): ChatInput;
  /** Whether a /v1/responses body is rendered here; one that is not is routed by load. */
  readonly rendersResponses: boolean;
  /** The content format this engine detects on a template (kept with the compiled template). */
  detectFormat(source: string, ast: unknown): ContentFormat;
  render(messages: readonly ChatMessage[], opts: ChatOptions, server: ChatServer): RenderedChat;
  /**
   * The tools a request's template gets, as sent, the server's default ones included (what the routing bound counts
   * of them); undefined for none.
   */
  templateTools(chat: Pick<ChatOptions, "tools" | "toolChoice" | "templateKwargs">): unknown;
  /** The server's --default-chat-template-kwargs, parsed once for the rules and the renders alike. */
  readonly defaultKwargs: Record<string, unknown>;
  /**
   * What the engine's `echo` repeats of a chat's final `message` before the reply (vLLM's; an engine that reads no
   * echo has none), undefined where that is not mirrored (conversation.ts echoedText).
   */
  echoed?(message: ChatMessage, opts: ChatOptions, server: ChatServer): string | undefined;
  /**
   * The role of the reply to a chat rendered with a generation prompt, which its next turn sends it back with
   * (vLLM's --response-role; SGLang's is always "assistant").
   */
  readonly responseRole: string;
  /**
   * Where a /v1/messages body's inline system messages go (request/inline-system.ts): vLLM's mode, the one its
   * server is set to, or the one its probe of the served renderer picks (inline-system-probe.ts).
   * Absent for an engine whose Messages bodies are not rendered here.
   */
  readonly inlineSystem?: InlineSystemMode;
  /**
   * The reasoning_effort a /v1/messages body's `thinking: {type: "disabled"}` becomes (request/anthropic-thinking.ts):
   * vLLM's setting, or the one its probe of the served renderer picks (disabled-thinking-probe.ts). Absent as above.
   */
  readonly disabledThinkingEffort?: DisabledThinkingEffort;
};

type RuleFlags = {
  excludeToolsWhenToolChoiceNone?: boolean; responseRole?: string; anthropicInlineSystem?: InlineSystemOption;
  anthropicDisabledThinkingEffort?: DisabledThinkingOption; defaultChatTemplateKwargs?: string;
};

/**
 * The rules of `engine`, under the server's flags that decide which tools reach the template, the role its replies
 * come with, where a Messages body's inline system messages go and what its disabled thinking becomes (vLLM's).
 * "auto" means what vLLM's probes answer when they cannot decide ("fold", "low") until a probe of the renderer
 * decides (createPreprocessor; a pool's, settledMessagesOptions).
 */
export function chatRules(engine: ChatEngine = "vllm", flags: RuleFlags = {}): ChatRules {
  const defaults = defaultKwargs(flags.defaultChatTemplateKwargs);
  if (engine === "sglang") return sglangRules(defaults);
  const inline = flags.anthropicInlineSystem ?? DEFAULT_INLINE_SYSTEM;
  const disabled = flags.anthropicDisabledThinkingEffort ?? DEFAULT_DISABLED_THINKING;
  return vllmRules(flags.excludeToolsWhenToolChoiceNone === true, flags.responseRole ?? DEFAULT_RESPONSE_ROLE, {
    inlineSystem: inline === "auto" ? UNPROBED_INLINE_SYSTEM : inline,
    disabledThinkingEffort: disabled === "auto" ? UNPROBED_DISABLED_THINKING : disabled,
  }, defaults);
}

/** The server's default template kwargs from their JSON text (a JSON object: the options checked it). */
function defaultKwargs(text: string | undefined): Record<string, unknown> {
  if (text === undefined) return {};
  const parsed = parseJsonKeepingFloats(text);
  if (typeof parsed !== "object" || parsed === null || Array.isArray(parsed)) throw new Error("default chat template kwargs must be a JSON object");
  return parsed as Record<string, unknown>;
}
