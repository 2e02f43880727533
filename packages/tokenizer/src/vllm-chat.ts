// vLLM's chat rendering (vllm/renderers/hf.py render_messages over transformers' apply_chat_template); the
// messages, tools and content format it builds are in conversation.ts, messages.ts and content-format.ts.
import type { ChatRules, ChatServer, RenderedChat } from "./chat-rules";
import { runTemplate, type ChatTemplate } from "./chat-template";
import { detectContentFormat, type ContentFormat } from "./content-format";
import { conversation, echoedText } from "./conversation";
import type { ServerRendering } from "./hf-preprocessor";
import { ChatTemplateError, ChatUnrenderable, continueFinalMessage, templateTools as dumpedTools } from "./messages";
import { isPyDict } from "./py-values";
import { vllmChat } from "./request/openai-body";
import type { ChatMessage, ChatOptions } from "./types";

/** vLLM's --response-role by default. */
export const DEFAULT_RESPONSE_ROLE = "assistant";

type ToolChat = Pick<ChatOptions, "tools" | "toolChoice" | "templateKwargs">;

/**
 * vLLM's rules, `excludeTools` its --exclude-tools-when-tool-choice-none: the template gets tools=None for a
 * tool_choice of "none", and resolves as for a chat without. One value reads the flag, for the render and the
 * routing bound alike. `responseRole`: its --response-role; `messages`: how its Anthropic server converts a
 * /v1/messages body (inline system messages, disabled thinking); `defaultKwargs`: its --default-chat-template-kwargs,
 * parsed, which the render, the echo and the routing bound all read from here.
 */
export function vllmRules(
  excludeTools: boolean, responseRole: string, messages: Pick<ChatRules, "inlineSystem" | "disabledThinkingEffort">, defaultKwargs: Record<string, unknown>,
): ChatRules {
  const tools = (chat: ToolChat) => toolsOf(chat, excludeTools, defaultKwargs);
  return {
    engine: "vllm",
    readChat: vllmChat,
    rendersResponses: true,
    detectFormat: (_source, ast) => detectContentFormat(ast),
    render: (messages, opts, server) => renderVllmChat(messages, opts, server, tools(opts), defaultKwargs),
    templateTools: (chat) => tools(chat)?.value,
    defaultKwargs,
    echoed: (message, opts, server) =>
      server.flags.otherRenderer === undefined ? echoedText(message, templateOf(opts, server, tools(opts)).format) : undefined,
    responseRole,
    ...messages,
  };
}

/**
 * The tools a request's template gets, as sent, the server's default ones (`defaults`' tools) when the request has
 * none (undefined: none): what the routing bound counts of them.
 */
export function vllmTemplateTools(chat: ToolChat, excludeTools = false, defaults: Record<string, unknown> = {}): unknown {
  return toolsOf(chat, excludeTools, defaults)?.value;
}

/** The `tools` the template gets: the request's dumped as its pydantic model dumps them, the kwargs' as given. */
type Tools = { value: unknown; dump: boolean } | undefined;

/**
 * OnlineRenderer.preprocess_chat puts the request's tools (none for a tool_choice of "none" under
 * --exclude-tools-when-tool-choice-none) over the server's --default-chat-template-kwargs, and ChatParams.with_defaults
 * lays the request's chat_template_kwargs over those: a `tools` there wins unless null or "auto" (merge_kwargs' unset
 * values, which it drops from the overrides only, never from the defaults).
 */
function toolsOf(chat: ToolChat, excludeTools: boolean, defaults: Record<string, unknown> = {}): Tools {
  const own = chat.templateKwargs?.tools;
  if (own !== undefined && own !== null && own !== "auto") return { value: own, dump: false };
  const request = chat.toolChoice === "none" && excludeTools ? undefined : chat.tools;
  if (request !== undefined) return { value: request, dump: true };
  const fallback = defaults.tools;
  return fallback === undefined || fallback === null ? undefined : { value: fallback, dump: false };
}

/** The template a chat renders with, and the content format of the conversation the template gets. */
function templateOf(opts: ChatOptions, server: ChatServer, tools: Tools): { template: ChatTemplate; format: ContentFormat } {
  const own = server.requestTemplate(opts);
  // vLLM resolves the template, and from it the content format, with the tools the template gets
  // (resolve_chat_template): --chat-template, else the processor's own for a chat without tools, else the tokenizer's.
  const hasTools = tools !== undefined;
  const served = (server.flags.chatTemplate === undefined && !hasTools ? server.processorTemplate : null) ?? server.template(hasTools);
  const template = own ?? served;
  if (template === null) throw new ChatTemplateError("the model's tokenizer has no chat template");
  // vLLM detects the content format on ChatParams.chat_template: the request's own chat_template, else the
  // server's; a template given only in chat_template_kwargs renders the chat but does not choose its format.
  return { template, format: formatOf(server.flags, opts.chatTemplate ? template : served) };
}

function renderVllmChat(messages: readonly ChatMessage[], opts: ChatOptions, server: ChatServer, tools: Tools, defaults: Record<string, unknown>): RenderedChat {
  const other = server.flags.otherRenderer;
  if (other !== undefined) throw new ChatUnrenderable(`vLLM renders this model's chats ${other}, not with a Jinja template: not mirrored here`);
  const { template, format } = templateOf(opts, server, tools);
  const chat = conversation(messages, format);
  // As transformers renders: the special tokens, apply_chat_template's default documents=None, then the request's
  // chat_template_kwargs (with its documents, see templateKwargsOf) over the server's defaults, then what the
  // request's own fields say: its add_generation_prompt wins over the kwargs' (build_chat_params).
  const vars: Record<string, unknown> = {
    ...server.specialTokens,
    documents: null,
    ...withDefaults(defaults, opts.templateKwargs),
    messages: chat,
    tools: templateToolsValue(tools),
    add_generation_prompt: opts.addGenerationPrompt ?? true,
  };
  const rendered = runTemplate(template, vars);
  return { text: opts.continueFinalMessage ? continueFinalMessage(rendered, chat) : rendered };
}

/**
 * The template's `tools`: transformers takes each tool that is a dict as it is and refuses any other (a ValueError,
 * vLLM's 400); the request's own are dumped as vLLM's pydantic model dumps them.
 */
function templateToolsValue(tools: Tools): unknown {
  if (tools === undefined) return null;
  if (tools.dump) return dumpedTools(tools.value as unknown[]);
  if (!Array.isArray(tools.value) || !tools.value.every(isPyDict))
    throw new ChatTemplateError("Tools should either be a JSON schema, or a callable function with type hints and a docstring suitable for auto-conversion to a schema.");
  return tools.value;
}

// --chat-template-content-format forces the format; "auto" (the default) detects it on the template rendering.
function formatOf(flags: ServerRendering, template: ChatTemplate | null): ContentFormat {
  const forced = flags.contentFormat ?? "auto";
  return forced !== "auto" ? forced : (template?.contentFormat ?? "string");
}

/**
 * vLLM's ChatParams.with_defaults: the request's template variables over the server's defaults, where a request's
 * null or "auto" leaves the default (merge_kwargs' unset values). vLLM always has defaults to merge with (it adds
 * `tokenize` to the server's), so a request's null or "auto" is dropped even when the server sets none.
 */
function withDefaults(defaults: Record<string, unknown>, request: Record<string, unknown> | undefined): Record<string, unknown> {
  const out = { ...defaults };
  for (const [k, v] of Object.entries(request ?? {})) if (v !== null && v !== "auto") out[k] = v;
  // apply_chat_template takes these as its own arguments, not as variables: the template (see requestTemplate), the
  // tools (see toolsOf), whether to tokenize, and continue_final_message (the request's own field always sets it).
  for (const k of APPLY_ARGUMENTS) delete out[k];
  return out;
}

const APPLY_ARGUMENTS = ["chat_template", "tools", "tokenize", "continue_final_message"];
