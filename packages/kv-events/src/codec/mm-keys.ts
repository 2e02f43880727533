// TensorRT-LLM's per-block multimodal keys (its streaming KV events, TensorRT-LLM #17023,
// tensorrt_llm/_torch/pyexecutor/kv_cache_events.py): `mm_keys` is null, or one entry per block, null
// or a list of msgspec tagged structs written as maps `{type: "mm_key", hash, start_offset, uuid?}`.
import type { MmKey } from "./types.ts";

/** The decoded mm_keys; undefined: malformed (the event is dropped and counted). Unknown map keys are skipped. */
export function mmKeys(v: unknown): (MmKey[] | null)[] | null | undefined {
  if (v == null) return null;
  if (!Array.isArray(v)) return undefined;
  const out = new Array<MmKey[] | null>(v.length);
  for (let i = 0; i < v.length; i++) {
    const block: unknown = v[i];
    if (block == null) {
      out[i] = null;
      continue;
    }
    if (!Array.isArray(block)) return undefined;
    const keys = new Array<MmKey>(block.length);
    for (let j = 0; j < block.length; j++) {
      const k = block[j] as Record<string, unknown> | null;
      if (typeof k !== "object" || k === null || Array.isArray(k) || k.type !== "mm_key" || typeof k.hash !== "string") return undefined;
      const off = typeof k.start_offset === "bigint" ? Number(k.start_offset) : k.start_offset;
      if (typeof off !== "number" || !Number.isSafeInteger(off)) return undefined;
      if (k.uuid != null && typeof k.uuid !== "string") return undefined;
      keys[j] = { hash: k.hash, startOffset: off, uuid: (k.uuid as string | undefined) ?? null };
    }
    out[i] = keys;
  }
  return out;
}
