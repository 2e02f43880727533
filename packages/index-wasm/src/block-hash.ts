// Local block hashes (../README.md, "Block identity"), computed inside the WebAssembly module: XXH3-64 (seed 1337)
// of a block's token ids as u32 little-endian, followed by its extra keys' bytes when it has any.
import { encodeExtraKeys, type BlockExtraKeys, type BlockExtras } from "./extra-keys.ts";
import { instantiate, ScratchRegion, type IndexExports } from "./wasm-module.ts";

export const BLOCK_HASH_SEED = 1337n;

/** A request's or an event's blocks by their token ids (and extra keys), hashed where they are used. */
export type BlockTokens = { tokenIds: Uint32Array | readonly number[]; extras?: BlockExtras };

/**
 * Hashes blocks inside one module instance, writing the hashes to a place in that instance's linear
 * memory: an index hashes a batch's or a query's blocks where they are used, no copy out and back.
 */
export class BlockHasher {
  private readonly tokens: ScratchRegion;
  private readonly trailers: ScratchRegion;
  private readonly spans: ScratchRegion;
  private readonly scratch: ScratchRegion;

  constructor(private readonly ex: IndexExports) {
    this.tokens = new ScratchRegion(ex);
    this.trailers = new ScratchRegion(ex);
    this.spans = new ScratchRegion(ex);
    this.scratch = new ScratchRegion(ex);
  }

  /**
   * Writes the hashes of the first `n` blocks of `blockSize` tokens as u64 at byte `out` (a region the
   * caller reserved in the same instance). May grow linear memory: the caller's views go stale.
   */
  hashInto(tokenIds: Uint32Array | readonly number[], blockSize: number, n: number, extras: BlockExtras | undefined, out: number): void {
    if (n === 0) return;
    const ex = this.ex;
    const encoded = extras && extras.some((k) => k && k.length > 0) ? encodeTrailers(extras, n) : null;
    const tPtr = this.tokens.ensure(n * blockSize * 4);
    const m = n * blockSize;
    const tokens = tokenIds.length === m ? tokenIds : tokenIds instanceof Uint32Array ? tokenIds.subarray(0, m) : tokenIds.slice(0, m);
    if (encoded === null) {
      new Uint32Array(ex.memory.buffer, tPtr, n * blockSize).set(tokens);
      ex.computeBlockHashes(tPtr, n * blockSize, blockSize, BLOCK_HASH_SEED, out);
      return;
    }
    const { bytes, spans, longest } = encoded;
    const bPtr = this.trailers.ensure(Math.max(bytes.length, 1));
    const sPtr = this.spans.ensure(n * 8);
    const scratchPtr = this.scratch.ensure(blockSize * 4 + longest);
    // views after every reserve: growing linear memory detaches earlier views
    new Uint32Array(ex.memory.buffer, tPtr, n * blockSize).set(tokens);
    new Uint8Array(ex.memory.buffer, bPtr, bytes.length).set(bytes);
    new Uint32Array(ex.memory.buffer, sPtr, n * 2).set(spans);
    ex.computeBlockHashesExtra(tPtr, n, blockSize, BLOCK_HASH_SEED, bPtr, sPtr, scratchPtr, out);
  }
}

function checkBlockSize(blockSize: number): void {
  if (!Number.isInteger(blockSize) || blockSize <= 0) throw new RangeError(`blockSize must be a positive integer, got ${blockSize}`);
}

/** Full blocks in `tokens` at `blockSize` (the partial tail is not a block). */
export function fullBlocks(tokens: number, blockSize: number): number {
  checkBlockSize(blockSize);
  return Math.floor(tokens / blockSize);
}

let standalone: { hasher: BlockHasher; ex: IndexExports; out: ScratchRegion } | undefined;

/**
 * The local hash of each full block of `blockSize` token ids (the partial tail is ignored), for
 * callers without an index (ground truth, simulated requests): an index hashes in its own instance
 * (`index.batch().stored(.., { tokenIds })`, `index.findMatchesInto({ tokenIds }, ..)`). Block i folds in
 * `extras[i]` (vLLM's extra-keys tuple for that block: see requestBlockExtras and eventBlockExtras); a
 * block without extra keys hashes as its tokens alone.
 */
export function computeBlockHashes(tokenIds: Uint32Array, blockSize: number, extras?: BlockExtras): BigUint64Array {
  const n = fullBlocks(tokenIds.length, blockSize);
  if (n === 0) return new BigUint64Array(0);
  if (!standalone) {
    const ex = instantiate();
    standalone = { hasher: new BlockHasher(ex), ex, out: new ScratchRegion(ex) };
  }
  const { hasher, ex, out } = standalone;
  const oPtr = out.ensure(n * 8);
  hasher.hashInto(tokenIds, blockSize, n, extras, oPtr);
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
