// What a BlockStored's blocks fold into their local hash besides their tokens (index-wasm README,
// "Block identity"): vLLM's per-block extra_keys as published; from a vLLM that predates extra_keys,
// its lora_name on every block; SGLang's salt (not in extra_keys) on the first block of a chain.
import { fromWireExtraKeys, type BlockExtraKeys } from "@kv-epp/index-wasm";
import type { BlockStored } from "@kv-epp/kv-events";

/** Extra keys of the event's first `n` blocks, or undefined when none of them has any. */
export function storedBlockExtras(e: BlockStored, n: number): BlockExtraKeys[] | undefined {
  let extras: BlockExtraKeys[] | undefined;
  if (e.extraKeys) {
    const wire = e.extraKeys;
    extras = Array.from({ length: n }, (_, i) => fromWireExtraKeys(wire[i]));
  } else if (e.loraName) {
    const lora = [e.loraName];
    extras = Array.from({ length: n }, () => lora);
  }
  if (e.cacheSalt != null && e.parentBlockHash === null && n > 0 && !e.extraKeys) {
    extras ??= Array.from({ length: n }, () => []);
    extras[0] = [...extras[0]!, e.cacheSalt];
  }
  return extras;
}
