// Two fields of a request body that SGLang reads and vLLM does not, each changing which cached blocks the request
// can reuse (SGLang's serving_base.py, _resolve_lora_path and _compute_extra_key):
// - `lora_path`: the LoRA adapter the request runs in when its `model` names none; SGLang's events name that
//   adapter's blocks by it (lora_name), as they name a "<model>:<adapter>" request's;
// - `extra_key`: a cache namespace of the request's own. SGLang keeps a namespace's radix-tree entries apart from
//   every other's, and no KV event carries it: nothing in the index tells which blocks such a request may reuse.
// Read from the body as it is forwarded, on the decision thread: a byte search for each key as written, and only
// when one is there, a scan of the top-level members in WebAssembly.
import { JsonFieldScanner } from "@kv-epp/index-wasm/json";
import { sglangAdapterForm } from "../indexers/model-indexes.ts";

/** `loraPath`: a non-empty `lora_path` string; `namespaced`: a non-empty `extra_key` string, or one that may be. */
export type SglangFields = { loraPath?: string; namespaced: boolean };

const KEYS = ["lora_path", "extra_key"] as const;
const WRITTEN = KEYS.map((k) => Buffer.from(`"${k}"`));
/**
 * Bodies up to this size are scanned on the decision thread (~1.5 ms a MiB). The scanner keeps memory in proportion
 * to the largest body it read and never gives it back, so a larger one is not scanned: with `"extra_key"` in it,
 * it counts as namespaced (routing it by load loses its affinity, matching it may send it where its blocks are not).
 */
export const SCAN_MAX_BYTES = 1 << 20;
const NONE: SglangFields = { namespaced: false };
const UNREAD: SglangFields = { namespaced: true };
let scanner: JsonFieldScanner | undefined;
const decoder = new TextDecoder();

/**
 * A key written with escapes is not found (Python reads it): such a request is matched as if it had none. A body the
 * scan leaves to a full parse (a top-level key written with escapes, a wanted key given twice, nesting past its
 * bound) counts as namespaced if it holds `"extra_key"`, as an unscanned one does; its `lora_path` is not read.
 */
export function sglangFields(body: Uint8Array): SglangFields {
  const bytes = Buffer.from(body.buffer, body.byteOffset, body.length);
  const [lora, extra] = WRITTEN.map((key) => bytes.includes(key));
  if (!lora && !extra) return NONE;
  const fields = body.length <= SCAN_MAX_BYTES ? (scanner ??= new JsonFieldScanner(KEYS)).scan(body) : null;
  if (fields === null) return extra ? UNREAD : NONE;
  const [loraPath, extraKey] = fields.map((f) => (f.kind === "string" ? (JSON.parse(decoder.decode(body.subarray(f.start, f.end))) as string) : ""));
  return { ...(loraPath ? { loraPath } : {}), namespaced: extraKey !== "" };
}

/**
 * The model a request to SGLang workers runs as, in SGLang's own form: its `model`'s adapter wins (an adapter in
 * "<model>:<adapter>"), else its `lora_path` is the adapter ("<model>:<lora_path>", as SGLang rewrites it).
 */
export function sglangModel(model: string | undefined, loraPath: string | undefined): string | undefined {
  if (model === undefined || loraPath === undefined) return model;
  const form = sglangAdapterForm(model);
  if (form?.adapter) return model;
  return `${form?.base ?? model}:${loraPath}`;
}
