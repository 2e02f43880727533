// The index's one ingestion path: a batch of events built straight in the module's linear memory and
// applied in one call. Hashes in a BigUint64Array are copied in whole (TypedArray.set, a memcpy)
// instead of one BigInt conversion per block; token ids are hashed by the index's own module instance
// straight into the batch. Measured: encoding event objects (two DataView.setBigUint64 per block) cost
// more than the index itself.
import type { BlockHash, TokensHash } from "@kv-epp/protocol";
import type { BlockHasher, BlockTokens } from "./block-hash.ts";
import type { IndexExports } from "./wasm-module.ts";
import type { BatchOutcome, RejectReason, WorkerRef } from "./types.ts";

// event kinds of the module's batch layout (assembly/events.ts applyBatch)
const KIND_REMOVED = 3;
const KIND_CLEARED = 4;
const KIND_STORED_ROOT = 5;
const KIND_STORED_CHILD = 6;
const KIND_STORED_ROOT_COPIES = 7;
const KIND_STORED_CHILD_COPIES = 8;

const rejectReasons: Record<number, RejectReason> = { 1: "unknown-parent", 2: "hash-conflict" };

/** A block's copy count as the batch carries it (a u64 word). */
function checkedCopies(c: number): number {
  if (!Number.isSafeInteger(c) || c < 0) throw new RangeError(`copies must be a non-negative integer, got ${c}`);
  return c;
}

/** What the builder needs from its index: worker slots, the hasher of its instance and the apply call. */
export type BuilderHost = {
  ex: IndexExports;
  blockSize: number;
  hasher(): BlockHasher;
  slotOf(w: WorkerRef): number;
  knows(w: WorkerRef): boolean;
  applyWords(ptr: number, words: number): BatchOutcome;
};

/**
 * A reusable batch of stored/removed/cleared events written into a scratch region of the index's linear
 * memory as they are added; `apply()` runs them in one call, in order, and empties the builder.
 */
export class StoredBatchBuilder {
  private ptr = 0;
  private cap = 0; // bytes
  private at = 0; // bytes used
  private count = 0;
  private buffer: ArrayBuffer | undefined;
  private u64 = new BigUint64Array(0);
  private u32 = new Uint32Array(0);
  private dv = new DataView(new ArrayBuffer(0));

  constructor(private readonly host: BuilderHost) {}

  /** Events added since the last apply. */
  get events(): number {
    return this.count;
  }

  /**
   * A stored event of `blockHashes.length` blocks under `parentHash` (null: at the root). Block i is the
   * engine's blockHashes[i] with its tokens hash: `tokens` is either the tokens hashes (a BigUint64Array,
   * e.g. from a dump, or a bigint[]) or the blocks' token ids (at least blockHashes.length x blockSize of them, with
   * per-block extra keys), hashed here by the index's own module. `copies[i]` (a dump's counts, see
   * StoredBlock) defaults to one copy per block.
   */
  stored(w: WorkerRef, parentHash: BlockHash | null, blockHashes: BigUint64Array | readonly BlockHash[], tokens: BigUint64Array | readonly TokensHash[] | BlockTokens, copies?: Uint32Array | readonly number[]): this {
    const n = blockHashes.length;
    const hashed = !("tokenIds" in tokens);
    if (hashed && tokens.length !== n) throw new RangeError(`stored: ${n} block hashes but ${tokens.length} tokens hashes`);
    if (!hashed && tokens.tokenIds.length < n * this.host.blockSize) throw new RangeError(`stored: ${n} blocks of ${this.host.blockSize} tokens but ${tokens.tokenIds.length} token ids`);
    if (copies !== undefined && copies.length !== n) throw new RangeError(`stored: ${n} blocks but ${copies.length} copy counts`);
    const hasParent = parentHash !== null;
    const slot = this.host.slotOf(w);
    let at = this.room(8 * (1 + (hasParent ? 1 : 0) + (copies ? 3 : 2) * n));
    const kind = copies ? (hasParent ? KIND_STORED_CHILD_COPIES : KIND_STORED_ROOT_COPIES) : hasParent ? KIND_STORED_CHILD : KIND_STORED_ROOT;
    this.header(at, kind, slot, n);
    at += 8;
    if (hasParent) { this.dv.setBigUint64(at, parentHash, true); at += 8; }
    at = this.hashes(at, blockHashes);
    if (hashed) this.hashes(at, tokens);
    else {
      this.host.hasher().hashInto(tokens.tokenIds, this.host.blockSize, n, tokens.extras, at);
      this.views(); // hashing may have grown linear memory
    }
    at += 8 * n;
    if (copies) {
      for (let i = 0; i < n; i++) this.dv.setBigUint64(at + 8 * i, BigInt(checkedCopies(copies[i]!)), true);
      at += 8 * n;
    }
    this.finish(at);
    return this;
  }

  removed(w: WorkerRef, hashes: BigUint64Array | readonly BlockHash[]): this {
    const slot = this.host.slotOf(w);
    const at = this.room(8 * (1 + hashes.length));
    this.header(at, KIND_REMOVED, slot, hashes.length);
    this.finish(this.hashes(at + 8, hashes));
    return this;
  }

  cleared(w: WorkerRef): this {
    if (!this.host.knows(w)) return this; // nothing to clear (and no slot to take)
    const at = this.room(8);
    this.header(at, KIND_CLEARED, this.host.slotOf(w), 0);
    this.finish(at + 8);
    return this;
  }

  /** Applies the events added so far in one call into the module, then empties the builder. */
  apply(): BatchOutcome {
    const words = (this.at - this.ptr) / 8;
    try {
      return this.host.applyWords(this.ptr, words);
    } finally {
      // Also when the module trapped: the events are not sent again with the next batch.
      this.reset();
    }
  }

  /** Why the last stored event of the last apply was rejected; null: it was applied (or there was none). */
  get rejectReason(): RejectReason | null {
    return rejectReasons[this.host.ex.lastRejectReason()] ?? null;
  }

  /** Drops the events added so far without applying them. */
  reset(): void {
    this.at = this.ptr;
    this.count = 0;
  }

  private header(at: number, kind: number, slot: number, n: number): void {
    this.u32[at / 4] = kind | (slot << 8);
    this.u32[at / 4 + 1] = n;
  }

  private hashes(at: number, hs: BigUint64Array | readonly bigint[]): number {
    if (hs instanceof BigUint64Array) {
      this.u64.set(hs, at / 8);
      return at + 8 * hs.length;
    }
    for (const h of hs) { this.dv.setBigUint64(at, h, true); at += 8; }
    return at;
  }

  private finish(at: number): void {
    this.at = at;
    this.count++;
  }

  /** Makes room for `bytes` more and returns where they go; growing copies what is already built. */
  private room(bytes: number): number {
    const used = this.at - this.ptr;
    if (used + bytes > this.cap) {
      const cap = Math.max(used + bytes, this.cap * 2, 64 * 1024);
      const fresh = this.host.ex.reserve(cap); // may grow linear memory: views are refreshed below
      if (this.ptr) {
        new Uint8Array(this.host.ex.memory.buffer).copyWithin(fresh, this.ptr, this.ptr + used);
        this.host.ex.release(this.ptr, this.cap);
      }
      this.ptr = fresh;
      this.cap = cap;
      this.at = fresh + used;
    }
    this.views();
    return this.at;
  }

  /** Whole-memory views, rebuilt after linear memory grew (growth detaches the old buffer). */
  private views(): void {
    if (this.buffer === undefined || this.buffer.byteLength === 0) {
      const buf = this.host.ex.memory.buffer;
      this.buffer = buf;
      this.u64 = new BigUint64Array(buf);
      this.u32 = new Uint32Array(buf);
      this.dv = new DataView(buf);
    }
  }
}
