// TEMPORARY first cut: the contract's signatures backed by the TypeScript reference model, so that other
// packages can code against them while the WebAssembly index lands behind the same names.
export * from "./types.ts";
import { ReferenceIndex } from "../test/reference-model.ts";

export { ReferenceIndex as KvIndex };

/** XXH3-64 (seed 1337) of each full block of `blockSize` token ids, hashed as u32 little-endian bytes. */
export function computeBlockHashes(tokenIds: Uint32Array, blockSize: number): BigUint64Array {
  const n = Math.floor(tokenIds.length / blockSize);
  const out = new BigUint64Array(n);
  for (let i = 0; i < n; i++) {
    const block = tokenIds.subarray(i * blockSize, (i + 1) * blockSize);
    out[i] = Bun.hash.xxHash3(new Uint8Array(block.buffer, block.byteOffset, block.byteLength), 1337n);
  }
  return out;
}
