// Local block hashes (DESIGN.md section 3), computed inside the WebAssembly module.
import { instantiate, ScratchRegion, type IndexExports } from "./wasm-module.ts";

export const BLOCK_HASH_SEED = 1337n;

let hasher: { ex: IndexExports; tokens: ScratchRegion; out: ScratchRegion } | undefined;

/** XXH3-64 (seed 1337) of each full block of `blockSize` token ids, hashed as u32 little-endian bytes. */
export function computeBlockHashes(tokenIds: Uint32Array, blockSize: number): BigUint64Array {
  if (!Number.isInteger(blockSize) || blockSize <= 0) throw new RangeError(`blockSize must be a positive integer, got ${blockSize}`);
  const n = Math.floor(tokenIds.length / blockSize);
  if (n === 0) return new BigUint64Array(0);
  if (!hasher) {
    const ex = instantiate();
    hasher = { ex, tokens: new ScratchRegion(ex), out: new ScratchRegion(ex) };
  }
  const { ex } = hasher;
  const tPtr = hasher.tokens.ensure(n * blockSize * 4);
  const oPtr = hasher.out.ensure(n * 8);
  new Uint32Array(ex.memory.buffer, tPtr, n * blockSize).set(tokenIds.subarray(0, n * blockSize));
  ex.computeBlockHashes(tPtr, n * blockSize, blockSize, BLOCK_HASH_SEED, oPtr);
  return new BigUint64Array(ex.memory.buffer, oPtr, n).slice();
}
