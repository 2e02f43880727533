import type { BlockHash, RouterEvent, WorkerRef } from "@kv-epp/protocol";

// A batch of parsed JSON `/dump` events in typed arrays: the JSON parser's fast output, which the staging
// feed copies into event runs (EventRunWriter.batchEvent: whole-array copies) instead of one RouterEvent
// object and two BigInts per block. Measured on the 1M-residency bench: building those objects, then the
// index's own events from them, was most of the receiver's cost. The parser reuses one batch: its contents
// are valid only during the batch sink's call.

export class DumpBatch {
  /** Events in the batch. */
  count = 0;
  /** Blocks in the batch (all events). */
  blocks = 0;
  /** The rank of each event; the same object for consecutive events of one rank (a stable identity to cache on). */
  readonly workers: WorkerRef[] = [];
  readonly eventIds: number[] = [];
  /** 1 where event i has a parent (then parentHashes[i] holds it). */
  hasParent = new Uint8Array(256);
  parentHashes = new BigUint64Array(256);
  /** Event i's blocks are [blockStart[i], blockStart[i + 1]) of blockHashes / tokensHashes. */
  blockStart = new Uint32Array(257);
  blockHashes: BigUint64Array;
  tokensHashes: BigUint64Array;
  /** Copies of each block the worker rank holds (1 unless the dump said otherwise). */
  copies: Uint32Array;
  /** True when some block in the batch has copies != 1 (a staging without copy counts can skip the column). */
  hasCopies = false;
  // little-endian u32 halves of the same buffers: the parser writes digits' (hi, lo) without BigInts
  private parent32 = new Uint32Array(this.parentHashes.buffer);
  private block32: Uint32Array;
  private tokens32: Uint32Array;

  constructor(blockCapacity = 16 * 1024) {
    this.blockHashes = new BigUint64Array(blockCapacity);
    this.tokensHashes = new BigUint64Array(blockCapacity);
    this.copies = new Uint32Array(blockCapacity);
    this.block32 = new Uint32Array(this.blockHashes.buffer);
    this.tokens32 = new Uint32Array(this.tokensHashes.buffer);
  }

  /** Event i's parent hash, or null at the root. */
  parentHash(i: number): BlockHash | null {
    return this.hasParent[i] ? this.parentHashes[i]! : null;
  }

  /** Event i as a RouterEvent (for stagings or tests that want objects after all). */
  event(i: number): RouterEvent {
    const w = this.workers[i]!;
    const blocks = [];
    for (let b = this.blockStart[i]!; b < this.blockStart[i + 1]!; b++) {
      const c = this.copies[b]!;
      blocks.push(c === 1 ? { blockHash: this.blockHashes[b]!, tokensHash: this.tokensHashes[b]! } : { blockHash: this.blockHashes[b]!, tokensHash: this.tokensHashes[b]!, copies: c });
    }
    return { workerId: w.workerId, dpRank: w.dpRank, eventId: this.eventIds[i]!, parentHash: this.parentHash(i), blocks };
  }

  // ---- filled by the parser ----

  /** Appends one block of the event being parsed. */
  pushBlock(bHi: number, bLo: number, tHi: number, tLo: number, copies = 1): void {
    const k = this.blocks;
    if (k === this.blockHashes.length) this.growBlocks(k + 1);
    this.copies[k] = copies;
    if (copies !== 1) this.hasCopies = true;
    this.block32[2 * k] = bLo;
    this.block32[2 * k + 1] = bHi;
    this.tokens32[2 * k] = tLo;
    this.tokens32[2 * k + 1] = tHi;
    this.blocks = k + 1;
  }

  /** Closes the event whose blocks were pushed since blockStart[count]. */
  pushEvent(worker: WorkerRef, eventId: number, parent: boolean, pHi: number, pLo: number): void {
    const i = this.count;
    if (i + 1 >= this.hasParent.length) this.growEvents();
    this.workers[i] = worker;
    this.eventIds[i] = eventId;
    this.hasParent[i] = parent ? 1 : 0;
    this.parent32[2 * i] = parent ? pLo : 0;
    this.parent32[2 * i + 1] = parent ? pHi : 0;
    this.count = i + 1;
    this.blockStart[i + 1] = this.blocks;
  }

  /** Blocks pushed for the event being parsed. */
  get openBlocks(): number {
    return this.blocks - this.blockStart[this.count]!;
  }

  /** Drops the blocks of the event being parsed (it went elsewhere). */
  dropOpen(): void {
    this.blocks = this.blockStart[this.count]!;
  }

  clear(): void {
    this.count = 0;
    this.blocks = 0;
    this.hasCopies = false;
    this.workers.length = 0;
    this.eventIds.length = 0;
  }

  private growBlocks(min: number): void {
    const cap = Math.max(min, this.blockHashes.length * 2);
    const b = new BigUint64Array(cap), t = new BigUint64Array(cap);
    const c = new Uint32Array(cap);
    b.set(this.blockHashes.subarray(0, this.blocks));
    t.set(this.tokensHashes.subarray(0, this.blocks));
    c.set(this.copies.subarray(0, this.blocks));
    this.copies = c;
    this.blockHashes = b;
    this.tokensHashes = t;
    this.block32 = new Uint32Array(b.buffer);
    this.tokens32 = new Uint32Array(t.buffer);
  }

  private growEvents(): void {
    const cap = this.hasParent.length * 2;
    const hp = new Uint8Array(cap), ph = new BigUint64Array(cap), bs = new Uint32Array(cap + 1);
    hp.set(this.hasParent);
    ph.set(this.parentHashes);
    bs.set(this.blockStart);
    this.hasParent = hp;
    this.parentHashes = ph;
    this.parent32 = new Uint32Array(ph.buffer);
    this.blockStart = bs;
  }
}
