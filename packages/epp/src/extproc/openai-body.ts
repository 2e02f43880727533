// The OpenAI request bodies the EPP routes: /v1/completions and /v1/chat/completions.
// Only the fields that decide the route are read; the body itself is forwarded untouched.

export type ChatMessage = { role: string; content?: unknown; [k: string]: unknown };

export type RoutedInput =
  | { kind: "tokens"; tokens: Uint32Array }
  | { kind: "prompt"; text: string }
  | { kind: "chat"; messages: ChatMessage[]; tools?: unknown[]; templateKwargs?: Record<string, unknown> }
  | { kind: "none" };

export type ParsedBody = { model?: string; input: RoutedInput };

export class BadRequest extends Error {}

const decoder = new TextDecoder();

export function parseBodyBytes(body: Uint8Array): ParsedBody {
  let doc: unknown;
  try {
    doc = JSON.parse(decoder.decode(body));
  } catch (e) {
    throw new BadRequest(`request body is not JSON: ${(e as Error).message}`);
  }
  return parseBody(doc);
}

/** Validates an already-decoded body (also used by POST /select). */
export function parseBody(doc: unknown): ParsedBody {
  if (typeof doc !== "object" || doc === null || Array.isArray(doc)) throw new BadRequest("request body must be a JSON object");
  const o = doc as Record<string, unknown>;
  if (o.model !== undefined && typeof o.model !== "string") throw new BadRequest("model must be a string");
  const model = o.model as string | undefined;
  if (o.token_ids !== undefined) return { model, input: { kind: "tokens", tokens: tokenArray(o.token_ids, "token_ids") } };
  if (o.messages !== undefined) {
    if (!Array.isArray(o.messages) || o.messages.some((m) => typeof m !== "object" || m === null || typeof m.role !== "string"))
      throw new BadRequest("messages must be an array of {role, content}");
    if (o.tools !== undefined && !Array.isArray(o.tools)) throw new BadRequest("tools must be an array");
    const kw = o.chat_template_kwargs;
    if (kw !== undefined && kw !== null && (typeof kw !== "object" || Array.isArray(kw)))
      throw new BadRequest("chat_template_kwargs must be an object");
    // vLLM renders the template with these (e.g. enable_thinking), so the route must too.
    const templateKwargs = (kw ?? undefined) as Record<string, unknown> | undefined;
    return { model, input: { kind: "chat", messages: o.messages as ChatMessage[], tools: o.tools as unknown[] | undefined, templateKwargs } };
  }
  if (o.prompt !== undefined) return { model, input: promptInput(o.prompt) };
  return { model, input: { kind: "none" } };
}

function promptInput(p: unknown): RoutedInput {
  if (typeof p === "string") return { kind: "prompt", text: p };
  if (Array.isArray(p)) {
    if (p.length === 0) return { kind: "tokens", tokens: new Uint32Array(0) };
    // Batched prompts (string[] or number[][]): the first prompt decides the route.
    if (typeof p[0] === "string") return { kind: "prompt", text: p[0] };
    if (Array.isArray(p[0])) return { kind: "tokens", tokens: tokenArray(p[0], "prompt[0]") };
    return { kind: "tokens", tokens: tokenArray(p, "prompt") };
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
