import { DUMP_FIELDS as D, DUMP_JSON_BLOCK, DUMP_JSON_COPIES, DUMP_JSON_TOKENS, decodeEpoch, type RouterEvent, type StoredBlock, type StreamCursor, type WorkerRef } from "@kv-epp/protocol";
import { DumpBatch } from "./batch.ts";
import { type JsonHandler, JsonSyntaxError, JsonTokenizer, scanU64, type U64Parts } from "./json-tokenizer.ts";

// Streaming `/dump` parser: bytes in, RouterEvents out as soon as each event's closing brace arrives. Memory
// is bounded by one event (plus, only if a producer put "events" before "block_size", a bounded buffer).
// Unknown keys are skipped so a newer producer can add fields; an event kind other than `stored` is refused,
// since a snapshot that needs removals to be applied in order cannot be applied by this consumer.

export class DumpFormatError extends Error {
  constructor(message: string, readonly offset: number) {
    super(message);
    this.name = "DumpFormatError";
  }
}

/** The body passed `maxBytes`: not malformed, more than this reader accepts. */
export class DumpTooLargeError extends DumpFormatError {
  override name = "DumpTooLargeError";
}

export type DumpParserLimits = {
  /** Total body bytes accepted (default 4 GiB). */
  maxBytes: number;
  /** Blocks in one event (default 1,048,576): one event is held in memory while it is parsed. */
  maxEventBlocks: number;
  /** Blocks held while "events" precedes "block_size" in a model object (default 65,536). */
  maxBufferedBlocks: number;
  maxStringBytes: number;
  maxDepth: number;
  /** Bytes of one frame of a binary dump (default 32 MiB: one event of maxEventBlocks blocks with copies fits). */
  maxFrameBytes: number;
};

export const DEFAULT_PARSER_LIMITS: DumpParserLimits = {
  maxBytes: 4 * 1024 ** 3,
  maxEventBlocks: 1 << 20,
  maxBufferedBlocks: 1 << 16,
  maxStringBytes: 64 * 1024,
  maxDepth: 64,
  maxFrameBytes: 32 * 1024 * 1024,
};

export type DumpSink = (key: string, blockSize: number, e: RouterEvent) => void;
/** Receives a reused DumpBatch: its contents are valid only during the call. */
export type DumpBatchSink = (key: string, blockSize: number, batch: DumpBatch) => void;

/**
 * The typed fast path: events whose model's block_size is known go to `sink` in batches of up to `events`
 * events or `blocks` blocks (and at the end of each model), instead of one RouterEvent each. Events that
 * precede their model's block_size still go to the object sink, in order, before any batch of that model.
 */
export type DumpBatchOptions = { sink: DumpBatchSink; events?: number; blocks?: number };
/** Receives a model's `cursors`, whole, when its array closes. */
export type DumpCursorSink = (key: string, cursors: StreamCursor[]) => void;
/** Receives a model's `adapters` (LoRA adapter names its producer learned), whole. */
export type DumpAdapterSink = (key: string, names: string[]) => void;

/**
 * `acceptModel(key)`: false skips that model's whole object at the token level (no event is built, nothing
 * reaches a sink, its key is not remembered), so a dump full of models this replica does not serve costs
 * parsing time only, never memory.
 */
export type DumpParserOptions = { acceptModel?: (key: string) => boolean; adapters?: DumpAdapterSink };
const EMPTY_BLOCKS: StoredBlock[] = [];

const enum F {
  None, Model, BlockSize, Events, WorkerId, DpRank, Event, EventId, Data, Stored, Parent, Blocks, BlockHash, TokensHash, Skip,
  Copies, Cursors, Cursor, Seq, Baseline, Complete, Epoch, Adapters,
}

const enc = new TextEncoder();
type KeyTable = { bytes: Uint8Array; field: F }[];
function keys(...entries: [string, F][]): KeyTable {
  return entries.map(([k, field]) => ({ bytes: enc.encode(k), field }));
}
// Keys valid at each depth of the fixed shape (depth = number of open containers when the key is read).
const KEYS_BY_DEPTH: (KeyTable | undefined)[] = [];
KEYS_BY_DEPTH[2] = keys([D.blockSize, F.BlockSize], [D.events, F.Events], [D.cursors, F.Cursors], [D.adapters, F.Adapters]);
// depth 4 is an event or, inside "cursors", a cursor: key() keeps only the fields of the one it is in
KEYS_BY_DEPTH[4] = keys([D.workerId, F.WorkerId], [D.dpRank, F.DpRank], [D.event, F.Event], [D.seq, F.Seq], [D.baseline, F.Baseline], [D.complete, F.Complete], [D.epoch, F.Epoch]);
KEYS_BY_DEPTH[5] = keys([D.eventId, F.EventId], [D.data, F.Data]);
KEYS_BY_DEPTH[7] = keys([D.parentHash, F.Parent], [D.blocks, F.Blocks]);
KEYS_BY_DEPTH[9] = keys([D.blockHash, F.BlockHash], [D.tokensHash, F.TokensHash], [D.copies, F.Copies]);
const CURSOR_ONLY = new Set([F.Seq, F.Baseline, F.Complete, F.Epoch]);
const STORED = enc.encode(D.stored);
// The exact block shape our writer emits; anything else (whitespace, key order, a chunk boundary) takes the
// general path. Measured: this shape is ~90% of a dump's bytes, and the general path spends 10 tokens on it.
const BLOCK_HEAD = enc.encode(DUMP_JSON_BLOCK);
const BLOCK_MID = enc.encode(DUMP_JSON_TOKENS);
const BLOCK_COPIES = enc.encode(DUMP_JSON_COPIES);
/** Cursors in one model (one per worker rank; a bound on what a hostile body can make us hold). */
const MAX_CURSORS = 1 << 16;
/** Adapter names in one model (same reason). */
const MAX_ADAPTERS = 1 << 16;

/**
 * A cursor's epoch from its UTF-8 bytes (JSON and binary alike). One this release cannot read (empty, longer than
 * MAX_EPOCH_BYTES, not UTF-8) is none: the handoff then decides that rank by its seq alone, as for a publisher
 * without epochs, rather than the whole dump failing on it (a peer of a later release may allow longer ones).
 */
export function readEpoch(b: Uint8Array): string | null {
  return decodeEpoch(b) ?? null;
}

function bytesAt(pattern: Uint8Array, buf: Uint8Array, i: number): boolean {
  if (i + pattern.length > buf.length) return false;
  for (let k = 0; k < pattern.length; k++) if (buf[i + k] !== pattern[k]) return false;
  return true;
}

function sameBytes(a: Uint8Array, buf: Uint8Array, start: number, end: number): boolean {
  if (a.length !== end - start) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== buf[start + i]) return false;
  return true;
}

const TWO32 = 4294967296;
const u64View = new DataView(new ArrayBuffer(8));
function toBigInt(hi: number, lo: number): bigint {
  if (hi < 0x200000) return BigInt(hi * TWO32 + lo); // below 2^53: one exact conversion
  u64View.setUint32(0, hi);
  u64View.setUint32(4, lo);
  return u64View.getBigUint64(0);
}

class DumpAssembler implements JsonHandler {
  private depth = 0;
  private field = F.None;
  private skip = 0;
  private readonly utf8 = new TextDecoder("utf-8", { fatal: true });

  private modelKey = "";
  /** Accepted models only: bounded by the models this replica serves, whatever the dump holds. */
  private readonly modelKeys = new Set<string>();
  skippedModels = 0;
  private blockSize = -1;
  private buffered: RouterEvent[] = [];
  private bufferedBlocks = 0;

  private workerId: string | null = null;
  private lastWorkerBytes = new Uint8Array(0);
  private lastWorkerId = "";
  private lastWorker: WorkerRef = { workerId: "", dpRank: -1 };
  private dpRank = -1;
  private eventId = -1;
  /** 0: not seen, 1: null, 2: a hash in (pHi, pLo) */
  private parentKind = 0;
  private pHi = 0;
  private pLo = 0;
  /** Object mode: the event's blocks; typed mode: EMPTY_BLOCKS once "blocks" was seen (they go to the batch). */
  private blocks: StoredBlock[] | null = null;
  private sawStored = false;
  private bhSet = false;
  private bhHi = 0;
  private bhLo = 0;
  private thSet = false;
  private thHi = 0;
  private thLo = 0;
  private copies = 1;

  /** Inside a model's "cursors" array; the cursor being read (seq/baseline: 0 unset, 1 null, 2 a value). */
  private inCursors = false;
  private cursors: StreamCursor[] = [];
  private seqKind = 0;
  private seqValue = 0n;
  private baselineKind = 0;
  private baselineValue = 0n;
  private complete: boolean | null = null;
  private epoch: string | null = null;
  /** Inside a model's "adapters" array. */
  private inAdapters = false;
  private adapters: string[] = [];

  events = 0;
  private readonly parts: U64Parts = { hi: 0, lo: 0 };

  private readonly batch: DumpBatch | null;
  private readonly batchEvents: number;
  private readonly batchBlocks: number;

  constructor(
    private readonly sink: DumpSink,
    private readonly limits: DumpParserLimits,
    private readonly where: () => number,
    private readonly batchOpts: DumpBatchOptions | null,
    private readonly cursorSink: DumpCursorSink | null,
    private readonly acceptModel: ((key: string) => boolean) | undefined,
    private readonly adapterSink: DumpAdapterSink | undefined,
  ) {
    this.batch = batchOpts ? new DumpBatch() : null;
    this.batchEvents = batchOpts?.events ?? 256;
    this.batchBlocks = batchOpts?.blocks ?? 16 * 1024;
  }

  /** Hands the pending batch to the batch sink (at each model's end and at the end of the body). */
  flush(): void {
    const b = this.batch;
    if (b === null || b.count === 0) return;
    this.batchOpts!.sink(this.modelKey, this.blockSize, b);
    b.clear();
  }

  private fail(msg: string): never {
    throw new DumpFormatError(`malformed dump: ${msg} at byte ${this.where()}`, this.where());
  }

  private decode(buf: Uint8Array, start: number, end: number): string {
    try {
      return this.utf8.decode(buf.subarray(start, end));
    } catch {
      this.fail("invalid UTF-8 in a string");
    }
  }

  /** What the next value is: array items take their meaning from the array, object values from their key. */
  private valueField(): F {
    if (this.skip > 0) return F.Skip;
    if (this.depth === 3) return this.inCursors ? F.Cursor : this.inAdapters ? F.Adapters : F.Event;
    if (this.depth === 8) return F.Blocks;
    return this.field;
  }

  startObject(): void {
    const f = this.valueField();
    if (f === F.Skip) {
      this.skip++;
      return;
    }
    if (this.depth === 0) {
      this.depth = 1;
      return;
    }
    if (f === F.Model) {
      this.blockSize = -1;
      this.buffered = [];
      this.bufferedBlocks = 0;
    } else if (f === F.Event && this.depth === 3) {
      this.workerId = null;
      this.dpRank = -1;
      this.eventId = -1;
      this.parentKind = 0;
      this.blocks = null;
      this.sawStored = false;
    } else if (f === F.Blocks && this.depth === 8) {
      this.bhSet = false;
      this.thSet = false;
      this.copies = 1;
    } else if (f === F.Cursor) {
      this.workerId = null;
      this.dpRank = -1;
      this.seqKind = 0;
      this.baselineKind = 0;
      this.complete = null;
      this.epoch = null;
    } else if (!((f === F.Event && this.depth === 4) || f === F.Data || f === F.Stored)) {
      this.fail(this.depth === 0 ? "the body is not a JSON object" : "unexpected object");
    }
    if (f === F.Stored) this.sawStored = true;
    this.depth++;
    this.field = F.None;
  }

  startArray(): void {
    const f = this.valueField();
    if (f === F.Skip) {
      this.skip++;
      return;
    }
    if (f === F.Events && this.depth === 2) {
      this.depth = 3;
    } else if (f === F.Cursors && this.depth === 2) {
      this.inCursors = true;
      this.cursors = [];
      this.depth = 3;
    } else if (f === F.Adapters && this.depth === 2) {
      this.inAdapters = true;
      this.adapters = [];
      this.depth = 3;
    } else if (f === F.Blocks && this.depth === 7) {
      if (this.batch !== null) {
        this.batch.dropOpen(); // a repeated "blocks" key replaces the earlier one, as in object mode
        this.blocks = EMPTY_BLOCKS;
      } else this.blocks = [];
      this.depth = 8;
    } else this.fail(this.depth === 0 ? "the body is not a JSON object" : "unexpected array");
    this.field = F.None;
  }

  endObject(): void {
    if (this.skip > 0) {
      this.skip--;
      return;
    }
    switch (this.depth) {
      case 9: {
        if (!this.bhSet || !this.thSet) this.fail("a block needs block_hash and tokens_hash");
        this.checkBlockLimit();
        this.pushBlock(this.bhHi, this.bhLo, this.thHi, this.thLo, this.copies);
        break;
      }
      case 7:
        if (this.blocks === null || this.parentKind === 0) this.fail("a stored event needs parent_hash and blocks");
        break;
      case 6:
        if (!this.sawStored) this.fail("event data without `stored`");
        break;
      case 4:
        if (this.inCursors) this.finishCursor();
        else this.finishEvent();
        break;
      case 2:
        if (this.blockSize < 0) this.fail(`model ${JSON.stringify(this.modelKey)} has no block_size`);
        this.flush();
        break;
    }
    this.depth--;
    this.field = F.None;
  }

  endArray(): void {
    if (this.skip > 0) {
      this.skip--;
      return;
    }
    if (this.depth === 3 && this.inCursors) {
      this.inCursors = false;
      this.cursorSink?.(this.modelKey, this.cursors);
      this.cursors = [];
    } else if (this.depth === 3 && this.inAdapters) {
      this.inAdapters = false;
      this.adapterSink?.(this.modelKey, this.adapters);
      this.adapters = [];
    }
    this.depth--;
    this.field = F.None;
  }

  private checkBlockLimit(): void {
    const n = this.batch !== null ? this.batch.openBlocks : this.blocks!.length;
    if (n >= this.limits.maxEventBlocks) this.fail(`more than ${this.limits.maxEventBlocks} blocks in one event`);
    // Before block_size, events are kept as objects: the limit on them holds while the event grows.
    if (this.blockSize < 0 && this.bufferedBlocks + n > this.limits.maxBufferedBlocks) this.fail("too many events before block_size");
  }

  private pushBlock(bHi: number, bLo: number, tHi: number, tLo: number, copies: number): void {
    if (this.batch !== null) this.batch.pushBlock(bHi, bLo, tHi, tLo, copies);
    else {
      const b: StoredBlock = { blockHash: toBigInt(bHi, bLo), tokensHash: toBigInt(tHi, tLo) };
      if (copies !== 1) b.copies = copies;
      this.blocks!.push(b);
    }
  }

  private finishCursor(): void {
    if (this.workerId === null || this.dpRank < 0 || this.complete === null) this.fail("a cursor needs worker_id, dp_rank and complete");
    if (this.cursors.length >= MAX_CURSORS) this.fail(`more than ${MAX_CURSORS} cursors in one model`);
    this.cursors.push({
      workerId: this.workerId, dpRank: this.dpRank, complete: this.complete,
      seq: this.seqKind === 2 ? this.seqValue : null, baseline: this.baselineKind === 2 ? this.baselineValue : null, epoch: this.epoch,
    });
  }

  private finishEvent(): void {
    if (this.workerId === null || this.dpRank < 0 || this.eventId < 0 || this.blocks === null) {
      this.fail("an event needs worker_id, dp_rank, event.event_id and event.data.stored");
    }
    const b = this.batch;
    if (b !== null) {
      if (this.lastWorker.workerId !== this.workerId || this.lastWorker.dpRank !== this.dpRank) {
        this.lastWorker = { workerId: this.workerId, dpRank: this.dpRank };
      }
      if (this.blockSize >= 0) {
        this.events++;
        b.pushEvent(this.lastWorker, this.eventId, this.parentKind === 2, this.pHi, this.pLo);
        if (b.count >= this.batchEvents || b.blocks >= this.batchBlocks) this.flush();
        return;
      }
      // before block_size: this event is buffered as an object, like in object mode
      const blocks: StoredBlock[] = [];
      for (let k = b.blockStart[b.count]!; k < b.blocks; k++) blocks.push({ blockHash: b.blockHashes[k]!, tokensHash: b.tokensHashes[k]! });
      b.dropOpen();
      this.blocks = blocks;
    }
    const parentHash = this.parentKind === 2 ? toBigInt(this.pHi, this.pLo) : null;
    const e: RouterEvent = { workerId: this.workerId, dpRank: this.dpRank, eventId: this.eventId, parentHash, blocks: this.blocks };
    this.events++;
    if (this.blockSize >= 0) {
      this.sink(this.modelKey, this.blockSize, e);
      return;
    }
    this.bufferedBlocks += e.blocks.length + 1;
    if (this.bufferedBlocks > this.limits.maxBufferedBlocks) this.fail("too many events before block_size");
    this.buffered.push(e);
  }

  fastObject(buf: Uint8Array, i: number): number {
    if (this.depth !== 8 || this.skip > 0 || !bytesAt(BLOCK_HEAD, buf, i)) return -1;
    const p = this.parts;
    let j = scanU64(buf, i + BLOCK_HEAD.length, p);
    if (j < 0 || !bytesAt(BLOCK_MID, buf, j)) return -1;
    const bHi = p.hi, bLo = p.lo;
    j = scanU64(buf, j + BLOCK_MID.length, p);
    if (j < 0 || j >= buf.length) return -1;
    const tHi = p.hi, tLo = p.lo;
    let copies = 1;
    if (buf[j] !== 0x7d) {
      if (!bytesAt(BLOCK_COPIES, buf, j)) return -1;
      j = scanU64(buf, j + BLOCK_COPIES.length, p);
      if (j < 0 || j >= buf.length || buf[j] !== 0x7d || p.hi !== 0) return -1;
      copies = p.lo;
    }
    this.checkBlockLimit();
    this.pushBlock(bHi, bLo, tHi, tLo, copies);
    return j + 1;
  }

  key(buf: Uint8Array, start: number, end: number): void {
    if (this.skip > 0) return;
    if (this.depth === 1) {
      const key = this.decode(buf, start, end);
      if (this.acceptModel !== undefined && !this.acceptModel(key)) {
        this.skippedModels++;
        this.field = F.Skip;
        return;
      }
      this.modelKey = key;
      // One object per model: a repeated key would mix two block sizes or two halves into one index.
      if (this.modelKeys.has(this.modelKey)) this.fail(`model ${JSON.stringify(this.modelKey)} appears twice`);
      this.modelKeys.add(this.modelKey);
      this.field = F.Model;
      return;
    }
    if (this.depth === 6) {
      if (!sameBytes(STORED, buf, start, end)) this.fail(`unsupported event kind ${JSON.stringify(this.decode(buf, start, end))}`);
      this.field = F.Stored;
      return;
    }
    this.field = F.Skip;
    const table = KEYS_BY_DEPTH[this.depth];
    if (table === undefined) return;
    for (const k of table) {
      if (sameBytes(k.bytes, buf, start, end)) {
        // A field of the other kind of depth-4 object is as unknown here as any other key.
        if (this.depth === 4 && (this.inCursors ? k.field === F.Event : CURSOR_ONLY.has(k.field))) return;
        this.field = k.field;
        return;
      }
    }
  }

  string(buf: Uint8Array, start: number, end: number): void {
    const f = this.valueField();
    if (f === F.Skip) return this.skipped();
    if (f === F.Adapters) {
      if (this.adapters.length >= MAX_ADAPTERS) this.fail(`more than ${MAX_ADAPTERS} adapters in one model`);
      this.adapters.push(this.decode(buf, start, end));
      return;
    }
    if (f === F.Epoch) {
      this.epoch = readEpoch(buf.subarray(start, end));
      this.field = F.None;
      return;
    }
    if (f !== F.WorkerId) this.fail("unexpected string");
    // Consecutive events usually share a worker: reuse the decoded string instead of decoding again.
    if (!sameBytes(this.lastWorkerBytes, buf, start, end)) {
      this.lastWorkerBytes = buf.slice(start, end);
      this.lastWorkerId = this.decode(buf, start, end);
    }
    this.workerId = this.lastWorkerId;
    this.field = F.None;
  }

  private skipped(): void {
    if (this.skip === 0) this.field = F.None;
  }

  integer(hi: number, lo: number): void {
    const f = this.valueField();
    switch (f) {
      case F.Skip:
        return this.skipped();
      case F.BlockHash:
        this.bhSet = true;
        this.bhHi = hi;
        this.bhLo = lo;
        break;
      case F.TokensHash:
        this.thSet = true;
        this.thHi = hi;
        this.thLo = lo;
        break;
      case F.Parent:
        this.parentKind = 2;
        this.pHi = hi;
        this.pLo = lo;
        break;
      case F.Seq:
        this.seqKind = 2;
        this.seqValue = toBigInt(hi, lo);
        break;
      case F.Baseline:
        this.baselineKind = 2;
        this.baselineValue = toBigInt(hi, lo);
        break;
      case F.Copies:
        if (hi !== 0) this.fail("copies must be an integer below 2^32");
        this.copies = lo;
        break;
      case F.BlockSize:
      case F.DpRank:
      case F.EventId: {
        if (hi >= 0x200000) this.fail("integer too large");
        const v = hi * TWO32 + lo;
        if (f === F.BlockSize) {
          if (v === 0) this.fail("block_size must be positive");
          if (this.blockSize >= 0) this.fail(`model ${JSON.stringify(this.modelKey)} has block_size twice`);
          this.blockSize = v;
          for (const e of this.buffered) this.sink(this.modelKey, v, e);
          this.buffered = [];
        } else if (f === F.DpRank) this.dpRank = v;
        else this.eventId = v;
        break;
      }
      default:
        this.fail("unexpected number");
    }
    this.field = F.None;
  }

  otherNumber(): void {
    const f = this.valueField();
    if (f === F.Skip) return this.skipped();
    this.fail("expected an unsigned 64-bit integer");
  }

  literal(value: boolean | null): void {
    const f = this.valueField();
    if (f === F.Skip) return this.skipped();
    if (f === F.Parent && value === null) this.parentKind = 1;
    else if (f === F.Seq && value === null) this.seqKind = 1;
    else if (f === F.Baseline && value === null) this.baselineKind = 1;
    else if (f === F.Complete && typeof value === "boolean") this.complete = value;
    else if (f === F.Epoch && value === null) this.epoch = null;
    else this.fail(`unexpected ${String(value)}`);
    this.field = F.None;
  }
}

/**
 * Push parser: `push(chunk)` hands every event completed by that chunk to the sink, synchronously;
 * `end()` throws unless the body was complete. Errors are DumpFormatError (malformed, truncated, too large).
 */
export class DumpParser {
  private readonly tokenizer: JsonTokenizer;
  private readonly assembler: DumpAssembler;
  private readonly limits: DumpParserLimits;
  bytes = 0;

  /**
   * `batch`: the typed fast path (see DumpBatchOptions); without it every event goes to `sink`.
   * `cursors`: receives each model's cursors (without it they are read and dropped).
   */
  constructor(sink: DumpSink, limits: Partial<DumpParserLimits> = {}, batch?: DumpBatchOptions, cursors?: DumpCursorSink, opts: DumpParserOptions = {}) {
    this.limits = { ...DEFAULT_PARSER_LIMITS, ...limits };
    this.assembler = new DumpAssembler(sink, this.limits, () => this.bytes, batch ?? null, cursors ?? null, opts.acceptModel, opts.adapters);
    this.tokenizer = new JsonTokenizer(this.assembler, this.limits);
  }

  get events(): number {
    return this.assembler.events;
  }

  /** Models skipped because `acceptModel` refused them. */
  get skippedModels(): number {
    return this.assembler.skippedModels;
  }

  push(chunk: Uint8Array): void {
    if (this.bytes + chunk.length > this.limits.maxBytes) {
      throw new DumpTooLargeError(`dump larger than the limit of ${this.limits.maxBytes} bytes`, this.bytes);
    }
    this.wrap(() => this.tokenizer.push(chunk));
    this.bytes += chunk.length;
  }

  end(): void {
    this.wrap(() => this.tokenizer.end());
    this.assembler.flush();
  }

  private wrap(f: () => void): void {
    try {
      f();
    } catch (err) {
      if (err instanceof JsonSyntaxError) throw new DumpFormatError(`malformed dump: ${err.message}`, err.offset);
      throw err;
    }
  }
}

/** Pull form of the parser: yields events as the stream's bytes arrive. */
export async function* readDump(
  body: ReadableStream<Uint8Array>,
  limits: Partial<DumpParserLimits> = {},
): AsyncGenerator<{ key: string; blockSize: number; event: RouterEvent }> {
  let out: { key: string; blockSize: number; event: RouterEvent }[] = [];
  const parser = new DumpParser((key, blockSize, event) => out.push({ key, blockSize, event }), limits);
  const reader = body.getReader();
  try {
    for (;;) {
      const r = await reader.read();
      if (r.done) break;
      parser.push(r.value);
      const ready = out;
      out = [];
      yield* ready;
    }
    parser.end();
    yield* out;
  } finally {
    reader.releaseLock();
  }
}
