// The TypeScript face of the WebAssembly index: maps workers to small slots, encodes events into linear
// memory (u64 words written through BigUint64Array views, never through JS numbers) and decodes results.
import { instantiate, ScratchRegion, type IndexExports } from "./wasm-module.ts";
import { StoredBatchBuilder } from "./batch-builder.ts";
import { BlockHasher, fullBlocks, type BlockTokens } from "./block-hash.ts";
import type { MatchList } from "./match-list.ts";
import { DUMP_JSON_CHUNK_BYTES, DUMP_JSON_DP_RANK, DUMP_JSON_EVENT_ID, DUMP_JSON_WORKER, workerKey } from "@kv-epp/protocol";
import type { BatchOutcome, DumpEvent, IndexStats, StoredBlock, WorkerRef } from "./types.ts";
import {
  ROW_BYTES, ROW_COPIES, ROW_FLAGS, ROW_HAS_PARENT, ROW_HASH, ROW_NEW_EVENT, ROW_PARENT, ROW_TOKENS, STATE_BYTES,
  STATE_EVENT_ID, STATE_FLAGS, STATE_INSIDE, STATE_LEN, STATE_POS, STATE_PREFIX, STATE_PREFIX_LEN, STATE_ROWS,
  STATE_SUFFIX, STATE_SUFFIX_LEN, STATE_WROTE,
} from "../assembly/dump-layout.ts";

/** Worker slots are 12 bits inside the module (slot 4095 marks free records). */
const MAX_WORKERS = 4095;

const jsonEncoder = new TextEncoder();

/** Presizing beyond this (ids are 26-bit, less a chunk) cannot be honoured by the module. */
const MAX_PRESIZE = 1 << 25;
/** The most residencies `reserve` sizes the tables for (the index's id limit). */
export const MAX_RESERVE = MAX_PRESIZE;

/**
 * Thrown by every call on an index whose module trapped earlier (e.g. linear memory that could not
 * grow): a trap can stop an operation halfway, so the index's state is no longer trusted.
 */
export class IndexTrappedError extends Error {
  override name = "IndexTrappedError";
}


export class KvIndex {
  readonly blockSize: number;
  private readonly ex: IndexExports;
  /** The module's trap, once it trapped: checked where calls enter the module (apply, clear, match, reads). */
  private trap: unknown;
  private readonly events: ScratchRegion;
  private readonly query: ScratchRegion;
  private readonly matches: ScratchRegion;
  private readonly slots = new Map<string, number>();
  private readonly keys: (string | undefined)[] = [];
  private readonly refs: (WorkerRef | undefined)[] = [];
  private readonly freeSlots: number[] = [];

  private constructor(blockSize: number, expected?: { blocks: number; residencies: number }) {
    this.blockSize = blockSize;
    this.ex = instantiate();
    if (expected) {
      for (const n of [expected.blocks, expected.residencies])
        if (!Number.isInteger(n) || n < 0 || n > MAX_PRESIZE) throw new RangeError(`expected sizes must be integers in 0..${MAX_PRESIZE}, got ${n}`);
      this.ex.presize(expected.blocks, expected.residencies);
    }
    this.events = new ScratchRegion(this.ex);
    this.query = new ScratchRegion(this.ex);
    this.matches = new ScratchRegion(this.ex);
  }

  /** True once the module trapped: every later call throws IndexTrappedError; replace the index. */
  get trapped(): boolean {
    return this.trap !== undefined;
  }

  /** Refuses to enter a module that trapped earlier. */
  private assertLive(): void {
    if (this.trap !== undefined) throw new IndexTrappedError(`index-wasm: this index trapped earlier (${String(this.trap)}); replace it`);
  }

  /** Remembers a trap on its way out. */
  private noteTrap(err: unknown): never {
    if (err instanceof WebAssembly.RuntimeError) this.trap = err;
    throw err;
  }

  /** `expected` sizes the tables up front (e.g. from a dump's size) instead of growing them by doubling. */
  static create(opts: { blockSize: number; expected?: { blocks: number; residencies: number } }): KvIndex {
    return new KvIndex(opts.blockSize, opts.expected);
  }

  /**
   * Slot per WorkerRef object, checked against the ref's fields and the slot's generation (bumped by
   * removeWorker): measured, building the key string per event was ~10% of batch-builder ingestion.
   */
  private readonly refCache = new WeakMap<WorkerRef, { slot: number; gen: number; workerId: string; dpRank: number }>();
  private readonly slotGen: number[] = [];

  private slotOf(w: WorkerRef): number {
    const c = this.refCache.get(w);
    if (c !== undefined && c.gen === this.slotGen[c.slot] && c.workerId === w.workerId && c.dpRank === w.dpRank) return c.slot;
    const slot = this.slotByKey(w);
    this.refCache.set(w, { slot, gen: (this.slotGen[slot] ??= 0), workerId: w.workerId, dpRank: w.dpRank });
    return slot;
  }

  private slotByKey(w: WorkerRef): number {
    const key = workerKey(w);
    let slot = this.slots.get(key);
    if (slot === undefined) {
      slot = this.freeSlots.pop() ?? this.keys.length;
      if (slot >= MAX_WORKERS) throw new RangeError(`index-wasm: more than ${MAX_WORKERS} workers`);
      this.slots.set(key, slot);
      this.keys[slot] = key;
      this.refs[slot] = { workerId: w.workerId, dpRank: w.dpRank };
    }
    return slot;
  }

  private viewBuffer: ArrayBuffer | undefined;
  private u32 = new Uint32Array(0);
  private u64 = new BigUint64Array(0);

  /**
   * Whole-memory views, rebuilt only after linear memory grew (growth detaches the old buffer): making
   * views per call measured as a large share of a findMatches.
   */
  private views(): void {
    if (this.viewBuffer === undefined || this.viewBuffer.byteLength === 0) {
      const buf = this.ex.memory.buffer;
      this.viewBuffer = buf;
      this.u32 = new Uint32Array(buf);
      this.u64 = new BigUint64Array(buf);
    }
  }

  private words(ptr: number, count: number): BigUint64Array {
    this.views();
    return this.u64.subarray(ptr / 8, ptr / 8 + count);
  }

  private builder: StoredBatchBuilder | undefined;

  /**
   * This index's batch builder (one per index, reused): the one way events get in. Events added from
   * typed arrays or token ids are written straight into linear memory, `apply()` runs them in one call.
   */
  batch(): StoredBatchBuilder {
    this.builder ??= new StoredBatchBuilder({
      ex: this.ex,
      blockSize: this.blockSize,
      hasher: () => this.hasher(),
      slotOf: (w) => this.slotOf(w),
      knows: (w) => this.slots.has(workerKey(w)),
      applyWords: (ptr, words) => this.applyWords(ptr, words),
    });
    return this.builder;
  }

  private blockHasher: BlockHasher | undefined;

  /** Hashes blocks inside this index's own module instance (batches, queries). */
  private hasher(): BlockHasher {
    return (this.blockHasher ??= new BlockHasher(this.ex));
  }

  private applyWords(ptr: number, words: number): BatchOutcome {
    this.assertLive();
    try {
      this.ex.applyBatch(ptr, words);
    } catch (err) {
      return this.noteTrap(err);
    }
    return { events: this.ex.batchEvents(), blocks: this.ex.batchBlocks(), unknown: this.ex.batchUnknown(), rejected: this.ex.batchRejected() };
  }

  /**
   * Sizes the tables for a pool whose caches together hold up to `residencies` blocks (the sum of its
   * ranks' num_gpu_blocks): as they fill, and as a full pool churns, no table grows, so ingestion never
   * stops for a growth. Only grows (a smaller figure is a no-op); the tables' memory is taken (and
   * written) at once. Clamped to MAX_RESERVE. False, with the index unchanged, when the host refuses
   * the memory.
   */
  reserve(residencies: number): boolean {
    if (!Number.isInteger(residencies) || residencies < 0) throw new RangeError(`reserve: residencies must be a non-negative integer, got ${residencies}`);
    this.assertLive();
    try {
      return this.ex.reserveTables(Math.min(residencies, MAX_RESERVE)) !== 0;
    } catch (err) {
      return this.noteTrap(err);
    }
  }

  clearWorker(w: WorkerRef): void {
    const slot = this.slots.get(workerKey(w));
    if (slot !== undefined) this.clearSlot(slot);
  }

  private clearSlot(slot: number): void {
    this.assertLive();
    try {
      this.ex.clearWorker(slot);
    } catch (err) {
      this.noteTrap(err);
    }
  }

  removeWorker(w: WorkerRef): void {
    const key = workerKey(w);
    const slot = this.slots.get(key);
    if (slot === undefined) return;
    this.clearSlot(slot);
    this.slots.delete(key);
    this.keys[slot] = undefined;
    this.refs[slot] = undefined;
    this.slotGen[slot] = (this.slotGen[slot] ?? 0) + 1;
    this.freeSlots.push(slot);
  }

  /**
   * The workers holding a prefix of the query: fills `out` (reused across calls: nothing is allocated)
   * with each matched worker, its score (the number of leading query blocks it holds, >= 1) and its tree
   * size, in the module's order, and returns how many. The query is the blocks' tokens hashes, or their
   * token ids (with extra keys), hashed by this index's own module (the partial tail is not a block).
   */
  findMatchesInto(query: BigUint64Array | BlockTokens, out: MatchList): number {
    const [count, pairs, sizes] = this.match(query);
    out.reserve(count);
    const u32 = this.u32, keys = this.keys, refs = this.refs;
    for (let i = 0; i < count; i++) {
      const slot = u32[pairs + 2 * i]!;
      out.keys[i] = keys[slot]!;
      out.workers[i] = refs[slot]!;
      out.scores[i] = u32[pairs + 2 * i + 1]!;
      out.treeSizes[i] = u32[sizes + slot]!;
    }
    out.count = count;
    return count;
  }

  private readonly matchOut: [count: number, pairs: number, sizes: number] = [0, 0, 0];

  /** Runs the query; returns (count, u32 index of the (slot, overlap) pairs, u32 index of tree sizes). */
  private match(query: BigUint64Array | BlockTokens): [count: number, pairs: number, sizes: number] {
    this.assertLive();
    try {
      return this.runMatch(query);
    } catch (err) {
      return this.noteTrap(err);
    }
  }

  private runMatch(query: BigUint64Array | BlockTokens): [count: number, pairs: number, sizes: number] {
    const hashed = query instanceof BigUint64Array;
    const n = hashed ? query.length : fullBlocks(query.tokenIds.length, this.blockSize);
    const qPtr = this.query.ensure(Math.max(n, 1) * 8);
    const outPtr = this.matches.ensure(this.ex.workerCapacity() * 8);
    if (hashed) {
      this.views();
      this.u64.set(query, qPtr / 8);
    } else this.hasher().hashInto(query.tokenIds, this.blockSize, n, query.extras, qPtr);
    const r = this.matchOut;
    r[0] = this.ex.findMatches(qPtr, n, outPtr);
    this.views();
    r[1] = outPtr / 4;
    r[2] = this.ex.treeSizes() / 4;
    return r;
  }

  /** Blocks the worker holds in this index. */
  treeSize(w: WorkerRef): number {
    this.assertLive();
    const slot = this.slots.get(workerKey(w));
    if (slot === undefined) return 0;
    this.views();
    return this.u32[this.ex.treeSizes() / 4 + slot]!;
  }

  /**
   * Stored events that rebuild this index, one worker at a time, parents before children. Each worker's
   * blocks are copied out of linear memory when the iterator reaches that worker, so the index may keep
   * changing while a dump streams; nothing beyond one worker's blocks is held at once. `onSnapshot(w)` is
   * called in the same synchronous step as w's copy, so state kept beside the index (a stream cursor) can
   * be read exactly as of the blocks dumped; a worker removed before the iterator reaches it is skipped.
   */
  *dump(opts: { onSnapshot?: (w: WorkerRef) => void } = {}): Iterable<DumpEvent> {
    this.assertLive();
    const order = [...this.slots.entries()];
    try {
      yield* this.dumpEvents(order, opts.onSnapshot);
    } finally {
      this.ex.dumpCacheRelease();
    }
  }

  private *dumpEvents(order: [string, number][], onSnapshot?: (w: WorkerRef) => void): Generator<DumpEvent> {
    for (const [key, slot] of order) {
      if (this.slots.get(key) !== slot) continue; // removed meanwhile
      const worker = this.refs[slot]!;
      onSnapshot?.(worker);
      const ptr = this.ex.dumpWorker(slot);
      const len = this.ex.dumpLength();
      const rows = this.words(ptr, len * (ROW_BYTES / 8)).slice();
      this.ex.release(ptr, Math.max(len, 1) * ROW_BYTES);
      const flagWords = new Uint32Array(rows.buffer);
      let current: DumpEvent | null = null;
      for (let i = 0; i < len; i++) {
        const r = i * (ROW_BYTES / 8), r32 = i * (ROW_BYTES / 4);
        const parentExt = rows[r + ROW_PARENT / 8]!, blockHash = rows[r + ROW_HASH / 8]!, tokensHash = rows[r + ROW_TOKENS / 8]!;
        const flags = flagWords[r32 + ROW_FLAGS / 4]!, copies = flagWords[r32 + ROW_COPIES / 4]!;
        const block: StoredBlock = copies === 1 ? { blockHash, tokensHash } : { blockHash, tokensHash, copies };
        if (current && (flags & ROW_NEW_EVENT) === 0) current.blocks.push(block);
        else {
          if (current) yield current;
          current = { worker, parentHash: flags & ROW_HAS_PARENT ? parentExt : null, blocks: [block] };
        }
      }
      if (current) yield current;
    }
  }

  /**
   * The same events as dump(), as the JSON RouterEvents of the recovery `/dump` body:
   * `{"worker_id":..,"event":{"event_id":n,"data":{"stored":{"parent_hash":h|null,"blocks":[{"block_hash":h,
   * "tokens_hash":t},..]}}},"dp_rank":r}` (a block whose copies are not 1 ends `,"copies":n}`), compact, separated by commas, without the enclosing brackets,
   * event ids numbered from `firstEventId` (default 0) in order. Written by the module straight from each
   * worker's snapshot (measured ~3x less CPU than dump() plus the TypeScript writer at 1M residencies). Chunks of
   * about `chunkBytes` (default 256 KiB; a chunk may run a few hundred bytes past it), each a fresh copy the
   * caller keeps. Same snapshot rules as dump(): a worker is copied when the iterator reaches it, so the
   * index may change between chunks; at most one worker's blocks (32 bytes each) are held at once.
   * `onSnapshot`: as for dump().
   */
  *dumpJsonChunks(opts: { chunkBytes?: number; firstEventId?: number; onSnapshot?: (w: WorkerRef) => void } = {}): Generator<Uint8Array> {
    this.assertLive();
    const chunkBytes = Math.max(1, Math.floor(opts.chunkBytes ?? DUMP_JSON_CHUNK_BYTES));
    const firstEventId = opts.firstEventId ?? 0;
    if (!Number.isSafeInteger(firstEventId) || firstEventId < 0) throw new RangeError(`firstEventId must be a non-negative safe integer`);
    const ex = this.ex;
    const order = [...this.slots.entries()];
    // state (STATE_BYTES, assembly/dump-layout.ts) then the worker's prefix/suffix; output buffer separately (chunk + one step + 16 B slack)
    let stPtr = 0, stBytes = 0, outPtr = 0, outBytes = 0, rows = 0, rowsBytes = 0;
    const release = () => {
      if (rows) ex.release(rows, rowsBytes);
      rows = 0;
    };
    try {
      let eventId = firstEventId;
      let wrote = false;
      let o = 0; // bytes pending in the output buffer
      for (const [key, slot] of order) {
        if (this.slots.get(key) !== slot) continue; // removed meanwhile
        const worker = this.refs[slot]!;
        const prefix = jsonEncoder.encode(DUMP_JSON_WORKER + JSON.stringify(worker.workerId) + DUMP_JSON_EVENT_ID);
        const suffix = jsonEncoder.encode(`${DUMP_JSON_DP_RANK}${worker.dpRank}}`);
        const step = prefix.length + suffix.length + 256;
        // room: a pending chunk is handed out before any buffer is re-reserved
        if (STATE_BYTES + prefix.length + suffix.length > stBytes || chunkBytes + step > outBytes) {
          if (o > 0) { yield this.bytesAt(outPtr, o); o = 0; }
          if (STATE_BYTES + prefix.length + suffix.length > stBytes) {
            if (stPtr) ex.release(stPtr, stBytes);
            stBytes = Math.max(256, 2 * (STATE_BYTES + prefix.length + suffix.length));
            stPtr = ex.reserve(stBytes);
          }
          if (chunkBytes + step > outBytes) {
            if (outPtr) ex.release(outPtr, outBytes);
            outBytes = chunkBytes + 2 * step;
            outPtr = ex.reserve(outBytes);
          }
        }
        if (this.slots.get(key) !== slot) continue; // removed while the chunk above was out
        opts.onSnapshot?.(worker);
        rows = ex.dumpWorker(slot);
        const len = ex.dumpLength();
        rowsBytes = Math.max(len, 1) * ROW_BYTES;
        if (len > 0) {
          this.views();
          const u32 = this.u32, u8 = new Uint8Array(ex.memory.buffer);
          const at = (field: number) => (stPtr + field) / 4; // a u32 field of the state
          const strings = stPtr + STATE_BYTES;
          u32[at(STATE_ROWS)] = rows; u32[at(STATE_LEN)] = len; u32[at(STATE_POS)] = 0; u32[at(STATE_FLAGS)] = wrote ? STATE_WROTE : 0;
          u32[at(STATE_EVENT_ID)] = eventId % 2 ** 32; u32[at(STATE_EVENT_ID) + 1] = Math.floor(eventId / 2 ** 32);
          u32[at(STATE_PREFIX)] = strings; u32[at(STATE_PREFIX_LEN)] = prefix.length;
          u32[at(STATE_SUFFIX)] = strings + prefix.length; u32[at(STATE_SUFFIX_LEN)] = suffix.length;
          u8.set(prefix, strings);
          u8.set(suffix, strings + prefix.length);
          for (;;) {
            o = ex.dumpJson(stPtr, outPtr + o, outPtr + chunkBytes) - outPtr;
            this.views();
            const done = this.u32[at(STATE_POS)] === len && (this.u32[at(STATE_FLAGS)]! & STATE_INSIDE) === 0;
            if (o >= chunkBytes) { yield this.bytesAt(outPtr, o); o = 0; }
            if (done) break;
          }
          eventId = this.u32[at(STATE_EVENT_ID)]! + this.u32[at(STATE_EVENT_ID) + 1]! * 2 ** 32;
          wrote = true;
        }
        release();
      }
      if (o > 0) yield this.bytesAt(outPtr, o);
    } finally {
      release();
      if (stPtr) ex.release(stPtr, stBytes);
      if (outPtr) ex.release(outPtr, outBytes);
      ex.dumpCacheRelease();
    }
  }

  /**
   * The same blocks as dump(), in the binary `/dump` layout (docs/CONTRACTS.md §7, "binary"): for each
   * worker with blocks, its WorkerRef, then chunks of about `chunkBytes` (one event may make a chunk
   * larger) holding whole stored events as little-endian u64 words: a header (flags | count << 32; flag
   * 1: a parent block hash follows, flag 2: count copy words follow the hashes), the count block
   * hashes, the count tokens hashes. Written by the module from each worker's snapshot, as for
   * dumpJsonChunks (same snapshot rules, same `onSnapshot`); `applyDumpEvents` reads them back.
   */
  *dumpBinaryChunks(opts: { chunkBytes?: number; onSnapshot?: (w: WorkerRef) => void } = {}): Generator<WorkerRef | Uint8Array> {
    this.assertLive();
    const chunkBytes = Math.max(64, Math.floor(opts.chunkBytes ?? DUMP_JSON_CHUNK_BYTES));
    const ex = this.ex;
    const order = [...this.slots.entries()];
    let outPtr = 0, outBytes = 0, rows = 0, rowsBytes = 0;
    const release = () => {
      if (rows) ex.release(rows, rowsBytes);
      rows = 0;
    };
    try {
      for (const [key, slot] of order) {
        if (this.slots.get(key) !== slot) continue; // removed meanwhile
        const worker = this.refs[slot]!;
        opts.onSnapshot?.(worker);
        rows = ex.dumpWorker(slot);
        const len = ex.dumpLength();
        rowsBytes = Math.max(len, 1) * ROW_BYTES;
        if (len > 0) yield worker;
        let pos = 0;
        while (pos < len) {
          if (outBytes < chunkBytes) {
            if (outPtr) ex.release(outPtr, outBytes);
            outBytes = chunkBytes;
            outPtr = ex.reserve(outBytes);
          }
          pos = ex.dumpBinary(rows, len, pos, outPtr, outPtr + outBytes);
          const end = ex.dumpBinaryEnd();
          if (end > outPtr) yield this.bytesAt(outPtr, end - outPtr);
          else if (pos < len) {
            // one event larger than the buffer: a buffer of its size (kept for the rest of the dump)
            const need = ex.dumpBinaryNeed();
            ex.release(outPtr, outBytes);
            outBytes = need;
            outPtr = ex.reserve(outBytes);
          }
        }
        release();
      }
    } finally {
      release();
      if (outPtr) ex.release(outPtr, outBytes);
      ex.dumpCacheRelease();
    }
  }

  /**
   * Applies one worker's stored events in the binary `/dump` layout (see dumpBinaryChunks), in one call
   * into the module: no block passes through JavaScript. The words are checked whole first: a malformed
   * run (unknown flags, a count past its end, a length not a multiple of 8) applies nothing and throws.
   */
  applyDumpEvents(w: WorkerRef, bytes: Uint8Array): BatchOutcome {
    this.assertLive();
    if (bytes.length % 8 !== 0) throw new RangeError(`malformed dump events: ${bytes.length} bytes is not a whole number of u64 words`);
    const slot = this.slotOf(w);
    let bad: number;
    try {
      const ptr = this.events.ensure(Math.max(bytes.length, 8));
      new Uint8Array(this.ex.memory.buffer, ptr, bytes.length).set(bytes);
      bad = this.ex.applyDump(ptr, bytes.length / 8, slot) >>> 0; // a u32 comes back as an i32
    } catch (err) {
      return this.noteTrap(err);
    }
    if (bad !== 0xffffffff) throw new RangeError(`malformed dump events: event header at word ${bad} (unknown flags, or words past the end)`);
    return { events: this.ex.batchEvents(), blocks: this.ex.batchBlocks(), unknown: this.ex.batchUnknown(), rejected: this.ex.batchRejected() };
  }

  /** A copy of linear memory [ptr, ptr + n): the module's buffer is reused and may move when memory grows. */
  private bytesAt(ptr: number, n: number): Uint8Array {
    return new Uint8Array(this.ex.memory.buffer, ptr, n).slice();
  }

  stats(): IndexStats {
    this.assertLive();
    return {
      blocks: this.ex.blocks(),
      residencies: this.ex.residencies(),
      workers: this.slots.size,
      bytes: this.ex.memory.buffer.byteLength,
      bytesInUse: this.ex.bytesInUse(),
      tableRebuilds: this.ex.tableRebuilds(),
      rejected: Number(this.ex.rejectedTotal()),
      unknownRemovals: Number(this.ex.unknownTotal()),
    };
  }

  workers(): WorkerRef[] {
    return [...this.slots.values()].map((slot) => this.refs[slot]!);
  }
}
