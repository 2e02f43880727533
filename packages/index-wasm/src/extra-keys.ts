// A block's extra keys as vLLM folds them into its block hash (vllm/v1/core/kv_cache_utils.py,
// generate_block_hash_extra_keys): the LoRA name on every block, then (multimodal identifier,
// block-relative offset) pairs, then the cache salt on block 0 only, then prompt-embeds digests.
// This module gives the types, builds the per-block tuples for requests and events, and writes the
// bytes the local hash appends to a block's token ids (the layout is in ../README.md, "Block identity").

/** A multimodal item in a block: vLLM's `(identifier, offset)`, offset relative to the block's first token (may be negative). */
export type MmExtraKey = { mmId: string; offset: number };

/** One entry of vLLM's per-block extra-keys tuple: a string (LoRA name, cache salt), a multimodal pair, or bytes (prompt-embeds digest). */
export type ExtraKey = string | MmExtraKey | Uint8Array;

/** A block's extra keys in vLLM's order; empty means none (the block hashes as its tokens alone). */
export type BlockExtraKeys = readonly ExtraKey[];

/** Extra keys per block, index i for block i; a missing, null or empty entry means none. */
export type BlockExtras = readonly (BlockExtraKeys | null | undefined)[];

/** A multimodal item of a prompt, in token positions: vLLM's `mm_feature.identifier` and `mm_position`. */
export type MmItem = { mmId: string; offset: number; length: number };

/**
 * Extra keys of each of a prompt's first `blocks` blocks of `blockSize` tokens, exactly as vLLM's
 * generate_block_hash_extra_keys builds them: [loraName] + mm pairs overlapping the block + [cacheSalt]
 * on block 0 + [promptEmbedDigests[i]]. Items must be sorted by offset (vLLM assumes the same). Blocks
 * without any key share one empty array; blocks with only the LoRA name share one array too.
 */
export function requestBlockExtras(
  blocks: number,
  blockSize: number,
  req: { loraName?: string | null; cacheSalt?: string | null; mmItems?: readonly MmItem[]; promptEmbedDigests?: readonly (Uint8Array | null | undefined)[] },
): BlockExtraKeys[] {
  const lora: ExtraKey[] = req.loraName ? [req.loraName] : [];
  const mm = req.mmItems ?? [];
  const out: BlockExtraKeys[] = [];
  let item = 0;
  for (let i = 0; i < blocks; i++) {
    const start = i * blockSize, end = start + blockSize;
    let keys: ExtraKey[] | null = null; // null while the block's keys are just the shared `lora`
    const add = (k: ExtraKey) => { (keys ??= [...lora]).push(k); };
    // items wholly before this block are done; an item reaching past the block's end stays current
    while (item < mm.length && mm[item]!.offset + mm[item]!.length <= start) item++;
    for (let j = item; j < mm.length && mm[j]!.offset < end; j++) {
      const it = mm[j]!;
      if (it.offset + it.length > start) add({ mmId: it.mmId, offset: it.offset - start });
    }
    if (i === 0 && req.cacheSalt) add(req.cacheSalt);
    const digest = req.promptEmbedDigests?.[i];
    if (digest) add(digest);
    out.push(keys ?? lora);
  }
  return out;
}

/**
 * Extra keys of a BlockStored event's blocks: its `extra_keys` entries as they are (vLLM's tuples already
 * hold the LoRA name); without `extra_keys` (vLLM before it published them), the event-level
 * `lora_name` on every block, which is all such a vLLM folded in for a text-only prompt.
 */
export function eventBlockExtras(
  blocks: number,
  ev: { loraName?: string | null; extraKeys?: readonly (BlockExtraKeys | null | undefined)[] | null },
): BlockExtras {
  if (ev.extraKeys) return ev.extraKeys;
  if (!ev.loraName) return [];
  const lora = [ev.loraName];
  return Array.from({ length: blocks }, () => lora);
}

const TAG_STRING = 0x01;
const TAG_MM = 0x02;
const TAG_BYTES = 0x03;
/** Closes every non-empty extra-keys trailer: "KVX1" (after the u32 entry count). */
const TRAILER_MAGIC = 0x3158564b;
const utf8 = new TextEncoder();

function entryBytes(k: ExtraKey): number {
  if (typeof k === "string") return 5 + utf8.encode(k).length;
  if (k instanceof Uint8Array) return 5 + k.length;
  return 13 + utf8.encode(k.mmId).length;
}

function checkKey(k: unknown): asserts k is ExtraKey {
  if (typeof k === "string" || k instanceof Uint8Array) return;
  const mm = k as MmExtraKey | null;
  if (mm === null || typeof mm !== "object" || typeof mm.mmId !== "string" || !Number.isSafeInteger(mm.offset)) {
    throw new TypeError(`an extra key is a string, a Uint8Array or { mmId: string, offset: safe integer }, got ${String(k)}`);
  }
}

/**
 * The bytes a block's extra keys append to its token ids before hashing (empty for no keys):
 * each entry typed and length-prefixed, then the entry count and "KVX1". See ../README.md.
 */
export function encodeExtraKeys(keys: BlockExtraKeys): Uint8Array {
  if (keys.length === 0) return new Uint8Array(0);
  let size = 8;
  for (const k of keys) { checkKey(k); size += entryBytes(k); }
  const out = new Uint8Array(size);
  const dv = new DataView(out.buffer);
  let at = 0;
  const put = (tag: number, bytes: Uint8Array) => {
    out[at] = tag;
    dv.setUint32(at + 1, bytes.length, true);
    out.set(bytes, at + 5);
    at += 5 + bytes.length;
  };
  for (const k of keys) {
    if (typeof k === "string") put(TAG_STRING, utf8.encode(k));
    else if (k instanceof Uint8Array) put(TAG_BYTES, k);
    else {
      put(TAG_MM, utf8.encode(k.mmId));
      dv.setBigInt64(at, BigInt(k.offset), true);
      at += 8;
    }
  }
  dv.setUint32(at, keys.length, true);
  dv.setUint32(at + 4, TRAILER_MAGIC, true);
  return out;
}
