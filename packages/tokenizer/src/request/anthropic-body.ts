// A /v1/messages body (Anthropic's Messages API) as the chat vLLM renders for it. vLLM's Anthropic server checks the
// body against its request model (vllm/entrypoints/anthropic/protocol.py), turns it into a ChatCompletionRequest
// (serving.py, AnthropicServingMessages._convert_anthropic_to_openai_request) and renders that as any chat. The EPP
// routes by those tokens, so it builds the same chat here, field for field; what vLLM refuses is a BadRequest.
import { apiOfPath } from "@kv-epp/protocol";
import { isPyDict, PyNumber } from "../py-values";
import { pyJsonDumps, pyStr, toTemplateValue } from "../py-template";
import type { ChatRules } from "../chat-rules";
import type { ChatMessage, ContentPart } from "../types";
import { BadRequest } from "./bad-request";
import { optionalString, templateKwargsOf, type ParsedBody, type RoutedInput } from "./openai-body";
import { normalizeInlineSystem, systemPromptText, systemText, UNPROBED_INLINE_SYSTEM, type AnthropicMessage, type Block, type InlineSystemMode } from "./inline-system";
import { chatReasoningEffort, laxInt, UNPROBED_DISABLED_THINKING, type DisabledThinkingEffort } from "./anthropic-thinking";

type Dict = Record<string, unknown>;
type ToolCall = { id: string; type: "function"; function: { name: string; arguments: string } };

/** Whether the request's :path names a Messages request, or its count_tokens (@kv-epp/protocol's apiOfPath). */
export function isMessagesPath(path: string | undefined): path is string {
  const api = apiOfPath(path);
  return api === "/v1/messages" || api === "/v1/messages/count_tokens";
}

/**
 * A /v1/messages body read as vLLM reads it: the chat its conversion gives, with the fields that change the
 * rendering (tools, tool_choice, chat_template_kwargs, the reasoning effort of output_config and thinking), and its
 * cache_salt. Fields of the body vLLM's Anthropic request has no place for (add_generation_prompt, a `prompt`...)
 * are dropped there, so none is read here. A count_tokens body (`path`) is rendered the same way, without
 * max_tokens, an effort or a salt (its request has none of them). Under rules other than vLLM's the body is routed
 * by load.
 */
export function messagesBody(o: Dict, path: string, rules?: ChatRules): ParsedBody {
  const model = requiredModel(o.model);
  const counting = apiOfPath(path) === "/v1/messages/count_tokens";
  const request = counting ? undefined : { maxTokens: positiveInt(o.max_tokens, "max_tokens"), cacheSalt: cacheSalt(o.cache_salt) };
  if (rules !== undefined && rules.engine !== "vllm") {
    const message = `a /v1/messages body: ${rules.engine} builds its chat in ways not mirrored here`;
    return { model, input: { kind: "none" }, unrendered: { cause: "messages_rules", message } };
  }
  const input = anthropicChat(o, { maxTokens: request?.maxTokens, inlineSystem: rules?.inlineSystem, disabledThinkingEffort: rules?.disabledThinkingEffort });
  return request?.cacheSalt === undefined ? { model, input } : { model, input, cacheSalt: request.cacheSalt };
}

/**
 * How the conversion reads a body: `maxTokens`, a /v1/messages body's (undefined for a count_tokens one, whose
 * request has no effort); where inline system messages go (inline-system.ts); the effort a disabled thinking
 * becomes. Without rules, what vLLM's default "auto" means where no probe runs (chat-rules.ts): "fold" and "low".
 */
export type ConversionOptions = { maxTokens?: number; inlineSystem?: InlineSystemMode; disabledThinkingEffort?: DisabledThinkingEffort };

/**
 * The chat vLLM's conversion makes of a Messages body (throws BadRequest where its request model refuses the body).
 * Inline system messages are placed as `inlineSystem` says, then one system message opens the chat: the top-level
 * system's text and the leading system messages', joined by a blank line, when there is any.
 */
export function anthropicChat(o: Dict, { maxTokens, inlineSystem = UNPROBED_INLINE_SYSTEM, disabledThinkingEffort = UNPROBED_DISABLED_THINKING }: ConversionOptions = {}): Extract<RoutedInput, { kind: "chat" }> {
  if (!Array.isArray(o.messages)) throw new BadRequest("messages must be an array of {role, content}");
  const anthropic = o.messages.map(anthropicMessage);
  const system = optionalBlocks(o.system, "system");
  const placed = normalizeInlineSystem(system, anthropic, inlineSystem);
  const messages: ChatMessage[] = [];
  const head = [systemPromptText(system), placed.leading].filter((t) => t !== "").join("\n\n");
  if (head !== "") messages.push({ role: "system", content: head });
  for (const m of placed.messages) {
    if (m.role === "system") {
      const text = systemText(m);
      if (text !== "") messages.push({ role: "system", content: text });
      continue;
    }
    const converted = chatMessage(m.role, m.content, messages);
    if (converted !== undefined) messages.push(converted);
  }
  const toolChoice = chatToolChoice(o.tool_choice);
  const tools = chatTools(o.tools);
  const effort = maxTokens === undefined ? undefined : chatReasoningEffort(o, maxTokens, disabledThinkingEffort);
  return {
    kind: "chat", messages, tools, toolChoice: tools !== undefined && toolChoice === undefined ? "auto" : toolChoice,
    templateKwargs: templateKwargsOf({ chat_template_kwargs: o.chat_template_kwargs, reasoning_effort: effort }),
  };
}

/**
 * An assistant message as a client sends it back (content blocks) in the chat message vLLM makes of it: the reply
 * warming of Messages traffic builds the next turn with this, as that turn's conversion will.
 */
export function assistantChatMessage(blocks: Block[]): ChatMessage | undefined {
  return chatMessage("assistant", blocks, []);
}

const ROLES = new Set(["user", "assistant", "system"]);
const BLOCK_TYPES = new Set(["text", "image", "tool_use", "tool_result", "tool_reference", "thinking", "redacted_thinking"]);

function anthropicMessage(m: unknown, i: number): AnthropicMessage {
  if (!isPyDict(m)) throw new BadRequest(`messages[${i}] must be an object`);
  if (typeof m.role !== "string" || !ROLES.has(m.role)) throw new BadRequest(`messages[${i}].role must be "user", "assistant" or "system"`);
  const role = m.role as AnthropicMessage["role"];
  return { role, content: typeof m.content === "string" ? m.content : blocks(m.content, `messages[${i}].content`) };
}

function optionalBlocks(v: unknown, field: string): string | Block[] | undefined {
  if (v === undefined || v === null) return undefined;
  return typeof v === "string" ? v : blocks(v, field);
}

/** A list of content blocks as vLLM's AnthropicContentBlock validates each (its type, and its fields' types). */
function blocks(v: unknown, field: string): Block[] {
  if (!Array.isArray(v)) throw new BadRequest(`${field} must be a string or an array of content blocks`);
  return v.map((b, i) => {
    const at = `${field}[${i}]`;
    if (!isPyDict(b) || typeof b.type !== "string" || !BLOCK_TYPES.has(b.type)) throw new BadRequest(`${at} must be a content block of a known type`);
    for (const key of ["text", "id", "tool_use_id", "name", "tool_name", "thinking", "signature", "data"]) optionalString(b[key], `${at}.${key}`);
    for (const key of ["source", "input"]) if (b[key] !== undefined && b[key] !== null && !isPyDict(b[key])) throw new BadRequest(`${at}.${key} must be an object`);
    laxBool(b.is_error, `${at}.is_error`);
    const c = b.content;
    if (c !== undefined && c !== null && typeof c !== "string" && !(Array.isArray(c) && c.every(isPyDict))) throw new BadRequest(`${at}.content must be a string or an array of objects`);
    return b as Block;
  });
}

const isText = (t: unknown): t is string => typeof t === "string" && t !== "";

/**
 * A user or assistant message: a string stays the content; blocks become text and image parts (one text part is
 * its string), `reasoning` from thinking blocks, `tool_calls` from tool_use blocks. A user's tool_result blocks
 * become tool messages pushed to `out` as they come, before the message itself; a user message left with nothing
 * else is dropped, an assistant's is kept bare.
 */
function chatMessage(role: "user" | "assistant", content: string | Block[], out: ChatMessage[]): ChatMessage | undefined {
  if (typeof content === "string") return { role, content };
  const parts: ContentPart[] = [];
  const calls: ToolCall[] = [];
  const reasoning: string[] = [];
  for (const b of content) {
    if (b.type === "text" && isText(b.text)) parts.push({ type: "text", text: b.text });
    else if (b.type === "image" && isPyDict(b.source) && Object.keys(b.source).length > 0) parts.push(imagePart(b.source));
    else if (b.type === "thinking" && typeof b.thinking === "string") reasoning.push(b.thinking);
    else if (b.type === "tool_use") calls.push(toolCall(b));
    else if (b.type === "tool_result") {
      if (role === "user") out.push(...toolResultMessages(b));
      else parts.push({ type: "text", text: `Tool result: ${isSet(b.content) ? pyStr(toTemplateValue(b.content)) : ""}` });
    }
  }
  const m: ChatMessage = { role };
  if (reasoning.length > 0) m.reasoning = reasoning.join("");
  if (calls.length > 0) m.tool_calls = calls;
  if (parts.length > 0) m.content = parts.length === 1 && parts[0]!.type === "text" ? parts[0]!.text : parts;
  return role === "user" && !("content" in m) ? undefined : m;
}

/** Python truthiness of a block's optional content: neither absent, null, "" nor []. */
const isSet = (v: unknown) => v !== undefined && v !== null && v !== "" && !(Array.isArray(v) && v.length === 0);

/** An image source as the URL vLLM's media loader takes: a `url` source's own, else a base64 data URI. */
function imageUrl(source: Dict): unknown {
  if (source.type === "url") return source.url ?? "";
  const media = Object.hasOwn(source, "media_type") ? pyText(source.media_type) : "image/jpeg";
  return `data:${media};base64,${Object.hasOwn(source, "data") ? pyText(source.data) : ""}`;
}

const imagePart = (source: Dict): ContentPart => ({ type: "image_url", image_url: { url: imageUrl(source) } });

/** str(v) as an f-string prints a JSON value. */
const pyText = (v: unknown) => pyStr(toTemplateValue(v));

/**
 * A tool_use block as the call vLLM makes of it: its input printed by Python's json.dumps (", " and ": ", non-ASCII
 * escaped); a missing id is vLLM's `call_<unix seconds>`, a missing name "".
 */
function toolCall(b: Block): ToolCall {
  const id = isText(b.id) ? b.id : `call_${Math.floor(Date.now() / 1000)}`;
  const input = isPyDict(b.input) ? b.input : {};
  return { id, type: "function", function: { name: isText(b.name) ? b.name : "", arguments: pythonJson(input) } };
}

export function pythonJson(v: unknown): string {
  return pyJsonDumps(toTemplateValue(v), { ensureAscii: true, indent: null, itemSep: ", ", keySep: ": ", sortKeys: false, limit: Infinity });
}

/**
 * A user's tool_result: a tool message with its text (a string, or its text items joined by "\n"), then a user
 * message of the images it returned, then a tool message of the tools it names by reference, as vLLM orders them.
 */
function toolResultMessages(b: Block): ChatMessage[] {
  const id = isText(b.tool_use_id) ? b.tool_use_id : "";
  let text = "";
  const images: ContentPart[] = [];
  const refs: ContentPart[] = [];
  if (typeof b.content === "string") text = b.content;
  else if (Array.isArray(b.content)) {
    const texts: string[] = [];
    for (const item of b.content as Dict[]) {
      // vLLM reads these with dict.get and a default for a missing key, and fails on a null one.
      if (item.type === "text") {
        const t = Object.hasOwn(item, "text") ? item.text : "";
        if (typeof t !== "string") throw new BadRequest("a tool_result's text item must have a string text");
        texts.push(t);
      } else if (item.type === "image") {
        const source = Object.hasOwn(item, "source") ? item.source : {};
        if (!isPyDict(source)) throw new BadRequest("a tool_result's image item must have an object source");
        const url = imageUrl(source);
        if (url) images.push({ type: "image_url", image_url: { url } });
      } else if (item.type === "tool_reference") {
        const name = item.tool_name || item.name;
        if (name) refs.push({ type: "tool_reference", name });
      }
    }
    text = texts.join("\n");
  }
  const out: ChatMessage[] = [{ role: "tool", tool_call_id: id, content: text }];
  if (images.length > 0) out.push({ role: "user", content: images });
  if (refs.length > 0) out.push({ role: "tool", tool_call_id: id, content: refs });
  return out;
}

/** tool_choice: auto, any (OpenAI's "required"), none, or a named tool. */
function chatToolChoice(v: unknown): unknown {
  if (v === undefined || v === null) return undefined;
  if (!isPyDict(v)) throw new BadRequest("tool_choice must be an object");
  optionalString(v.name, "tool_choice.name");
  laxBool(v.disable_parallel_tool_use, "tool_choice.disable_parallel_tool_use");
  switch (v.type) {
    case "auto":
    case "none":
      return v.type;
    case "any":
      return "required";
    case "tool":
      if (!isText(v.name)) throw new BadRequest("tool_choice.name is required when type is 'tool'");
      return { type: "function", function: { name: v.name } };
  }
  throw new BadRequest('tool_choice.type must be "auto", "any", "tool" or "none"');
}

/**
 * Tools ({name, description, input_schema, strict, defer_loading}) as the function tools vLLM renders: a schema
 * without a `type` gets "object" (added last, as vLLM's validator sets it); strict and defer_loading reach the
 * function as the booleans pydantic reads them as. Other fields of a tool (cache_control, input_examples...) are
 * dropped, as vLLM's tool model ignores them.
 */
function chatTools(v: unknown): unknown[] | undefined {
  if (v === undefined || v === null) return undefined;
  if (!Array.isArray(v)) throw new BadRequest("tools must be an array");
  return v.map((t, i) => {
    if (!isPyDict(t) || typeof t.name !== "string") throw new BadRequest(`tools[${i}] must have a string name`);
    if (!isPyDict(t.input_schema)) throw new BadRequest(`tools[${i}].input_schema must be an object`);
    optionalString(t.description, `tools[${i}].description`);
    const parameters = Object.hasOwn(t.input_schema, "type") ? t.input_schema : { ...t.input_schema, type: "object" };
    const fn: Dict = { name: t.name, description: t.description ?? null, parameters };
    const strict = laxBool(t.strict, `tools[${i}].strict`);
    if (strict !== undefined) fn.strict = strict;
    const deferLoading = laxBool(t.defer_loading, `tools[${i}].defer_loading`);
    if (deferLoading !== undefined) fn.defer_loading = deferLoading;
    return { type: "function", function: fn };
  });
}

function requiredModel(v: unknown): string {
  if (typeof v !== "string" || v === "") throw new BadRequest("model is required");
  return v;
}

/** An int field (pydantic's lax reading) that must be positive. */
function positiveInt(v: unknown, field: string): number {
  const n = laxInt(v);
  if (n === undefined || n <= 0) throw new BadRequest(`${field} must be a positive integer`);
  return n;
}

/** cache_salt, which vLLM's Messages request passes to its chat: a string of 1 to 1024 characters. */
function cacheSalt(v: unknown): string | undefined {
  if (v === undefined || v === null) return undefined;
  if (typeof v !== "string" || v === "" || [...v].length > 1024) throw new BadRequest("cache_salt must be a string of 1 to 1024 characters");
  return v;
}

const TRUE_TEXT = new Set(["1", "t", "y", "on", "yes", "true"]);
const FALSE_TEXT = new Set(["0", "f", "n", "no", "off", "false"]);

/** A bool field as pydantic reads it in lax mode (true, 1, 1.0, "yes"...); undefined when absent or null. */
function laxBool(v: unknown, field: string): boolean | undefined {
  if (v === undefined || v === null) return undefined;
  if (typeof v === "boolean") return v;
  const n = v instanceof PyNumber ? v.value : v;
  if (n === 0 || n === 1) return n === 1;
  if (typeof v === "string" && TRUE_TEXT.has(v.toLowerCase())) return true;
  if (typeof v === "string" && FALSE_TEXT.has(v.toLowerCase())) return false;
  throw new BadRequest(`${field} must be a boolean`);
}
