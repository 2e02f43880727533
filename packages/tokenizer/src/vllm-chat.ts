// vLLM's chat rendering (vllm/renderers/hf.py render_messages over transformers' apply_chat_template); the
// messages, tools and content format it builds are in conversation.ts, messages.ts and content-format.ts.
import type { ChatRules, ChatServer, RenderedChat } from "./chat-rules";
import { runTemplate, type ChatTemplate } from "./chat-template";
import { detectContentFormat, type ContentFormat } from "./content-format";
import { conversation, echoedText } from "./conversation";
import type { ServerRendering } from "./hf-preprocessor";
import { ChatTemplateError, continueFinalMessage, templateTools as dumpedTools } from "./messages";
import { vllmChat } from "./request/openai-body";
import type { ChatMessage, ChatOptions } from "./types";

/** vLLM's --response-role by default. */
export const DEFAULT_RESPONSE_ROLE = "assistant";

/**
 * vLLM's rules, `excludeTools` its --exclude-tools-when-tool-choice-none: the template gets tools=None for a
 * tool_choice of "none", and resolves as for a chat without. One value reads the flag, for the render and the
 * routing bound alike. `responseRole`: its --response-role.
 */
export function vllmRules(excludeTools: boolean, responseRole: string): ChatRules {
  const templateTools = (chat: Pick<ChatOptions, "tools" | "toolChoice">) => (chat.toolChoice === "none" && excludeTools ? undefined : chat.tools);
  return {
    engine: "vllm",
    readChat: vllmChat,
    rendersResponses: true,
    detectFormat: (_source, ast) => detectContentFormat(ast),
    render: (messages, opts, server) => renderVllmChat(messages, opts, server, templateTools(opts)),
    templateTools,
    echoed: (message, opts, server) => echoedText(message, templateOf(opts, server, templateTools(opts)).format),
    responseRole,
  };
}

/** The template a chat renders with, and the content format of the conversation the template gets. */
function templateOf(opts: ChatOptions, server: ChatServer, tools: unknown[] | undefined): { template: ChatTemplate; format: ContentFormat } {
  const own = server.requestTemplate(opts);
  // vLLM resolves the template, and from it the content format, with the request's tools (resolve_chat_template).
  const served = server.template(tools !== undefined);
  const template = own ?? served;
  if (template === null) throw new ChatTemplateError("the model's tokenizer has no chat template");
  // vLLM detects the content format on ChatParams.chat_template: the request's own chat_template, else the
  // server's; a template given only in chat_template_kwargs renders the chat but does not choose its format.
  return { template, format: formatOf(server.flags, opts.chatTemplate ? template : served) };
}

function renderVllmChat(messages: readonly ChatMessage[], opts: ChatOptions, server: ChatServer, tools: unknown[] | undefined): RenderedChat {
  const { template, format } = templateOf(opts, server, tools);
  const chat = conversation(messages, format);
  // As transformers renders: the special tokens, apply_chat_template's default documents=None, then the request's
  // chat_template_kwargs (with its documents, see templateKwargsOf) over the server's defaults, then what the
  // request's own fields say (vLLM passes tools=None when the request has none).
  const vars: Record<string, unknown> = {
    ...server.specialTokens,
    documents: null,
    ...withDefaults(server.flags.defaultKwargs ?? {}, opts.templateKwargs),
    messages: chat,
    tools: tools === undefined ? null : dumpedTools(tools),
    add_generation_prompt: opts.addGenerationPrompt ?? true,
  };
  const rendered = runTemplate(template, vars);
  return { text: opts.continueFinalMessage ? continueFinalMessage(rendered, chat) : rendered };
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
  // apply_chat_template takes it as the template (see requestTemplate), not as a variable.
  delete out.chat_template;
  return out;
}
