/**
 * The request's `truncate_prompt_tokens` / `truncation_side`, as vLLM applies them (vllm/renderers/params.py
 * TokenizeParams): keep k tokens, the last k by default (vLLM loads generation tokenizers with
 * truncation_side="left"), the first k with side "right". A text prompt is truncated by the tokenizer itself
 * (encode with truncation=True, max_length=k), which keeps the special tokens it adds and counts them in k.
 * -1 means "the model's input length" (max_model_len - max_tokens), which a router does not know: not applied.
 */
export type Truncation = { truncatePromptTokens?: number; truncationSide?: "left" | "right" };

/** `ids` cut to what vLLM keeps, `prefix`/`suffix` (the special tokens added around them) kept whole. */
export function truncatePrompt(ids: Uint32Array, t: Truncation, prefix: Uint32Array = EMPTY, suffix: Uint32Array = EMPTY): Uint32Array {
  const k = t.truncatePromptTokens;
  const room = k === undefined || k < 0 ? ids.length : Math.max(0, k - prefix.length - suffix.length);
  const body = room >= ids.length ? ids : t.truncationSide === "right" ? ids.subarray(0, room) : ids.subarray(ids.length - room);
  if (prefix.length === 0 && suffix.length === 0) return body;
  const out = new Uint32Array(prefix.length + body.length + suffix.length);
  out.set(prefix, 0);
  out.set(body, prefix.length);
  out.set(suffix, prefix.length + body.length);
  return out;
}

/** Whether `t` may drop tokens: a truncate_prompt_tokens of 0 or more (-1 is not applied, see above). */
export function truncates(t: Truncation): boolean {
  return t.truncatePromptTokens !== undefined && t.truncatePromptTokens >= 0;
}

/** truncate_prompt_tokens that keeps the last tokens (vLLM's default side for generation). */
export function keepsTail(t: Truncation): boolean {
  return truncates(t) && t.truncationSide !== "right";
}

const EMPTY = new Uint32Array(0);
