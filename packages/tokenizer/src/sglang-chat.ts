// SGLang's chat rendering, for pools of SGLang workers: its Jinja path as of SGLang commit
// 3ba38dc009511b7210fe62163f16dae2346cf6a7, in python/sglang/srt/entrypoints/chat_input/ (processor.py:
// ChatInputProcessor._resolve_input, _prepare_tools; renderers.py: ChatRenderer._apply_jinja_template,
// _handle_last_assistant_message, normalize_tool_content; normalization.py: normalize_reasoning_inputs; schema.py:
// the message and tool models) and python/sglang/srt/parser/jinja_template_utils.py
// (detect_jinja_template_content_format, process_content_for_template_format). What it does that is not mirrored
// is detected in sglang-gaps.ts (routed by load), as is a model SGLang serves with one of its own conversation
// templates (sglang-conversation.ts). One served with a Python encoder instead of the template (DeepSeek V3.2/V4,
// Kimi K3) renders otherwise and is not mirrored.
import type { ChatInput, ChatRules, ChatServer, RenderedChat } from "./chat-rules";
import { runTemplate } from "./chat-template";
import { reads, walk, type ContentFormat } from "./content-format";
import { ChatTemplateError, ChatUnrenderable } from "./messages";
import { checkEffortKwarg, checkJinjaRendered, checkSchemaTypes, checkToolResultOrder } from "./sglang-gaps";
import { isPyDict, parseJsonKeepingFloats, PyFloat, PyNumber } from "./py-values";
import { BadRequest } from "./request/bad-request";
import { optionalBool } from "./request/openai-body";
import type { ChatMessage, ChatOptions, ContentPart } from "./types";

/** SGLang's rules, `defaultKwargs` its --default-chat-template-kwargs, parsed. */
export const sglangRules = (defaultKwargs: Dict): ChatRules => ({
  engine: "sglang",
  readChat: sglangChat,
  // Its Responses path builds the chat its own way (labelled developer turns, custom tools), still changing.
  rendersResponses: false,
  detectFormat: detectSglangFormat,
  render: (messages, opts, server) => renderSglangChat(messages, opts, server, defaultKwargs),
  templateTools: pickedTools,
  defaultKwargs,
  // It has no flag for it.
  responseRole: "assistant",
});

type Dict = Record<string, unknown>;

/**
 * A chat body as SGLang's request model reads it (schema.py, ChatInput): the messages as sent (its assistant field is `reasoning_content`,
 * and `reasoning` is none of its fields), tools, tool_choice, chat_template_kwargs, reasoning_effort and
 * continue_final_message. It has no add_generation_prompt, add_special_tokens, truncate_prompt_tokens, documents
 * or chat_template field: those are ignored, as SGLang ignores them.
 */
function sglangChat(o: Dict): ChatInput {
  const { templateKwargs, reasoningEffort } = sglangKwargs(o);
  return {
    kind: "chat", messages: o.messages as ChatMessage[], tools: (o.tools ?? undefined) as unknown[] | undefined, toolChoice: o.tool_choice,
    templateKwargs, reasoningEffort, continueFinalMessage: optionalBool(o.continue_final_message, "continue_final_message"),
  };
}

const EFFORT_TIERS = new Set(["none", "minimal", "low", "medium", "high", "xhigh", "max"]);

/**
 * The template variables a request brings. normalize_reasoning_inputs (chat_input/normalization.py), a validator
 * that runs before the fields are validated: `reasoning.effort` replaces `reasoning_effort`, then an effort sets both
 * `thinking` and `enable_thinking` (false for "none") where chat_template_kwargs does not name them, as does
 * `reasoning.enabled` (true); chat_template_kwargs that is no object is then `{}`. Only then are the fields
 * validated, so a bad `reasoning_effort` that `reasoning.effort` replaced is no error. Then the serving path takes
 * a `reasoning_effort` out of the kwargs as the request's own.
 */
function sglangKwargs(o: Dict): { templateKwargs?: Dict; reasoningEffort?: unknown } {
  let given = o.reasoning_effort;
  let thinking: boolean | undefined;
  const r = o.reasoning;
  if (isPyDict(r)) {
    const fromReasoning = r.effort ?? r.reasoning_effort;
    if (fromReasoning !== undefined && fromReasoning !== null) given = effortOf(fromReasoning, "reasoning.effort");
    if (pyTruthy(enabledOf(r.enabled ?? r.enable))) thinking = true;
  }
  if (given !== undefined && given !== null) thinking = given !== "none";
  let effort = given === undefined || given === null ? undefined : effortOf(given, "reasoning_effort");
  const kw = o.chat_template_kwargs;
  let ctk = isPyDict(kw) ? { ...kw } : undefined;
  if (thinking !== undefined) {
    ctk ??= {};
    if (!Object.hasOwn(ctk, "thinking")) ctk.thinking = thinking;
    if (!Object.hasOwn(ctk, "enable_thinking")) ctk.enable_thinking = thinking;
  } else if (kw !== undefined && kw !== null && ctk === undefined) throw new BadRequest("chat_template_kwargs must be an object");
  if (ctk !== undefined && Object.hasOwn(ctk, "reasoning_effort")) {
    const inKwargs = ctk.reasoning_effort;
    delete ctk.reasoning_effort;
    if (inKwargs !== null) effort = inKwargs;
  }
  return { templateKwargs: ctk, reasoningEffort: effort };
}

/**
 * A reasoning effort as SGLang takes it: a tier's name, or a float in [0, 0.99] (its fine-grained extension; a
 * numeric string too, range-checked the same).
 */
function effortOf(v: unknown, field: string): unknown {
  let n: number | undefined;
  if (typeof v === "string") {
    if (EFFORT_TIERS.has(v)) return v;
    // Decimal notation with an optional exponent, which both of SGLang's readings take (pydantic's of reasoning_effort,
    // Python's float() of reasoning.effort); rarer spellings one of them takes (underscores, full-width digits) are
    // refused, as JS's Number() would read 0x.., 0b.., 0o.. that neither takes.
    if (PY_FLOAT.test(v)) n = Number(v.trim());
  } else if (typeof v === "number") n = v;
  else if (v instanceof PyNumber) n = v.value;
  if (n !== undefined && Number.isFinite(n) && n >= 0 && n <= MAX_NUMERIC_EFFORT) return new PyFloat(n);
  throw new BadRequest(`${field} must be a reasoning effort (none, minimal, low, medium, high, xhigh, max) or a number from 0 to ${MAX_NUMERIC_EFFORT}`);
}

const MAX_NUMERIC_EFFORT = 0.99;
const PY_FLOAT = /^\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*$/;

/** `reasoning.enabled` as the validator reads a string: one of 1, true, yes, y, on. */
function enabledOf(v: unknown): unknown {
  return typeof v === "string" ? ["1", "true", "yes", "y", "on"].includes(v.trim().toLowerCase()) : v;
}

function pyTruthy(v: unknown): boolean {
  if (v instanceof PyNumber) return v.value !== 0;
  if (Array.isArray(v)) return v.length > 0;
  if (isPyDict(v)) return Object.keys(v).length > 0;
  return Boolean(v);
}

// detect_jinja_template_content_format: on the template's text, not its parse.
const MEDIA_WORDS = ["image", "audio", "video", "vision"];
const MESSAGE_NAMES = ["message", "msg", "m"];

/**
 * "openai" when the template's text names media at all, or it loops over `message.content` (or `msg`'s, `m`'s:
 * those names, whatever they hold; through filters, tests and slices); else "string".
 */
function detectSglangFormat(source: string, ast: unknown): ContentFormat {
  if (MEDIA_WORDS.some((w) => source.includes(w))) return "openai";
  for (const n of walk(ast)) if (n.type === "For" && MESSAGE_NAMES.some((name) => reads(n.iterable, name, "content"))) return "openai";
  return "string";
}

/**
 * TemplateManager detects the format once, on the served template (--chat-template, else the tokenizer's): every
 * chat gets it, with tools or not. Several named templates are a dict to it, which detection fails on: "string".
 */
function sglangFormat(server: ChatServer): ContentFormat {
  return server.namedTemplates ? "string" : (servedTemplate(server, false)?.contentFormat ?? "string");
}

// A multimodal processor's own template stands in when the tokenizer has none.
const servedTemplate = (server: ChatServer, hasTools: boolean) => server.template(hasTools) ?? server.processorTemplate;

function renderSglangChat(messages: readonly ChatMessage[], opts: ChatOptions, server: ChatServer, defaults: Dict): RenderedChat {
  checkJinjaRendered(server.flags.conversationTemplate);
  if (opts.templateKwargs?.chat_template !== undefined)
    throw new ChatUnrenderable("SGLang renders with chat_template_kwargs' chat_template (transformers takes it as the template): not mirrored here");
  const tools = templateTools(opts);
  const template = servedTemplate(server, tools !== undefined);
  if (template === null) throw new ChatTemplateError("the model's tokenizer has no chat template");
  checkSchemaTypes(tools, messages);
  checkToolResultOrder(messages);
  const rendered = conversation(messages, sglangFormat(server));
  // A chat cut at the routing bound before the final message ends on an earlier one, which the request's prompt
  // renders as it is; a cut inside the final message keeps the rule for it.
  const { chat, continuation } = opts.beforeFinal ? { chat: rendered } : finalTurn(rendered, opts.continueFinalMessage === true);
  // transformers' apply_chat_template, as _apply_jinja_template calls it: always with the generation prompt.
  const { kwargs, effort } = templateKwargs(defaults, opts);
  const vars: Dict = { ...server.specialTokens, documents: null, ...kwargs, messages: chat, add_generation_prompt: true };
  checkEffortKwarg(template.source, effort, vars);
  let text: string;
  try {
    text = runTemplate(template, { ...vars, tools: tools ?? null });
  } catch (err) {
    // A failed render is tried once more with each tool flattened to its function (templates such as Mistral's
    // want no wrapper). SGLang retries on any exception; here only what jinja2 raises too (TemplateRaised: a
    // raise_exception, an undefined's attribute or tojson) is: a failure of this process's engine is not SGLang's.
    if (!(err instanceof ChatTemplateError)) throw err;
    text = runTemplate(template, { ...vars, tools: tools === undefined ? null : tools.map((t) => ("function" in t ? t.function : t)) });
  }
  return continuation ? { text, continuation } : { text };
}

/**
 * The tools the template gets: none when tool_choice is "none" or the request has none (an empty list too); a named
 * tool_choice keeps only that tool. Each as Tool.model_dump gives it (`strict: false` where unset, and the tool's
 * `defer_loading`, null when unset).
 */
function templateTools(opts: ChatOptions): Dict[] | undefined {
  return pickedTools(opts)?.map(dumpTool);
}

function pickedTools({ tools, toolChoice }: Pick<ChatOptions, "tools" | "toolChoice">): unknown[] | undefined {
  if (tools === undefined || tools.length === 0 || toolChoice === "none") return undefined;
  const named = isPyDict(toolChoice) && isPyDict(toolChoice.function) ? toolChoice.function.name : undefined;
  const picked = named === undefined ? tools : tools.filter((t) => isPyDict(t) && isPyDict(t.function) && t.function.name === named);
  return picked.length === 0 ? undefined : picked;
}

/** schema.py's Tool and Function as dumped: description before name, strict a bool, a function's unset defer_loading left out. */
function dumpTool(t: unknown): Dict {
  const tool = isPyDict(t) ? t : {};
  const fn = isPyDict(tool.function) ? tool.function : {};
  const toolDefer = tool.defer_loading ?? null;
  const f: Dict = { description: fn.description ?? null, name: fn.name ?? null, parameters: fn.parameters ?? null, strict: fn.strict ?? false };
  // Tool._propagate_defer_loading: the tool's reaches a function without its own.
  const defer = fn.defer_loading ?? toolDefer;
  if (defer !== null) f.defer_loading = defer;
  return { type: tool.type ?? "function", function: f, defer_loading: toolDefer };
}

/**
 * The server's --default-chat-template-kwargs under the request's (ChatInputProcessor._resolve_input: setdefault, a
 * request's null kept), a default reasoning_effort the request's when it has none; then _apply_jinja_template's variables: the
 * reasoning effort, with the kwargs over it. `effort`: the request's reasoning effort so resolved.
 */
function templateKwargs(defaults: Dict, opts: ChatOptions): { kwargs: Dict; effort: unknown } {
  const ctk: Dict = { ...opts.templateKwargs };
  for (const [k, v] of Object.entries(defaults)) if (!Object.hasOwn(ctk, k)) ctk[k] = v;
  const fromKwargs = ctk.reasoning_effort;
  const effort = opts.reasoningEffort ?? (fromKwargs === null ? undefined : fromKwargs);
  return { kwargs: effort === undefined ? ctk : { reasoning_effort: effort, ...ctk }, effort };
}

/**
 * The messages the template gets. Each is its pydantic model dumped (a user message has only role and content;
 * others role, content, tool_call_id, name, reasoning_content, tool_calls, tools; nothing else sent reaches the
 * template), assistant tool-call arguments parsed (normalize_assistant_tool_call_arguments: JSON that is no object
 * is a 400), null content "", then process_content_for_template_format: null fields dropped, parts turned into the
 * format's shape; a tool message's all-text parts joined with a space (normalize_tool_content).
 */
function conversation(messages: readonly ChatMessage[], format: ContentFormat): ChatMessage[] {
  return messages.map((m) => {
    const out = withContent(dumpMessage(m), format);
    if (out.role === "tool" && Array.isArray(out.content)) out.content = joinedToolText(out.content);
    return out;
  });
}

function dumpMessage(m: ChatMessage): Dict {
  if (m.role === "user") return { role: "user", content: m.content ?? "" };
  const role = m.role.toLowerCase();
  return {
    role, content: m.content ?? "", tool_call_id: m.tool_call_id ?? null, name: m.name ?? null, reasoning_content: m.reasoning_content ?? null,
    tool_calls: Array.isArray(m.tool_calls) ? m.tool_calls.map((c) => dumpToolCall(c, role === "assistant")) : null,
    tools: Array.isArray(m.tools) ? m.tools.map(dumpTool) : null,
  };
}

/** ToolCall as dumped (id, index, type, function: {name, arguments}, unset ones null), an assistant's arguments parsed. */
function dumpToolCall(call: unknown, assistant: boolean): Dict {
  const c = isPyDict(call) ? call : {};
  const fn = isPyDict(c.function) ? c.function : {};
  let args = fn.arguments ?? null;
  if (assistant && typeof args === "string") args = argumentsObject(args);
  return { id: c.id ?? null, index: c.index ?? null, type: c.type ?? "function", function: { name: fn.name ?? null, arguments: args } };
}

function argumentsObject(text: string): Dict {
  let parsed: unknown;
  try {
    parsed = parseJsonKeepingFloats(text);
  } catch {
    throw new ChatTemplateError("Assistant tool call function.arguments must be valid JSON.");
  }
  if (!isPyDict(parsed)) throw new ChatTemplateError("Assistant tool call function.arguments must be a JSON object.");
  return parsed;
}

/** process_content_for_template_format: null fields dropped; a parts list in the format's shape. */
function withContent(m: Dict, format: ContentFormat): ChatMessage {
  const set = (d: Dict) => Object.fromEntries(Object.entries(d).filter(([, v]) => v !== null)) as ChatMessage;
  const parts = m.content;
  if (!Array.isArray(parts)) return set(m);
  if (format === "string") return set({ ...m, content: parts.filter(isTextPart).map((p) => p.text).join(" ") });
  // The "openai" format: the parts list moves to the end of the message.
  const { content: _, ...rest } = m;
  return { ...set(rest), content: parts.flatMap(openaiPart) } as ChatMessage;
}

const isTextPart = (p: unknown): p is { text: unknown } => isPyDict(p) && (p.type === "text" || p.type === "input_text");

/** A part as the "openai" format keeps it: text, media as its kind alone, a tool reference whole; others dropped. */
function openaiPart(p: unknown): Dict[] {
  if (!isPyDict(p)) return [];
  if (isTextPart(p)) return [{ type: "text", text: p.text }];
  const media = MEDIA_KINDS[p.type as string];
  if (media !== undefined) return [{ type: media }];
  return p.type === "tool_reference" ? [{ type: "tool_reference", name: p.name }] : [];
}

// An input_audio part is an audio_url one to SGLang (schema.py _to_audio_url_part).
const MEDIA_KINDS: Record<string, string> = { image_url: "image", input_image: "image", video_url: "video", audio_url: "audio", input_audio: "audio" };

/** normalize_tool_content: a list of text parts (or strings) is one string, joined with a space; any other list stays. */
function joinedToolText(parts: ContentPart[]): string | ContentPart[] {
  const texts: string[] = [];
  for (const p of parts) {
    if (typeof p === "string") texts.push(p as string);
    else if (isPyDict(p) && p.type === "text") texts.push(typeof p.text === "string" ? p.text : "");
    else return parts;
  }
  return texts.join(" ");
}

/**
 * _handle_last_assistant_message: a final assistant message with text content (a string once processed) is
 * continued with continue_final_message (left out of the chat, its text tokenized after the generation prompt) and
 * otherwise rendered as a user message of that text.
 */
function finalTurn(chat: ChatMessage[], continueFinal: boolean): { chat: ChatMessage[]; continuation?: string } {
  const last = chat.at(-1);
  if (last?.role !== "assistant" || typeof last.content !== "string") return { chat };
  if (continueFinal) return { chat: chat.slice(0, -1), continuation: last.content };
  return { chat: [...chat.slice(0, -1), { role: "user", content: last.content }] };
}
