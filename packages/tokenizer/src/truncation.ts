/**
 * The request's `truncate_prompt_tokens` / `truncation_side`, as vLLM applies them (vllm/renderers/params.py
 * TokenizeParams): keep k tokens. Without a side, the tokenizer truncates as it encodes (truncation=True,
 * max_length=k) on its own side, "left" for generation tokenizers, so the last k are kept, the special tokens it
 * adds kept and counted in k. A request's explicit side turns that off (get_encode_kwargs): the prompt is encoded
 * whole and its ids sliced on that side (_token_truncation), special tokens included: "left" keeps the last k ids
 * (a BOS goes), "right" the first k.
 * -1 means "the model's input length" (max_model_len - max_tokens), which a router does not know: not applied.
 */
export type Truncation = { truncatePromptTokens?: number; truncationSide?: "left" | "right" };

/** `ids` cut to what vLLM keeps, with `prefix`/`suffix` (the special tokens added around them). */
export function truncatePrompt(ids: Uint32Array, t: Truncation, prefix: Uint32Array = EMPTY, suffix: Uint32Array = EMPTY): Uint32Array {
  const k = t.truncatePromptTokens;
  if (t.truncationSide !== undefined && k !== undefined && k >= 0) {
    const all = join(prefix, ids, suffix);
    return k >= all.length ? all : t.truncationSide === "right" ? all.subarray(0, k) : all.subarray(all.length - k);
  }
  const room = k === undefined || k < 0 ? ids.length : Math.max(0, k - prefix.length - suffix.length);
  return join(prefix, room >= ids.length ? ids : ids.subarray(ids.length - room), suffix);
}

/** Whether `t` may drop tokens: a truncate_prompt_tokens of 0 or more (-1 is not applied, see above). */
export function truncates(t: Truncation): boolean {
  return t.truncatePromptTokens !== undefined && t.truncatePromptTokens >= 0;
}

/** truncate_prompt_tokens that keeps the last tokens (vLLM's default side for generation). */
export function keepsTail(t: Truncation): boolean {
  return truncates(t) && t.truncationSide !== "right";
}

function join(prefix: Uint32Array, body: Uint32Array, suffix: Uint32Array): Uint32Array {
  if (prefix.length === 0 && suffix.length === 0) return body;
  const out = new Uint32Array(prefix.length + body.length + suffix.length);
  out.set(prefix, 0);
  out.set(body, prefix.length);
  out.set(suffix, prefix.length + body.length);
  return out;
}

const EMPTY = new Uint32Array(0);
