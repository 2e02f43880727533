// Local block hashes (../README.md, "Block identity"), computed inside the WebAssembly module: XXH3-64 (seed 1337)
// of a block's token ids as u32 little-endian, followed by its extra keys' bytes when it has any.
import { encodeExtraKeys, type BlockExtraKeys, type BlockExtras } from "./extra-keys.ts";
import { instantiate, ScratchRegion, type IndexExports } from "./wasm-module.ts";

export const BLOCK_HASH_SEED = 1337n;

let hasher: { ex: IndexExports; tokens: ScratchRegion; out: ScratchRegion; trailers: ScratchRegion; spans: ScratchRegion; scratch: ScratchRegion } | undefined;

function theHasher() {
  if (!hasher) {
    const ex = instantiate();
    const r = () => new ScratchRegion(ex);
    hasher = { ex, tokens: r(), out: r(), trailers: r(), spans: r(), scratch: r() };
  }
  return hasher;
}

/**
 * The local hash of each full block of `blockSize` token ids (the partial tail is ignored). Block i
 * folds in `extras[i]` (vLLM's extra-keys tuple for that block: see requestBlockExtras and
 * eventBlockExtras); a block without extra keys hashes as its tokens alone, as it always did.
 */
export function computeBlockHashes(tokenIds: Uint32Array, blockSize: number, extras?: BlockExtras): BigUint64Array {
  if (!Number.isInteger(blockSize) || blockSize <= 0) throw new RangeError(`blockSize must be a positive integer, got ${blockSize}`);
  const n = Math.floor(tokenIds.length / blockSize);
  if (n === 0) return new BigUint64Array(0);
  const h = theHasher();
  const { ex } = h;
  const encoded = extras && extras.some((k) => k && k.length > 0) ? encodeTrailers(extras, n) : null;
  const tPtr = h.tokens.ensure(n * blockSize * 4);
  const oPtr = h.out.ensure(n * 8);
  if (encoded === null) {
    new Uint32Array(ex.memory.buffer, tPtr, n * blockSize).set(tokenIds.subarray(0, n * blockSize));
    ex.computeBlockHashes(tPtr, n * blockSize, blockSize, BLOCK_HASH_SEED, oPtr);
  } else {
    const { bytes, spans, longest } = encoded;
    const bPtr = h.trailers.ensure(Math.max(bytes.length, 1));
    const sPtr = h.spans.ensure(n * 8);
    const scratchPtr = h.scratch.ensure(blockSize * 4 + longest);
    // views after every reserve: growing linear memory detaches earlier views
    new Uint32Array(ex.memory.buffer, tPtr, n * blockSize).set(tokenIds.subarray(0, n * blockSize));
    new Uint8Array(ex.memory.buffer, bPtr, bytes.length).set(bytes);
    new Uint32Array(ex.memory.buffer, sPtr, n * 2).set(spans);
    ex.computeBlockHashesExtra(tPtr, n, blockSize, BLOCK_HASH_SEED, bPtr, sPtr, scratchPtr, oPtr);
  }
  return new BigUint64Array(ex.memory.buffer, oPtr, n).slice();
}

/**
 * Every distinct extra-keys tuple encoded once (blocks sharing one array, like a LoRA name on every
 * block, share its bytes), and per block its (offset, length) in them.
 */
function encodeTrailers(extras: BlockExtras, n: number): { bytes: Uint8Array; spans: Uint32Array; longest: number } {
  const spanOf = new Map<BlockExtraKeys, [at: number, len: number]>();
  const parts: Uint8Array[] = [];
  const spans = new Uint32Array(n * 2);
  let size = 0, longest = 0;
  for (let i = 0; i < n; i++) {
    const keys = extras[i];
    if (!keys || keys.length === 0) continue;
    let span = spanOf.get(keys);
    if (span === undefined) {
      const b = encodeExtraKeys(keys);
      parts.push(b);
      spanOf.set(keys, span = [size, b.length]);
      size += b.length;
      longest = Math.max(longest, b.length);
    }
    spans[2 * i] = span[0];
    spans[2 * i + 1] = span[1];
  }
  const bytes = new Uint8Array(size);
  let o = 0;
  for (const p of parts) { bytes.set(p, o); o += p.length; }
  return { bytes, spans, longest };
}
