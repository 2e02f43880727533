// How a request to SGLang workers names its LoRA adapter (SGLang's OpenAI server, serving_base.py): in its `model`
// as "<base>:<adapter>", else in the body's `lora_path` (read with the body, @kv-epp/tokenizer's BodyFields); and its
// `extra_key`, which keeps its blocks in a namespace of its own that no KV event names.
import type { BodyFields } from "@kv-epp/tokenizer";

/**
 * SGLang's "<base>:<adapter>" model (_parse_model_parameter): split at the first colon, each side trimmed, an empty
 * adapter none. Undefined for a model without a colon. SGLang refuses the request (404) unless `base` is a name it
 * serves.
 */
export function sglangAdapterForm(model: string): { base: string; adapter: string | null } | undefined {
  const colon = model.indexOf(":");
  if (colon < 0) return undefined;
  const adapter = model.slice(colon + 1).trim();
  if (adapter.length > MAX_ADAPTER_NAME) return undefined;
  return { base: model.slice(0, colon).trim(), adapter: adapter || null };
}

/**
 * Longest adapter name a request may give. An SGLang adapter need not be known here, and its name goes into every
 * block's hash on the decision thread: a client's megabyte of name would cost that per block. A longer one is no
 * adapter (its model unknown: scored as the default, logged once); SGLang itself refuses names it does not serve.
 */
export const MAX_ADAPTER_NAME = 256;

/**
 * The model a request to SGLang workers runs as, in SGLang's own form: its `model`'s adapter wins (an adapter in
 * "<model>:<adapter>"), else its `lora_path` is the adapter ("<model>:<lora_path>", as _resolve_lora_path reads it).
 */
export function sglangModel(model: string | undefined, loraPath: string | undefined): string | undefined {
  if (model === undefined || loraPath === undefined || loraPath.length > MAX_ADAPTER_NAME) return model;
  const form = sglangAdapterForm(model);
  if (form?.adapter) return model;
  return `${form?.base ?? model}:${loraPath}`;
}

/**
 * What a request is scored as: `model` (what it runs as) and, to SGLang workers (`sglang`), with its `lora_path`
 * adapter; `namespaced`: to SGLang workers, its `extra_key` keeps its blocks where the index sees none, so it is
 * matched on nothing (unmatched) and charged for its length.
 */
export function scoredAs(model: string | undefined, fields: Pick<BodyFields, "loraPath" | "namespaced">, sglang: boolean): { model: string | undefined; namespaced: boolean } {
  if (!sglang) return { model, namespaced: false };
  return { model: sglangModel(model, fields.loraPath), namespaced: fields.namespaced === true };
}

const NO_IDS = new Uint32Array(0);

/** A prompt matched on no worker's blocks, charged for its length (the longer of its ids and its known length). */
export function unmatched(tokens: Uint32Array, promptTokens?: number): { tokens: Uint32Array; promptTokens: number } {
  return { tokens: NO_IDS, promptTokens: Math.max(promptTokens ?? 0, tokens.length) };
}
