import { DUMP_EVENT_FLAGS, type RouterEvent, type StoredBlock, type WorkerRef } from "@kv-epp/protocol";
import type { DumpBatch } from "./batch.ts";

// An event run: stored events of one worker rank in the binary `/dump` event layout (docs/CONTRACTS.md §7
// "binary"), little-endian u64 words; per event a header (flags u32 | block count u32), the parent block
// hash when flag hasParent is set, the block hashes, the tokens hashes, and one copy count per block when
// flag hasCopies is set. It is the one form in which a dump's events reach a staging, whichever body they
// came in: a binary body's runs pass through as they are, a JSON body's events are written into one here,
// and KvIndex.applyDumpEvents applies a run inside the module. Typed-array views use the platform's byte
// order, little-endian on every platform Bun runs on (DumpBatch relies on the same).

const { hasParent: HAS_PARENT, hasCopies: HAS_COPIES } = DUMP_EVENT_FLAGS;

/** Builds one run at a time in a buffer it reuses. */
export class EventRunWriter {
  private words = new BigUint64Array(1024);
  private halves = new Uint32Array(this.words.buffer);
  private n = 0;

  /** Words written since the last take(). */
  get length(): number {
    return this.n;
  }

  /** Appends one event. */
  event(e: RouterEvent): void {
    const blocks = e.blocks;
    const count = blocks.length;
    const copies = blocks.some((b) => b.copies !== undefined && b.copies !== 1);
    const at = this.header(e.parentHash, count, copies);
    const words = this.words;
    for (let b = 0; b < count; b++) {
      words[at + b] = blocks[b]!.blockHash;
      words[at + count + b] = blocks[b]!.tokensHash;
    }
    if (copies) for (let b = 0; b < count; b++) this.u32Word(at + 2 * count + b, blocks[b]!.copies ?? 1);
  }

  /** Appends event i of a parsed batch (its hashes copied as whole arrays). */
  batchEvent(batch: DumpBatch, i: number): void {
    const from = batch.blockStart[i]!, to = batch.blockStart[i + 1]!;
    const count = to - from;
    let copies = false;
    if (batch.hasCopies) for (let b = from; b < to && !copies; b++) copies = batch.copies[b] !== 1;
    const at = this.header(batch.parentHash(i), count, copies);
    this.words.set(batch.blockHashes.subarray(from, to), at);
    this.words.set(batch.tokensHashes.subarray(from, to), at + count);
    if (copies) for (let b = 0; b < count; b++) this.u32Word(at + 2 * count + b, batch.copies[from + b]!);
  }

  /** The run written since the last take(), as bytes; valid until the next write. */
  take(): Uint8Array {
    const run = new Uint8Array(this.words.buffer, 0, this.n * 8);
    this.n = 0;
    return run;
  }

  /** Writes an event's header (and parent); returns the word its block hashes start at. */
  private header(parent: bigint | null, count: number, copies: boolean): number {
    const need = 2 + count * (copies ? 3 : 2);
    if (this.n + need > this.words.length) this.grow(this.n + need);
    const at = this.n;
    this.halves[2 * at] = (parent !== null ? HAS_PARENT : 0) | (copies ? HAS_COPIES : 0);
    this.halves[2 * at + 1] = count;
    let next = at + 1;
    if (parent !== null) this.words[next++] = parent;
    this.n = next + count * (copies ? 3 : 2);
    return next;
  }

  private u32Word(at: number, v: number): void {
    this.halves[2 * at] = v;
    this.halves[2 * at + 1] = 0;
  }

  private grow(min: number): void {
    const words = new BigUint64Array(Math.max(min, this.words.length * 2));
    words.set(this.words.subarray(0, this.n));
    this.words = words;
    this.halves = new Uint32Array(words.buffer);
  }
}

/** A run's events as RouterEvents, numbered from `firstEventId` (for stagings and tests that want objects). */
export function runEvents(worker: WorkerRef, run: Uint8Array, firstEventId = 0): RouterEvent[] {
  const v = new DataView(run.buffer, run.byteOffset, run.byteLength);
  const words = run.byteLength / 8;
  const out: RouterEvent[] = [];
  let eventId = firstEventId;
  for (let i = 0; i < words; ) {
    const flags = v.getUint32(i * 8, true), count = v.getUint32(i * 8 + 4, true);
    i++;
    let parentHash: bigint | null = null;
    if (flags & HAS_PARENT) parentHash = v.getBigUint64(8 * i++, true);
    const copies = (flags & HAS_COPIES) !== 0;
    const blocks: StoredBlock[] = [];
    for (let b = 0; b < count; b++) {
      const block: StoredBlock = { blockHash: v.getBigUint64(8 * (i + b), true), tokensHash: v.getBigUint64(8 * (i + count + b), true) };
      if (copies) {
        const c = v.getUint32(8 * (i + 2 * count + b), true);
        if (c !== 1) block.copies = c;
      }
      blocks.push(block);
    }
    i += count * (copies ? 3 : 2);
    out.push({ workerId: worker.workerId, dpRank: worker.dpRank, eventId: eventId++, parentHash, blocks });
  }
  return out;
}
