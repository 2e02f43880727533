// vLLM's extra_keys as they arrive on the wire (decoded msgpack: strings, [identifier, offset] pairs,
// bytes) turned into the ExtraKey values block identity folds in.
//
// Domain-tagged entries: merged vLLM (kv_cache_utils.py generate_block_hash_extra_keys) publishes bare
// values: the LoRA name and the cache salt as strings, multimodal items as (identifier, offset), prompt
// embeddings as a digest. Open PRs label each value with its source so that a LoRA named "x" and
// cache_salt "x" stop colliding: ("lora", name) and ("cache_salt", salt) (#44706, #51899), and a LoRA's
// loaded version as ("lora_identity", digest) beside ("lora", name) (#48352; path-derived when the
// weights cannot be read). None of them is merged: their exact labels may still change. A tagged entry
// of a domain we know folds to the same ExtraKey as its bare form, so a request (which states the LoRA
// by name and the salt as given) matches either producer. The EPP cannot know which version of an
// adapter a worker loaded, so a version label is left out of identity (skipped, counted); an entry of
// any other shape keeps an identity no request produces (never matches) and is counted.
import type { BlockExtraKeys, ExtraKey } from "./extra-keys.ts";

/** What reading wire extra keys left out of block identity: entries of an unknown shape or label, version labels skipped. */
export type ExtraKeyTally = { unknown: number; skipped: number };

export function newExtraKeyTally(): ExtraKeyTally {
  return { unknown: 0, skipped: 0 };
}

/**
 * One block's wire entry as ExtraKeys: strings and bytes as they are, a `[string, int]` pair as a
 * multimodal key, a domain-tagged entry as its bare form. Anything else becomes a string no request
 * produces, so the block still gets an identity of its own and never matches a request that lacks it.
 */
export function fromWireExtraKeys(entry: readonly unknown[] | null | undefined, tally?: ExtraKeyTally): BlockExtraKeys {
  if (!entry || entry.length === 0) return NONE;
  const out: ExtraKey[] = [];
  for (const v of entry) {
    const k = fromWireKey(v);
    if (k === SKIP) {
      if (tally) tally.skipped++;
    } else {
      if (k === null) {
        if (tally) tally.unknown++;
        out.push(unrecognised(v));
      } else out.push(k);
    }
  }
  return out.length === 0 ? NONE : out;
}

const NONE: BlockExtraKeys = [];
const SKIP = Symbol("skip");

/** Labels that state an adapter's loaded version (content digest or path): not something a request names. */
const VERSION_LABELS = new Set(["lora_identity", "lora_path"]);

function fromWireKey(v: unknown): ExtraKey | null | typeof SKIP {
  if (typeof v === "string" || v instanceof Uint8Array) return v;
  if (!Array.isArray(v) || v.length < 2 || typeof v[0] !== "string") return null;
  const mm = mmPair(v[0], v[1], v.length);
  if (mm) return mm;
  // A domain label followed by its value.
  const [label, value] = v as [string, unknown];
  if (VERSION_LABELS.has(label)) return SKIP;
  if (v.length !== 2) {
    // ("mm", identifier, offset)
    return (label === "mm" || label === "multimodal") && v.length === 3 ? mmPair(v[1], v[2], 2) : null;
  }
  switch (label) {
    case "lora":
    case "cache_salt":
      return typeof value === "string" ? value : null;
    case "prompt_embeds":
      return value instanceof Uint8Array ? value : null;
    case "mm":
    case "multimodal":
      return Array.isArray(value) ? mmPair(value[0], value[1], value.length) : null;
    default:
      return null;
  }
}

function mmPair(id: unknown, offset: unknown, length: number): ExtraKey | null {
  if (length !== 2 || typeof id !== "string") return null;
  const off = typeof offset === "bigint" ? Number(offset) : offset;
  return typeof off === "number" && Number.isSafeInteger(off) ? { mmId: id, offset: off } : null;
}

function unrecognised(v: unknown): string {
  return `\u0000unrecognised:${JSON.stringify(v, (_k, x) => (typeof x === "bigint" ? `${x}n` : x instanceof Uint8Array ? Array.from(x) : x))}`;
}
