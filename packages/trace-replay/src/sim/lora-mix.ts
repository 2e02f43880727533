// The LoRA-mix scenario: some conversations run on a LoRA adapter instead of the base model. vLLM folds
// the adapter's name into every block's hash (extra_keys), so the same tokens under two adapters share
// no cache, and a router must score a request in its adapter's identity. An adapter belongs to a
// conversation, not to a request: every turn of a conversation keeps the one its first turn drew.
import type { TraceRecord } from "../trace.ts";

/** What runs a request: null for the base model, else the adapter's name and vLLM's lora_int_id. */
export type Adapter = { name: string; id: number } | null;

/**
 * Half of the conversations on the base model, the other half spread over `adapters` adapters, drawn
 * from the conversation's first own block (the first trace block is the one every record shares).
 */
export function adapterOf(rec: TraceRecord, adapters: number): Adapter {
  if (adapters <= 0) return null;
  const key = rec.hashIds[1] ?? rec.hashIds[0] ?? 0;
  // murmur3's finaliser: neighbouring ids (new conversations get consecutive ones) land apart.
  let h = key >>> 0;
  h = Math.imul(h ^ (h >>> 16), 0x85ebca6b);
  h = Math.imul(h ^ (h >>> 13), 0xc2b2ae35);
  h = (h ^ (h >>> 16)) >>> 0;
  const slot = h % (2 * adapters);
  return slot < adapters ? null : { name: `adapter-${slot - adapters}`, id: slot - adapters + 1 };
}
