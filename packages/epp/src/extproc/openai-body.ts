// The OpenAI request bodies the EPP routes: /v1/completions and /v1/chat/completions.
// Only the fields that decide the route are read; the body itself is forwarded untouched.
import { JsonFieldScanner, type JsonField } from "@kv-epp/index-wasm/json";

export type ChatMessage = { role: string; content?: unknown; [k: string]: unknown };

export type RoutedInput =
  | { kind: "tokens"; tokens: Uint32Array }
  | { kind: "prompt"; text: string }
  | {
      kind: "chat";
      messages: ChatMessage[];
      tools?: unknown[];
      templateKwargs?: Record<string, unknown>;
      /** The request's add_generation_prompt / continue_final_message (vLLM's defaults: true / false). */
      addGenerationPrompt?: boolean;
      continueFinalMessage?: boolean;
    }
  | { kind: "none" };

/**
 * `cacheSalt`: vLLM's `cache_salt`, folded into the request's first block (only same-salt requests share blocks).
 * `batchedPrompts`: a /v1/completions batch of this many prompts (> 1); the first one is routed, while the
 * response's usage adds up the whole batch.
 */
export type ParsedBody = { model?: string; cacheSalt?: string; batchedPrompts?: number; input: RoutedInput };

export class BadRequest extends Error {}

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

export function parseBodyBytes(body: Uint8Array): ParsedBody {
  const fast = tokenIdsBody(body);
  if (fast) return fast;
  return parseBody(parseJson(body));
}

/** JSON.parse of a request body, refusing one nested past MAX_JSON_DEPTH before parsing it. */
export function parseJson(body: Uint8Array): unknown {
  const depth = nestingExceeds(body, MAX_JSON_DEPTH);
  if (depth >= 0) throw new TooDeep(`request body nests arrays/objects deeper than ${MAX_JSON_DEPTH} (at byte ${depth})`);
  try {
    return JSON.parse(decoder.decode(body));
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
      // To the closing quote (one preceded by an even run of backslashes), found natively: most of a
      // chat's bytes are inside strings.
      for (;;) {
        const q = b.indexOf(0x22, i + 1);
        if (q < 0) return -1;
        let k = q - 1;
        while (b[k] === 0x5c) k--;
        i = q;
        if ((q - 1 - k) % 2 === 0) break;
      }
    } else if (c === 0x5b || c === 0x7b) {
      if (++depth > max) return i;
    } else if (c === 0x5d || c === 0x7d) depth--;
  }
  return -1;
}

const FIELDS = ["model", "token_ids", "messages", "prompt", "cache_salt"] as const;
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
function tokenIdsBody(body: Uint8Array): ParsedBody | undefined {
  if (body.length > FAST_PATH_MAX_BYTES) return undefined;
  const f = (scanner ??= new JsonFieldScanner(FIELDS)).scan(body);
  if (!f) return undefined;
  const [model, tokenIds, messages, prompt, salt] = f as [JsonField, JsonField, JsonField, JsonField, JsonField];
  if (model.kind !== "absent" && model.kind !== "string") return undefined;
  if (salt.kind !== "absent" && salt.kind !== "string") return undefined;
  let tokens: Uint32Array;
  if (tokenIds.kind === "uints") tokens = tokenIds.values;
  else if (tokenIds.kind === "absent" && messages.kind === "absent" && prompt.kind === "uints") tokens = prompt.values;
  else return undefined;
  const out: ParsedBody = { model: model.kind === "string" ? jsonString(body, model.start, model.end) : undefined, input: { kind: "tokens", tokens } };
  if (salt.kind === "string") out.cacheSalt = jsonString(body, salt.start, salt.end);
  return out;
}

/** The JSON string literal at body[start, end) (quotes included). */
function jsonString(body: Uint8Array, start: number, end: number): string {
  const raw = body.subarray(start, end);
  return raw.includes(0x5c) ? (JSON.parse(decoder.decode(raw)) as string) : decoder.decode(raw.subarray(1, -1));
}

/** OpenAI's shapes of `content`: absent, null, text, or parts ({type: "text", text}, images, ...). */
function validContent(c: unknown): boolean {
  return c === undefined || c === null || typeof c === "string" || (Array.isArray(c) && c.every((p) => typeof p === "object" && p !== null && !Array.isArray(p)));
}

/** Validates an already-decoded body (also used by POST /select). */
export function parseBody(doc: unknown): ParsedBody {
  const parsed = parseInput(doc);
  const salt = (doc as Record<string, unknown>).cache_salt;
  if (salt !== undefined && salt !== null) {
    if (typeof salt !== "string") throw new BadRequest("cache_salt must be a string");
    parsed.cacheSalt = salt;
  }
  return parsed;
}

function parseInput(doc: unknown): ParsedBody {
  if (typeof doc !== "object" || doc === null || Array.isArray(doc)) throw new BadRequest("request body must be a JSON object");
  const o = doc as Record<string, unknown>;
  if (o.model !== undefined && typeof o.model !== "string") throw new BadRequest("model must be a string");
  const model = o.model as string | undefined;
  if (o.token_ids !== undefined) return { model, input: { kind: "tokens", tokens: tokenArray(o.token_ids, "token_ids") } };
  if (o.messages !== undefined) {
    if (!Array.isArray(o.messages) || o.messages.some((m) => typeof m !== "object" || m === null || typeof m.role !== "string"))
      throw new BadRequest("messages must be an array of {role, content}");
    if (o.messages.some((m) => !validContent((m as ChatMessage).content)))
      throw new BadRequest("a message's content must be a string, null, or an array of content parts (objects)");
    if (o.tools !== undefined && !Array.isArray(o.tools)) throw new BadRequest("tools must be an array");
    const kw = o.chat_template_kwargs;
    if (kw !== undefined && kw !== null && (typeof kw !== "object" || Array.isArray(kw)))
      throw new BadRequest("chat_template_kwargs must be an object");
    // vLLM renders the template with these (e.g. enable_thinking), so the route must too.
    const templateKwargs = (kw ?? undefined) as Record<string, unknown> | undefined;
    const addGenerationPrompt = optionalBool(o.add_generation_prompt, "add_generation_prompt");
    const continueFinalMessage = optionalBool(o.continue_final_message, "continue_final_message");
    // vLLM's own check: continuing the final message and opening a new turn contradict each other.
    if (continueFinalMessage && addGenerationPrompt !== false)
      throw new BadRequest("continue_final_message requires add_generation_prompt to be false");
    return {
      model,
      input: { kind: "chat", messages: o.messages as ChatMessage[], tools: o.tools as unknown[] | undefined, templateKwargs, addGenerationPrompt, continueFinalMessage },
    };
  }
  if (o.prompt !== undefined) return { model, ...promptInput(o.prompt) };
  return { model, input: { kind: "none" } };
}

function optionalBool(v: unknown, field: string): boolean | undefined {
  if (v === undefined || v === null) return undefined;
  if (typeof v !== "boolean") throw new BadRequest(`${field} must be a boolean`);
  return v;
}

function promptInput(p: unknown): Pick<ParsedBody, "input" | "batchedPrompts"> {
  if (typeof p === "string") return { input: { kind: "prompt", text: p } };
  if (Array.isArray(p)) {
    if (p.length === 0) return { input: { kind: "tokens", tokens: new Uint32Array(0) } };
    // Batched prompts (string[] or number[][]): the first prompt decides the route.
    const batchedPrompts = p.length > 1 ? p.length : undefined;
    if (typeof p[0] === "string") return { input: { kind: "prompt", text: p[0] }, batchedPrompts };
    if (Array.isArray(p[0])) return { input: { kind: "tokens", tokens: tokenArray(p[0], "prompt[0]") }, batchedPrompts };
    return { input: { kind: "tokens", tokens: tokenArray(p, "prompt") } };
  }
  throw new BadRequest("prompt must be a string, a token id array, or a batch of them");
}

function tokenArray(v: unknown, field: string): Uint32Array {
  if (!Array.isArray(v)) throw new BadRequest(`${field} must be an array of token ids`);
  const out = new Uint32Array(v.length);
  for (let i = 0; i < v.length; i++) {
    const t = v[i];
    if (typeof t !== "number" || !Number.isInteger(t) || t < 0 || t > 0xffffffff)
      throw new BadRequest(`${field}[${i}] is not a token id: ${JSON.stringify(t)}`);
    out[i] = t;
  }
  return out;
}
