// What a BlockStored's blocks fold into their local hash besides their tokens (index-wasm README,
// "Block identity"): vLLM's per-block extra_keys as published; from a vLLM that predates extra_keys,
// its lora_name on every block; from a producer that names its adapter by lora_id alone (older vLLM), a
// key no request carries; SGLang's salt (not in extra_keys) on the first block of a chain. SGLang never
// sets lora_id; a release without lora_name leaves its adapter blocks indexed as the base model's, which
// no request can tell apart. Its radix namespace (extra_key) is on no event: README, "SGLang's KV events".
// Domain-tagged entries (open vLLM PRs, index-wasm's wire-extra-keys.ts) fold as their bare forms.
import { fromWireExtraKeys, type BlockExtraKeys, type ExtraKeyTally } from "@kv-epp/index-wasm";
import type { BlockStored } from "@kv-epp/kv-events";

/**
 * Extra keys of the event's first `n` blocks, or undefined when none of them has any. `tally` counts
 * the entries left out of identity or kept as unknown (the caller's metric).
 */
export function storedBlockExtras(e: BlockStored, n: number, tally?: ExtraKeyTally): BlockExtraKeys[] | undefined {
  let extras: BlockExtraKeys[] | undefined;
  if (e.extraKeys) {
    const wire = e.extraKeys;
    extras = Array.from({ length: n }, (_, i) => fromWireExtraKeys(wire[i], tally));
  } else if (e.loraName || e.loraId != null) {
    // An adapter's blocks hash under it on the engine. Known only by its id, no request's model names
    // it, so its blocks must not match the base model's requests either: they get an identity of their
    // own (a string no request produces, as fromWireExtraKeys gives unknown keys).
    const lora = [e.loraName || `\u0000lora_id:${e.loraId}`];
    extras = Array.from({ length: n }, () => lora);
  }
  const mm = e.mmKeys;
  if (mm && mm.some((k) => k && k.length > 0)) {
    const base = extras;
    extras = Array.from({ length: n }, (_, i) => [...(base?.[i] ?? []), ...fromWireExtraKeys((mm[i] ?? []).map((k) => [k.hash, k.startOffset]), tally)]);
  }
  if (e.cacheSalt != null && e.parentBlockHash === null && n > 0 && !e.extraKeys) {
    extras ??= Array.from({ length: n }, () => []);
    extras[0] = [...extras[0]!, e.cacheSalt];
  }
  return extras;
}
