// How a request to SGLang workers names its LoRA adapter (SGLang's OpenAI server, serving_base.py): in its `model`
// as "<base>:<adapter>", else in the body's `lora_path` (read with the body, @kv-epp/tokenizer's BodyFields).

/**
 * SGLang's "<base>:<adapter>" model (_parse_model_parameter): split at the first colon, each side trimmed, an empty
 * adapter none. Undefined for a model without a colon. SGLang refuses the request (404) unless `base` is a name it
 * serves.
 */
export function sglangAdapterForm(model: string): { base: string; adapter: string | null } | undefined {
  const colon = model.indexOf(":");
  if (colon < 0) return undefined;
  return { base: model.slice(0, colon).trim(), adapter: model.slice(colon + 1).trim() || null };
}

/**
 * The model a request to SGLang workers runs as, in SGLang's own form: its `model`'s adapter wins (an adapter in
 * "<model>:<adapter>"), else its `lora_path` is the adapter ("<model>:<lora_path>", as _resolve_lora_path reads it).
 */
export function sglangModel(model: string | undefined, loraPath: string | undefined): string | undefined {
  if (model === undefined || loraPath === undefined) return model;
  const form = sglangAdapterForm(model);
  if (form?.adapter) return model;
  return `${form?.base ?? model}:${loraPath}`;
}
