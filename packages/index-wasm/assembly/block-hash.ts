// Block hashing for the wrapper: XXH3-64 of each block's token ids (and extra-key trailer).
import { xxh3 } from "./xxh3";

/** XXH3-64 (seed) of each full block of `blockSize` u32 token ids at `tokens`; returns the block count. */
export function computeBlockHashes(tokens: usize, nTokens: u32, blockSize: u32, seed: u64, out: usize): u32 {
  const n = nTokens / blockSize;
  const len = <usize>blockSize << 2;
  for (let i: u32 = 0; i < n; i++) store<u64>(out + (<usize>i << 3), xxh3(tokens + <usize>i * len, len, seed));
  return n;
}

/**
 * computeBlockHashes for blocks with extra keys: block i hashes its token ids followed by the
 * extra-keys bytes at trailers + spans[2i] (length spans[2i + 1]; 0 = none, the tokens alone). The
 * bytes are laid out by the wrapper (src/extra-keys.ts); `scratch` holds one block plus the longest trailer.
 */
export function computeBlockHashesExtra(tokens: usize, nBlocks: u32, blockSize: u32, seed: u64, trailers: usize, spans: usize, scratch: usize, out: usize): void {
  const len = <usize>blockSize << 2;
  for (let i: u32 = 0; i < nBlocks; i++) {
    const block = tokens + <usize>i * len;
    const tl = <usize>load<u32>(spans + (<usize>i << 3), 4);
    let h: u64;
    if (tl == 0) h = xxh3(block, len, seed);
    else {
      memory.copy(scratch, block, len);
      memory.copy(scratch + len, trailers + <usize>load<u32>(spans + (<usize>i << 3)), tl);
      h = xxh3(scratch, len + tl, seed);
    }
    store<u64>(out + (<usize>i << 3), h);
  }
}

export function hashBytes(p: usize, len: usize, seed: u64): u64 { return xxh3(p, len, seed); }
