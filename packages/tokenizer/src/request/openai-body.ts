// The OpenAI request bodies the EPP routes: /v1/completions, /v1/chat/completions and /v1/responses.
// Only the fields that decide the route are read; the body itself is forwarded untouched.
import { JsonFieldScanner, type JsonField } from "@kv-epp/index-wasm/json";
import { apiOfPath } from "@kv-epp/protocol";
import { isPyDict, parseJsonKeepingFloats, PyNumber } from "../py-values";
import { responsesChat, ResponsesInputError, type ResponsesChat } from "../responses";
import type { Unrendered } from "../job";
import { truncatePrompt, type Truncation } from "../truncation";
import type { ChatMessage, ContentPart } from "../types";
import type { ChatRules } from "../chat-rules";
import { BadRequest } from "./bad-request";
import { isMessagesPath, messagesBody } from "./anthropic-body";

/**
 * Text inputs carry the request's `add_special_tokens` (vLLM's default: true for a completion, false for a
 * chat) and `truncate_prompt_tokens` / `truncation_side` (a token prompt is cut here already).
 */
export type RoutedInput =
  | { kind: "tokens"; tokens: Uint32Array }
  | ({ kind: "prompt"; text: string; addSpecialTokens?: boolean } & Truncation)
  | ({
      kind: "chat";
      messages: ChatMessage[];
      tools?: unknown[];
      /** The request's tool_choice as sent, and its own chat_template (see ChatOptions). */
      toolChoice?: unknown;
      chatTemplate?: string;
      templateKwargs?: Record<string, unknown>;
      /** The request's add_generation_prompt / continue_final_message (vLLM's defaults: true / false). */
      addGenerationPrompt?: boolean;
      continueFinalMessage?: boolean;
      addSpecialTokens?: boolean;
      /** SGLang's top-level reasoning_effort, a template variable beside its chat_template_kwargs (see ChatOptions). */
      reasoningEffort?: unknown;
      /**
       * vLLM's `echo`: the reply repeats the final message's text before what it generated (see nextTurnJob). Only
       * warming reads it, so a value vLLM's lax bool would take otherwise (`1`, "true") is no reason to refuse the
       * body: it is simply not read as true.
       */
      echo?: true;
    } & Truncation)
  | { kind: "none" };

/**
 * `cacheSalt`: vLLM's `cache_salt`, folded into the request's first block (only same-salt requests share blocks).
 * `batchedPrompts`: a /v1/completions batch of this many prompts (> 1); the first one is routed, while the
 * response's usage adds up the whole batch.
 */
export type ParsedBody = {
  model?: string; cacheSalt?: string; batchedPrompts?: number; input: RoutedInput; unrendered?: Unrendered;
  /**
   * SGLang's `lora_path`, when a non-empty string: the adapter the request runs in when its `model` names none. Read
   * from every body (vLLM ignores the field); only an SGLang pool's decision uses it.
   */
  loraPath?: string;
  /**
   * SGLang's `extra_key` is a non-empty string: the request's cache namespace, kept apart from every other's. Only
   * that it is set is carried: no KV event names a namespace, so nothing is matched on its value.
   */
  namespaced?: true;
  /** A /v1/responses body (its chat read from `input`): its reply is no chat completion's, so none warms its next turn. */
  responses?: true;
  /** The body asks for its answer streamed (`"stream": true`, the key every API here spells alike). */
  stream?: true;
};

export { BadRequest };

/** JSON nested deeper than MAX_JSON_DEPTH: refused before it is parsed. */
export class TooDeep extends BadRequest {}

/**
 * Arrays and objects nested deeper than this are refused (400). Real requests stay far below it (a
 * chat with content parts is ~5 deep, a tool's JSON Schema rarely past 20); past it, what reads the
 * document recursively (the chat template, JSON.stringify in an error message) cost seconds of event
 * loop per request at 50k levels, and ended in a stack overflow.
 */
export const MAX_JSON_DEPTH = 128;

/** Request bodies past this are refused (413) on ext_proc and the selection API. */
export const MAX_BODY_BYTES = 32 * 1024 * 1024;

const decoder = new TextDecoder();

/**
 * `path`: the request's :path when known (it tells a /v1/responses body from an embeddings one, and a /v1/messages
 * body from a chat completion's). `rules`: the workers' engine's, which decide how a chat's fields are read (vLLM's
 * when absent).
 */
export function parseBodyBytes(body: Uint8Array, path?: string, rules?: ChatRules): ParsedBody {
  // A Messages body's `prompt` or `token_ids` is no field of vLLM's Anthropic request: never read as ids.
  const fast = isMessagesPath(path) ? undefined : tokenIdsBody(body);
  if (fast) return fast;
  return parseBody(parseJson(body), path, rules);
}

/**
 * A body of token ids read without JSON.parse, as parseBodyBytes reads it; undefined for any other body. A body
 * whose `prompt` or `token_ids` does not open with a number is told apart by a search for the key alone (~0.05 ns
 * a byte), with nothing parsed.
 */
export function parseTokenIdsBody(body: Uint8Array): ParsedBody | undefined {
  return tokenIdsBody(body, opensIdArray);
}

/** Whether `"prompt"` or `"token_ids"` appears followed by `:` and `[` then a digit (JSON whitespace between). */
export function opensIdArray(bytes: Buffer): boolean {
  for (const key of ID_FIELDS) {
    for (let at = bytes.indexOf(key); at >= 0; at = bytes.indexOf(key, at + 1)) {
      let i = skipSpace(bytes, at + key.length);
      if (bytes[i] !== 0x3a) continue;
      i = skipSpace(bytes, i + 1);
      if (bytes[i] !== 0x5b) continue;
      i = skipSpace(bytes, i + 1);
      const c = bytes[i];
      if (c !== undefined && c >= 0x30 && c <= 0x39) return true;
    }
  }
  return false;
}

/** The first offset from `i` that is not JSON whitespace (or `limit`). */
export function skipSpace(b: Uint8Array, i: number, limit = b.length): number {
  while (i < limit && (b[i] === 0x20 || b[i] === 0x0a || b[i] === 0x0d || b[i] === 0x09)) i++;
  return i;
}

/**
 * The offset just past the string whose opening quote is at `i`, or -1 if it does not close before `limit`. The
 * closing quote (one preceded by an even run of backslashes) is found natively: most of a request body's bytes are
 * inside strings. The search never reads past `limit`, so a bounded scan stays bounded on a long string.
 */
export function stringEnd(b: Uint8Array, i: number, limit = b.length): number {
  const s = limit < b.length ? b.subarray(0, limit) : b;
  for (;;) {
    const q = s.indexOf(0x22, i + 1);
    if (q < 0) return -1;
    let k = q - 1;
    while (s[k] === 0x5c) k--;
    if ((q - 1 - k) % 2 === 0) return q + 1;
    i = q;
  }
}

// Bodies that carry what a chat template prints with Python's json (tools, tool-call arguments, template
// kwargs) are parsed keeping floats apart from integers: Python prints `1.0` where JSON.parse leaves `1`.
const PYTHON_NUMBERS = /"(tools|tool_calls|chat_template_kwargs|input)"/;

/** JSON.parse of a request body, refusing one nested past MAX_JSON_DEPTH before parsing it. */
function parseJson(body: Uint8Array): unknown {
  const depth = nestingExceeds(body, MAX_JSON_DEPTH);
  if (depth >= 0) throw new TooDeep(`request body nests arrays/objects deeper than ${MAX_JSON_DEPTH} (at byte ${depth})`);
  try {
    const text = decoder.decode(body);
    return PYTHON_NUMBERS.test(text) ? parseJsonKeepingFloats(text) : JSON.parse(text);
  } catch (e) {
    throw new BadRequest(`request body is not JSON: ${(e as Error).message}`);
  }
}

/**
 * The offset where `[`/`{` nesting first goes past `max` (strings skipped), else -1. One pass that
 * stops there, so a hostile body costs at most its size; what it says about invalid JSON does not
 * matter (JSON.parse words that).
 */
function nestingExceeds(b: Uint8Array, max: number): number {
  let depth = 0;
  for (let i = 0; i < b.length; i++) {
    const c = b[i]!;
    if (c === 0x22) {
      const end = stringEnd(b, i);
      if (end < 0) return -1;
      i = end - 1;
    } else if (c === 0x5b || c === 0x7b) {
      if (++depth > max) return i;
    } else if (c === 0x5d || c === 0x7d) depth--;
  }
  return -1;
}

const FIELDS = ["model", "token_ids", "messages", "prompt", "cache_salt", "stream", "lora_path", "extra_key"] as const;
// A token prompt with truncate_prompt_tokens takes the JSON.parse path, which reads it.
const TRUNCATE_FIELD = new TextEncoder().encode('"truncate_prompt_tokens"');
// A body without either key as written (an escaped key is left to JSON.parse anyway) carries no ids: a chat or a
// text prompt goes straight to JSON.parse instead of being scanned twice (the scan is ~15% of reading a chat).
const ID_FIELDS = [new TextEncoder().encode('"token_ids"'), new TextEncoder().encode('"prompt"')];
const hasIdKey = (bytes: Buffer) => ID_FIELDS.some((key) => bytes.includes(key));
/**
 * Bodies up to this size take the fast path (~600k token ids). The scanner's linear memory keeps the
 * size of the largest body it read (x3: text and decoded ids) and never shrinks, so a rare huge body
 * goes through JSON.parse, whose garbage the GC takes back.
 */
const FAST_PATH_MAX_BYTES = 4 * 1024 * 1024;
let scanner: JsonFieldScanner | undefined;

/**
 * The common shape, token ids under `token_ids` or `prompt`, read in WebAssembly without JSON.parse
 * (measured in bench:epp: JSON.parse of an 8k-token body was the largest cost of a decision); the same
 * answer parseBody gives. Anything else (text, chat, a field to complain about) returns undefined and
 * takes the JSON.parse path, which also words the errors.
 */
function tokenIdsBody(body: Uint8Array, mayHoldIds: (bytes: Buffer) => boolean = hasIdKey): ParsedBody | undefined {
  if (body.length > FAST_PATH_MAX_BYTES) return undefined;
  const bytes = Buffer.from(body.buffer, body.byteOffset, body.length);
  // The id search first: a chat (most bodies) then costs the decision thread one search less.
  if (!mayHoldIds(bytes) || bytes.includes(TRUNCATE_FIELD)) return undefined;
  const f = (scanner ??= new JsonFieldScanner(FIELDS)).scan(body);
  if (!f) return undefined;
  const [model, tokenIds, messages, prompt, salt, stream, loraPath, extraKey] = f as [JsonField, JsonField, JsonField, JsonField, JsonField, JsonField, JsonField, JsonField];
  if (model.kind !== "absent" && model.kind !== "string") return undefined;
  if (salt.kind !== "absent" && salt.kind !== "string") return undefined;
  let tokens: Uint32Array;
  if (tokenIds.kind === "uints") tokens = tokenIds.values;
  else if (tokenIds.kind === "absent" && messages.kind === "absent" && prompt.kind === "uints") tokens = prompt.values;
  else return undefined;
  const out: ParsedBody = { model: model.kind === "string" ? jsonString(body, model.start, model.end) : undefined, input: { kind: "tokens", tokens } };
  if (salt.kind === "string") out.cacheSalt = jsonString(body, salt.start, salt.end);
  if (stream.kind === "other" && stream.end - stream.start === 4 && bytes.toString("latin1", stream.start, stream.end) === "true") out.stream = true;
  // A string literal longer than its quotes is never empty, escapes or not: the key's value is not decoded.
  return sglangFields(out, loraPath.kind === "string" ? jsonString(body, loraPath.start, loraPath.end) : undefined, extraKey.kind === "string" && extraKey.end - extraKey.start > 2);
}

/** The JSON string literal at body[start, end) (quotes included). */
export function jsonString(body: Uint8Array, start: number, end: number): string {
  const raw = body.subarray(start, end);
  return raw.includes(0x5c) ? (JSON.parse(decoder.decode(raw)) as string) : decoder.decode(raw.subarray(1, -1));
}

/**
 * OpenAI's shapes of `content`: absent, null, text, or parts ({type: "text", text}, images, ...). A chat completion's
 * parts may also be plain strings (vLLM's content part union has `str`, parsed as a text part); a Responses input's
 * may not.
 */
function validContent(c: unknown, stringParts = false): boolean {
  const part = (p: unknown) => (typeof p === "object" && p !== null && !Array.isArray(p)) || (stringParts && typeof p === "string");
  return c === undefined || c === null || typeof c === "string" || (Array.isArray(c) && c.every(part));
}

/** Validates an already-decoded body (also used by POST /select); `path` and `rules` as for parseBodyBytes. */
export function parseBody(doc: unknown, path?: string, rules?: ChatRules): ParsedBody {
  const parsed = parseInput(doc, path, rules);
  const o = doc as Record<string, unknown>;
  if (o.stream === true) parsed.stream = true;
  sglangFields(parsed, typeof o.lora_path === "string" ? o.lora_path : undefined, typeof o.extra_key === "string" && o.extra_key !== "");
  // A Messages body's salt is its conversion's to read (a count_tokens request has none).
  if (isMessagesPath(path)) return parsed;
  const salt = o.cache_salt;
  if (salt !== undefined && salt !== null) {
    if (typeof salt !== "string") throw new BadRequest("cache_salt must be a string");
    parsed.cacheSalt = salt;
  }
  return parsed;
}

/**
 * ParsedBody's `loraPath` and `namespaced`, read alike on both paths. A value that is not a string (a batch's list,
 * null) is neither and is not refused: vLLM takes any value of a field it does not know.
 */
function sglangFields(out: ParsedBody, loraPath: string | undefined, namespaced: boolean): ParsedBody {
  if (loraPath) out.loraPath = loraPath;
  if (namespaced) out.namespaced = true;
  return out;
}

function parseInput(doc: unknown, path: string | undefined, rules: ChatRules | undefined): ParsedBody {
  if (typeof doc !== "object" || doc === null || Array.isArray(doc)) throw new BadRequest("request body must be a JSON object");
  const o = doc as Record<string, unknown>;
  if (o.model !== undefined && typeof o.model !== "string") throw new BadRequest("model must be a string");
  const model = o.model as string | undefined;
  if (isMessagesPath(path)) return messagesBody(o, path, rules);
  if (o.token_ids !== undefined) return { model, input: { kind: "tokens", tokens: tokenArray(o.token_ids, "token_ids") } };
  if (o.messages !== undefined) return { model, input: readChatBody(o, rules) };
  if (o.prompt !== undefined) {
    const { input, batchedPrompts } = promptInput(o.prompt, truncationOf(o));
    const withText = input.kind === "prompt" ? { ...input, addSpecialTokens: optionalBool(o.add_special_tokens, "add_special_tokens"), ...truncationOf(o) } : input;
    return { model, input: withText, batchedPrompts };
  }
  if (o.input !== undefined && isResponses(o, path)) {
    if (rules !== undefined && !rules.rendersResponses) {
      const message = `a /v1/responses body: ${rules.engine} builds its chat in ways not mirrored here`;
      return { model, input: { kind: "none" }, unrendered: { cause: "responses_rules", message } };
    }
    const previous = o.previous_response_id;
    if (previous !== undefined && previous !== null) {
      if (typeof previous !== "string") throw new BadRequest("previous_response_id must be a string");
      // vLLM renders the stored response's history before this input: a prompt only that worker can build.
      const message = "previous_response_id: the prompt starts with history stored on the worker";
      return { model, input: { kind: "none" }, unrendered: { cause: "stored_history", message } };
    }
    const chat = responsesChatOf(o);
    if (chat.messages.some((m) => typeof m !== "object" || m === null || typeof m.role !== "string" || !validContent(m.content)))
      throw new BadRequest("an input message must have a role and content as a string or content parts");
    return {
      model,
      input: {
        kind: "chat", messages: chat.messages, tools: chat.tools, toolChoice: o.tool_choice, templateKwargs: responsesTemplateKwargs(o),
        addGenerationPrompt: !chat.continueFinalMessage, continueFinalMessage: chat.continueFinalMessage,
      },
      responses: true,
    };
  }
  return { model, input: { kind: "none" } };
}

/**
 * A /v1/chat/completions body's chat: its messages and tools checked, then its fields read as the workers' engine
 * reads them (`rules`; vLLM's when absent). The mock worker reads its chat bodies with this too.
 */
export function readChatBody(o: Record<string, unknown>, rules?: ChatRules): Extract<RoutedInput, { kind: "chat" }> {
  if (!Array.isArray(o.messages) || o.messages.some((m) => typeof m !== "object" || m === null || typeof m.role !== "string"))
    throw new BadRequest("messages must be an array of {role, content}");
  if (o.messages.some((m) => !validContent((m as ChatMessage).content, true)))
    throw new BadRequest("a message's content must be a string, null, or an array of content parts (objects or strings)");
  if (o.tools !== undefined && o.tools !== null && !Array.isArray(o.tools)) throw new BadRequest("tools must be an array");
  return (rules?.readChat ?? vllmChat)(o);
}

/** A chat body's fields as vLLM's ChatCompletionRequest reads them. */
export function vllmChat(o: Record<string, unknown>): Extract<RoutedInput, { kind: "chat" }> {
  const templateKwargs = templateKwargsOf(o);
  const addGenerationPrompt = optionalBool(o.add_generation_prompt, "add_generation_prompt");
  const continueFinalMessage = optionalBool(o.continue_final_message, "continue_final_message");
  // vLLM's own check: continuing the final message and opening a new turn contradict each other.
  if (continueFinalMessage && addGenerationPrompt !== false)
    throw new BadRequest("continue_final_message requires add_generation_prompt to be false");
  return {
    kind: "chat", messages: chatMessages(o.messages as ChatMessage[]), tools: (o.tools ?? undefined) as unknown[] | undefined, toolChoice: o.tool_choice, chatTemplate: optionalString(o.chat_template, "chat_template"), templateKwargs, addGenerationPrompt, continueFinalMessage,
    addSpecialTokens: optionalBool(o.add_special_tokens, "add_special_tokens"), ...(o.echo === true ? { echo: true } : {}), ...truncationOf(o),
  };
}

// Keys only a Responses request has; /v1/embeddings also takes `input` (a string or a list of strings/ids).
const RESPONSES_KEYS = ["instructions", "previous_response_id", "max_output_tokens", "reasoning", "store", "include", "background", "text", "truncation"];

/**
 * Whether a body with `input` is a /v1/responses request: the path says so when it names an API (@kv-epp/protocol's
 * apiOfPath); otherwise (no path, or one a gateway rewrites past that rule) an input of items (objects), or a
 * Responses-only field.
 */
function isResponses(o: Record<string, unknown>, path: string | undefined): boolean {
  const api = apiOfPath(path);
  if (api !== undefined) return api === "/v1/responses";
  if (Array.isArray(o.input)) return o.input.length > 0 && o.input.every((x) => typeof x === "object" && x !== null && !Array.isArray(x));
  return typeof o.input === "string" && RESPONSES_KEYS.some((k) => o[k] !== undefined);
}

/** truncate_prompt_tokens (an integer >= -1, as vLLM validates it) and truncation_side. */
function truncationOf(o: Record<string, unknown>): Truncation {
  const out: Truncation = {};
  const k = plainNumber(o.truncate_prompt_tokens);
  if (k !== undefined && k !== null) {
    if (typeof k !== "number" || !Number.isInteger(k) || k < -1) throw new BadRequest("truncate_prompt_tokens must be an integer >= -1");
    out.truncatePromptTokens = k;
  }
  const side = o.truncation_side;
  if (side !== undefined && side !== null) {
    if (side !== "left" && side !== "right") throw new BadRequest('truncation_side must be "left" or "right"');
    out.truncationSide = side;
  }
  return out;
}

/** A number parsed as a PyNumber read as the number it is; pydantic takes 5.0 for an int field. */
function plainNumber(v: unknown): unknown {
  return v instanceof PyNumber ? v.value : v;
}

/**
 * A chat request's messages as vLLM's ChatCompletionRequest validator leaves them: a message's deprecated
 * `reasoning_content` becomes its `reasoning` where that is null or absent (Qwen's agents send history this
 * way; dropped, the turn would lose its <think> block and every later block its identity). Only for
 * /v1/chat/completions: vLLM's Responses path does not rename. A content part given as a plain string becomes the
 * text part vLLM parses it as. Messages needing neither are returned as they are.
 */
export function chatMessages(messages: ChatMessage[]): ChatMessage[] {
  if (!messages.some((m) => m.reasoning_content !== undefined || hasStringPart(m))) return messages;
  return messages.map((m) => {
    if (hasStringPart(m)) m = { ...m, content: (m.content as unknown[]).map((p) => (typeof p === "string" ? { type: "text", text: p } : p)) as ContentPart[] };
    if (m.reasoning_content === undefined) return m;
    const { reasoning_content: old, ...rest } = m;
    return old !== null && (rest.reasoning === undefined || rest.reasoning === null) ? { ...rest, reasoning: old } : rest;
  });
}

const hasStringPart = (m: ChatMessage) => Array.isArray(m.content) && (m.content as unknown[]).some((p) => typeof p === "string");

/**
 * A reasoning effort: a string, or null for none. Which strings vLLM takes follows its openai package's version
 * ("xhigh", "max" came later), so any string is rendered as given rather than refused here for a worker that takes it.
 */
function reasoningEffort(v: unknown, field: string): string | undefined {
  if (v === undefined || v === null) return undefined;
  if (typeof v !== "string") throw new BadRequest(`${field} must be a string`);
  return v;
}


/**
 * The template variables a chat request adds, as vLLM's ChatCompletionRequest.build_chat_params merges them: its
 * `chat_template_kwargs` (e.g. enable_thinking), then its own `documents` and `reasoning_effort` where set (a null
 * one leaves a kwarg of that name alone); a `reasoning_effort` also sets `enable_thinking` (false for "none") unless
 * chat_template_kwargs names it. vLLM renders with these, so the route must too: RAG templates print the documents
 * near the prompt's start, and thinking templates change the generation prompt. The mock worker renders with the same.
 */
export function templateKwargsOf(o: Record<string, unknown>): Record<string, unknown> | undefined {
  const { documents } = o;
  if (documents !== undefined && documents !== null && !(Array.isArray(documents) && documents.every(isStringRecord)))
    throw new BadRequest("documents must be an array of objects of strings");
  return mergeTemplateKwargs(o.chat_template_kwargs, documents ?? undefined, reasoningEffort(o.reasoning_effort, "reasoning_effort"));
}

/**
 * A Responses request's template variables (ResponsesRequest.build_chat_params): as a chat's, its
 * `chat_template_kwargs` then its `reasoning.effort` (no documents).
 */
export function responsesTemplateKwargs(o: Record<string, unknown>): Record<string, unknown> | undefined {
  const reasoning = o.reasoning;
  if (reasoning !== undefined && reasoning !== null && !isPyDict(reasoning)) throw new BadRequest("reasoning must be an object");
  const effort = reasoning === undefined || reasoning === null ? undefined : reasoningEffort(reasoning.effort, "reasoning.effort");
  return mergeTemplateKwargs(o.chat_template_kwargs, undefined, effort);
}

/** merge_kwargs(chat_template_kwargs, the request's own fields), as both build_chat_params call it. */
function mergeTemplateKwargs(kw: unknown, documents: unknown, effort: string | undefined): Record<string, unknown> | undefined {
  if (kw !== undefined && kw !== null && !isPyDict(kw)) throw new BadRequest("chat_template_kwargs must be an object");
  const given = (kw ?? undefined) as Record<string, unknown> | undefined;
  if (documents === undefined && effort === undefined) return given;
  const out: Record<string, unknown> = { ...given };
  if (documents !== undefined) out.documents = documents;
  if (effort !== undefined) {
    // merge_kwargs leaves out an "auto", as a null; enable_thinking still follows it.
    if (effort !== "auto") out.reasoning_effort = effort;
    if (given === undefined || !Object.hasOwn(given, "enable_thinking")) out.enable_thinking = effort !== "none";
  }
  return out;
}

const isStringRecord = (d: unknown): boolean => isPyDict(d) && Object.values(d).every((v) => typeof v === "string");

export function optionalString(v: unknown, field: string): string | undefined {
  if (v === undefined || v === null) return undefined;
  if (typeof v !== "string") throw new BadRequest(`${field} must be a string`);
  return v;
}

export function optionalBool(v: unknown, field: string): boolean | undefined {
  if (v === undefined || v === null) return undefined;
  if (typeof v !== "boolean") throw new BadRequest(`${field} must be a boolean`);
  return v;
}

function promptInput(p: unknown, truncation: Truncation): Pick<ParsedBody, "input" | "batchedPrompts"> {
  if (typeof p === "string") return { input: { kind: "prompt", text: p } };
  // A token prompt is truncated as vLLM truncates it (no special tokens are added to one).
  const tokens = (v: unknown, field: string): RoutedInput => ({ kind: "tokens", tokens: truncatePrompt(tokenArray(v, field), truncation) });
  if (Array.isArray(p)) {
    if (p.length === 0) return { input: { kind: "tokens", tokens: new Uint32Array(0) } };
    // Batched prompts (string[] or number[][]): the first prompt decides the route.
    const batchedPrompts = p.length > 1 ? p.length : undefined;
    if (typeof p[0] === "string") return { input: { kind: "prompt", text: p[0] }, batchedPrompts };
    if (Array.isArray(p[0])) return { input: tokens(p[0], "prompt[0]"), batchedPrompts };
    return { input: tokens(p, "prompt") };
  }
  throw new BadRequest("prompt must be a string, a token id array, or a batch of them");
}

function tokenArray(v: unknown, field: string): Uint32Array {
  if (!Array.isArray(v)) throw new BadRequest(`${field} must be an array of token ids`);
  const out = new Uint32Array(v.length);
  for (let i = 0; i < v.length; i++) {
    const t = plainNumber(v[i]);
    if (typeof t !== "number" || !Number.isInteger(t) || t < 0 || t > 0xffffffff)
      throw new BadRequest(`${field}[${i}] is not a token id: ${JSON.stringify(t)}`);
    out[i] = t;
  }
  return out;
}

/** The chat a /v1/responses body renders as (@kv-epp/tokenizer's responsesChat), refusals as BadRequest. */
function responsesChatOf(o: Record<string, unknown>): ResponsesChat {
  try {
    return responsesChat(o.instructions, o.input, o.tools);
  } catch (e) {
    if (e instanceof ResponsesInputError) throw new BadRequest(e.message);
    throw e;
  }
}
