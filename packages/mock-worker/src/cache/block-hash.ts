import { createHash } from "node:crypto";

/**
 * External block hashes, vLLM style: each full block's id is a digest over its parent's digest and its
 * own token ids, so a block names its whole prefix. vLLM's choice of hash function is an engine detail
 * the router treats as opaque; we use SHA-256 over `parent digest (32 B, absent for a root block) ||
 * token ids as u32 little-endian`. In int mode the published id is the low 64 bits of the big-endian
 * digest, which is exactly what a consumer folds a bytes-mode digest to (DESIGN §3).
 */
export type BlockId = { hash: bigint; digest: Uint8Array };

export function foldDigest(digest: Uint8Array): bigint {
  return new DataView(digest.buffer, digest.byteOffset, digest.byteLength).getBigUint64(digest.byteLength - 8, false);
}

export function chainBlockIds(tokens: Uint32Array, blockSize: number): BlockId[] {
  const full = Math.floor(tokens.length / blockSize);
  const ids: BlockId[] = [];
  let parent: Uint8Array | null = null;
  for (let b = 0; b < full; b++) {
    const block = tokens.subarray(b * blockSize, (b + 1) * blockSize);
    // Token ids are hashed little-endian regardless of host order.
    const bytes = new Uint8Array(blockSize * 4);
    const view = new DataView(bytes.buffer);
    for (let i = 0; i < block.length; i++) view.setUint32(i * 4, block[i]!, true);
    const h = createHash("sha256");
    if (parent) h.update(parent);
    h.update(bytes);
    const digest = new Uint8Array(h.digest());
    ids.push({ hash: foldDigest(digest), digest });
    parent = digest;
  }
  return ids;
}
