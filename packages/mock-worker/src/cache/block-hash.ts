import { createHash, randomBytes } from "node:crypto";
import type { ExtraKeyValue } from "@kv-epp/kv-events";

/**
 * External block hashes, vLLM style: each full block's id is a digest over its parent's digest, its
 * own token ids and its extra keys, so a block names its whole prefix and everything vLLM folds into
 * it (LoRA adapter, cache salt, multimodal items). vLLM's choice of hash function is an engine detail
 * the router treats as opaque; we use SHA-256 over `parent digest (32 B; for a root block the seed,
 * vLLM's NONE_HASH, when there is one) || token ids as u32 little-endian || JSON of the extra keys
 * (absent when there are none)`. In int mode the published id is the low 64 bits of the big-endian
 * digest, which is exactly what a consumer folds a bytes-mode digest to.
 *
 * vLLM's root parent, NONE_HASH, is 32 random bytes drawn per engine process unless PYTHONHASHSEED is
 * set (then it is the hash of that seed): engines without a shared seed name the same prefix with
 * different ids. Without a seed here every cache names it alike, as engines sharing one seed do.
 */
export type BlockId = { hash: bigint; digest: Uint8Array; extraKeys: ExtraKeyValue[] | null };

/** A multimodal item in the prompt: its placeholder tokens [offset, offset + length) and identifier. */
export type MediaItem = { identifier: string; offset: number; length: number };

/** What besides the tokens names a request's blocks (vLLM's generate_block_hash_extra_keys inputs). */
export type RequestIdentity = { loraName?: string | null; cacheSalt?: string | null; media?: readonly MediaItem[] };

export const BASE_IDENTITY: RequestIdentity = {};

export function foldDigest(digest: Uint8Array): bigint {
  return new DataView(digest.buffer, digest.byteOffset, digest.byteLength).getBigUint64(digest.byteLength - 8, false);
}

/**
 * A block's extra keys in vLLM's order: the LoRA name (every block), then each multimodal item that
 * overlaps the block as (identifier, item offset - block start), then the cache salt (block 0 only);
 * null when there are none.
 */
export function blockExtraKeys(id: RequestIdentity, start: number, end: number): ExtraKeyValue[] | null {
  const keys: ExtraKeyValue[] = [];
  if (id.loraName) keys.push(id.loraName);
  for (const m of id.media ?? []) if (m.offset < end && m.offset + m.length > start) keys.push([m.identifier, m.offset - start]);
  if (start === 0 && id.cacheSalt != null) keys.push(id.cacheSalt);
  return keys.length > 0 ? keys : null;
}

/**
 * A cache's NONE_HASH for `--hash-seed`: `random` draws 32 bytes (vLLM without PYTHONHASHSEED, a
 * different one per engine process), any other value is hashed (vLLM with PYTHONHASHSEED set).
 */
export function noneHash(seed: string): Uint8Array {
  return seed === "random" ? new Uint8Array(randomBytes(32)) : new Uint8Array(createHash("sha256").update(`PYTHONHASHSEED=${seed}`).digest());
}

/** The ids of the prompt's full blocks; `seed` (a NONE_HASH) is the root block's parent, none: no parent. */
export function chainBlockIds(tokens: Uint32Array, blockSize: number, id: RequestIdentity = BASE_IDENTITY, seed: Uint8Array | null = null): BlockId[] {
  const full = Math.floor(tokens.length / blockSize);
  const ids: BlockId[] = [];
  let parent: Uint8Array | null = seed;
  for (let b = 0; b < full; b++) {
    const block = tokens.subarray(b * blockSize, (b + 1) * blockSize);
    // Token ids are hashed little-endian regardless of host order.
    const bytes = new Uint8Array(blockSize * 4);
    const view = new DataView(bytes.buffer);
    for (let i = 0; i < block.length; i++) view.setUint32(i * 4, block[i]!, true);
    const extraKeys = blockExtraKeys(id, b * blockSize, (b + 1) * blockSize);
    const h = createHash("sha256");
    if (parent) h.update(parent);
    h.update(bytes);
    if (extraKeys) h.update(JSON.stringify(extraKeys));
    const digest = new Uint8Array(h.digest());
    ids.push({ hash: foldDigest(digest), digest, extraKeys });
    parent = digest;
  }
  return ids;
}
