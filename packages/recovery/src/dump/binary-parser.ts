import { DUMP_BINARY_MAGIC, DUMP_CURSOR_FLAGS, DUMP_EVENT_FLAGS, DUMP_FRAME, type StreamCursor, type WorkerRef } from "@kv-epp/protocol";
import { runEvents } from "./event-run.ts";
import { DEFAULT_PARSER_LIMITS, DumpFormatError, type DumpCursorSink, type DumpParserLimits, type DumpSink, DumpTooLargeError, readEpoch } from "./parser.ts";

// Streaming parser of the binary `/dump` body (docs/CONTRACTS.md §7 "binary"). Bytes in, frames out as each
// completes; a frame inside one chunk is handed on without a copy, one split across chunks is gathered in a
// buffer that grows only as its bytes arrive (never to a length the frame merely claims). Every event header
// is checked here (flags, counts inside the frame, limits), so a staging's bulk path receives only
// well-formed runs; the blocks themselves are not touched unless the staging wants objects.

/** Receivers of a binary dump's content; `event` is the objects path, `events` the bulk one. */
export type BinaryDumpSinks = {
  /** Each event decoded as a RouterEvent (used when `events` is absent). */
  event: DumpSink;
  /** A run of whole events of one worker rank in the wire layout; the bytes are valid during the call only. */
  events?: (key: string, blockSize: number, worker: WorkerRef, words: Uint8Array) => void;
  cursors?: DumpCursorSink;
  adapters?: (key: string, names: string[]) => void;
  /** The sizes the producer announced for a model (before its events): a hint, never trusted to size memory unchecked. */
  sizes?: (key: string, blockSize: number, sizes: { blocks: number; residencies: number }) => void;
  /** false: the model's frames are skipped unread (nothing staged, its key not kept). */
  acceptModel?: (key: string) => boolean;
};

const MAGIC = new TextEncoder().encode(DUMP_BINARY_MAGIC);
/** Per model, as in JSON: a bound on what a hostile body can make us hold. */
const MAX_CURSORS = 1 << 16;
const MAX_ADAPTERS = 1 << 16;
const CURSOR_FIXED = 28;
const MODEL_FRAMES = new Set<number>([DUMP_FRAME.worker, DUMP_FRAME.events, DUMP_FRAME.cursors, DUMP_FRAME.adapters, DUMP_FRAME.cursorEpochs]);

type State = "magic" | "header" | "payload" | "skip" | "done";

export class BinaryDumpParser {
  bytes = 0;
  events = 0;
  skippedModels = 0;
  private readonly limits: DumpParserLimits;
  private readonly utf8 = new TextDecoder("utf-8", { fatal: true });
  private state: State = "magic";
  private readonly head = new Uint8Array(8);
  private readonly headView = new DataView(this.head.buffer);
  private headLen = 0;
  private type = 0;
  private length = 0;
  private left = 0;
  private frame = new Uint8Array(0);
  private have = 0;
  /** Where the chunk being pushed starts in the body, for error offsets. */
  private at = 0;

  private key: string | null = null;
  private skipping = false;
  private blockSize = 0;
  private readonly modelKeys = new Set<string>();
  private worker: WorkerRef | null = null;
  private sawCursors = false;
  private sawAdapters = false;
  /** The epochs of the model's next CURSORS frame, one per entry (null: none), from the frame just before it. */
  private epochs: (string | null)[] | null = null;

  constructor(private readonly sinks: BinaryDumpSinks, limits: Partial<DumpParserLimits> = {}) {
    this.limits = { ...DEFAULT_PARSER_LIMITS, ...limits };
  }

  private fail(msg: string, offset = this.at): never {
    throw new DumpFormatError(`malformed binary dump: ${msg} at byte ${offset}`, offset);
  }

  push(chunk: Uint8Array): void {
    if (this.bytes + chunk.length > this.limits.maxBytes) throw new DumpTooLargeError(`dump larger than the limit of ${this.limits.maxBytes} bytes`, this.bytes);
    let i = 0;
    while (i < chunk.length) {
      this.at = this.bytes + i;
      switch (this.state) {
        case "magic":
        case "header": {
          const take = Math.min(8 - this.headLen, chunk.length - i);
          this.head.set(chunk.subarray(i, i + take), this.headLen);
          this.headLen += take;
          i += take;
          if (this.headLen < 8) break;
          this.headLen = 0;
          if (this.state === "magic") {
            for (let k = 0; k < 8; k++) if (this.head[k] !== MAGIC[k]) this.fail("not a binary dump (bad magic)", 0);
            this.state = "header";
          } else this.startFrame(this.headView.getUint32(0, true), this.headView.getUint32(4, true));
          break;
        }
        case "skip": {
          const take = Math.min(this.left, chunk.length - i);
          this.left -= take;
          i += take;
          if (this.left === 0) this.state = "header";
          break;
        }
        case "payload": {
          const avail = chunk.length - i;
          if (this.have === 0 && avail >= this.length) {
            // whole in this chunk: no copy
            this.endFrame(chunk.subarray(i, i + this.length));
            i += this.length;
            break;
          }
          const take = Math.min(this.length - this.have, avail);
          if (this.have + take > this.frame.length) {
            const bigger = new Uint8Array(Math.min(this.length, Math.max(this.have + take, this.frame.length * 2, 64 * 1024)));
            bigger.set(this.frame.subarray(0, this.have));
            this.frame = bigger;
          }
          this.frame.set(chunk.subarray(i, i + take), this.have);
          this.have += take;
          i += take;
          if (this.have === this.length) this.endFrame(this.frame.subarray(0, this.length));
          break;
        }
        case "done":
          this.fail("bytes after the end frame");
      }
    }
    this.bytes += chunk.length;
  }

  end(): void {
    this.at = this.bytes;
    if (this.state !== "done") this.fail("truncated (no end frame)");
  }

  private startFrame(type: number, length: number): void {
    if (length > this.limits.maxFrameBytes) this.fail(`a frame of ${length} bytes (limit ${this.limits.maxFrameBytes})`);
    this.type = type;
    this.length = length;
    const known = type === DUMP_FRAME.model || type === DUMP_FRAME.end || MODEL_FRAMES.has(type);
    if (MODEL_FRAMES.has(type) && this.key === null && !this.skipping) this.fail(`frame ${type} before any model`);
    // Unknown frames (a newer producer's) and an unaccepted model's frames are passed over unread.
    if (!known || (this.skipping && MODEL_FRAMES.has(type))) {
      this.left = length;
      this.state = length > 0 ? "skip" : "header";
      return;
    }
    this.have = 0;
    if (length === 0) this.endFrame(new Uint8Array(0));
    else this.state = "payload";
  }

  private endFrame(p: Uint8Array): void {
    this.state = "header";
    const v = new DataView(p.buffer, p.byteOffset, p.byteLength);
    switch (this.type) {
      case DUMP_FRAME.model:
        return this.model(p, v);
      case DUMP_FRAME.worker: {
        if (p.length < 4) this.fail("a worker frame needs dp_rank");
        this.worker = { workerId: this.string(p, 4, p.length), dpRank: v.getUint32(0, true) };
        return;
      }
      case DUMP_FRAME.events:
        return this.eventRun(p, v);
      case DUMP_FRAME.cursorEpochs:
        return this.epochList(p, v);
      case DUMP_FRAME.cursors:
        return this.cursorList(p, v);
      case DUMP_FRAME.adapters:
        return this.adapterList(p, v);
      case DUMP_FRAME.end:
        if (p.length !== 0) this.fail("the end frame has a payload");
        this.epochsConsumed();
        this.state = "done";
    }
  }

  private string(p: Uint8Array, start: number, end: number): string {
    if (end - start > this.limits.maxStringBytes) this.fail(`a string of ${end - start} bytes (limit ${this.limits.maxStringBytes})`);
    try {
      return this.utf8.decode(p.subarray(start, end));
    } catch {
      this.fail("invalid UTF-8 in a string");
    }
  }

  private model(p: Uint8Array, v: DataView): void {
    if (p.length < 12) this.fail("a model frame needs block_size, blocks and residencies");
    const key = this.string(p, 12, p.length);
    this.epochsConsumed();
    this.worker = null;
    this.sawCursors = false;
    this.sawAdapters = false;
    if (this.sinks.acceptModel !== undefined && !this.sinks.acceptModel(key)) {
      this.skippedModels++;
      this.skipping = true;
      this.key = null;
      return;
    }
    this.skipping = false;
    if (this.modelKeys.has(key)) this.fail(`model ${JSON.stringify(key)} appears twice`);
    this.modelKeys.add(key);
    const blockSize = v.getUint32(0, true);
    if (blockSize === 0) this.fail("block_size must be positive");
    this.key = key;
    this.blockSize = blockSize;
    const blocks = v.getUint32(4, true), residencies = v.getUint32(8, true);
    if (blocks > 0 || residencies > 0) this.sinks.sizes?.(key, blockSize, { blocks, residencies });
  }

  /** Checks every event header of the run (per event, not per block), then hands the run on. */
  private eventRun(p: Uint8Array, v: DataView): void {
    if (this.worker === null) this.fail("events before a worker frame");
    if (p.length % 8 !== 0) this.fail("an events frame is not a whole number of u64 words");
    const words = p.length / 8;
    const maxBlocks = this.limits.maxEventBlocks;
    let i = 0;
    let n = 0;
    while (i < words) {
      const flags = v.getUint32(i * 8, true), count = v.getUint32(i * 8 + 4, true);
      if (flags > (DUMP_EVENT_FLAGS.hasParent | DUMP_EVENT_FLAGS.hasCopies)) this.fail(`unknown event flags ${flags}`);
      if (count > maxBlocks) this.fail(`more than ${maxBlocks} blocks in one event`);
      const parent = flags & DUMP_EVENT_FLAGS.hasParent ? 1 : 0;
      const need = 1 + parent + count * (flags & DUMP_EVENT_FLAGS.hasCopies ? 3 : 2);
      if (i + need > words) this.fail("an event runs past its frame");
      if (flags & DUMP_EVENT_FLAGS.hasCopies) {
        // as in JSON: a copy count is below 2^32 (only events with copies pay for this look)
        for (let k = i + 1 + parent + 2 * count; k < i + need; k++) if (v.getUint32(k * 8 + 4, true) !== 0) this.fail("copies must be an integer below 2^32");
      }
      i += need;
      n++;
    }
    const firstId = this.events;
    this.events += n;
    if (this.sinks.events !== undefined) this.sinks.events(this.key!, this.blockSize, this.worker, p);
    else for (const e of runEvents(this.worker, p, firstId)) this.sinks.event(this.key!, this.blockSize, e);
  }

  private cursorList(p: Uint8Array, v: DataView): void {
    if (this.sawCursors) this.fail("a model has two cursor frames");
    this.sawCursors = true;
    const out: StreamCursor[] = [];
    const epochs = this.epochs;
    this.epochs = null;
    let o = 0;
    while (o < p.length) {
      if (o + CURSOR_FIXED > p.length) this.fail("a cursor runs past its frame");
      if (out.length >= MAX_CURSORS) this.fail(`more than ${MAX_CURSORS} cursors in one model`);
      const flags = v.getUint32(o, true);
      const idLen = v.getUint32(o + 24, true);
      if (o + CURSOR_FIXED + idLen > p.length) this.fail("a cursor's worker_id runs past its frame");
      out.push({
        workerId: this.string(p, o + CURSOR_FIXED, o + CURSOR_FIXED + idLen),
        dpRank: v.getUint32(o + 4, true),
        seq: flags & DUMP_CURSOR_FLAGS.seq ? v.getBigUint64(o + 8, true) : null,
        baseline: flags & DUMP_CURSOR_FLAGS.baseline ? v.getBigUint64(o + 16, true) : null,
        complete: (flags & DUMP_CURSOR_FLAGS.complete) !== 0,
        epoch: epochs?.[out.length] ?? null,
      });
      o += CURSOR_FIXED + idLen;
    }
    if (epochs !== null && epochs.length !== out.length) this.fail(`${epochs.length} cursor epochs for ${out.length} cursors`);
    this.sinks.cursors?.(this.key!, out);
  }

  /** The epochs of the CURSORS frame that follows, by position (length 0: none). */
  private epochList(p: Uint8Array, v: DataView): void {
    if (this.sawCursors || this.epochs !== null) this.fail(this.sawCursors ? "cursor epochs after the model's cursor frame" : "a model has two cursor epoch frames");
    const epochs: (string | null)[] = [];
    let o = 0;
    while (o < p.length) {
      if (o + 4 > p.length) this.fail("a cursor epoch runs past its frame");
      if (epochs.length >= MAX_CURSORS) this.fail(`more than ${MAX_CURSORS} cursor epochs in one model`);
      const len = v.getUint32(o, true);
      if (o + 4 + len > p.length) this.fail("a cursor epoch runs past its frame");
      epochs.push(len === 0 ? null : readEpoch(p.subarray(o + 4, o + 4 + len)));
      o += 4 + len;
    }
    this.epochs = epochs;
  }

  /** A model's epochs frame is followed by its cursors, or it says nothing anyone can read. */
  private epochsConsumed(): void {
    if (this.epochs !== null) this.fail("cursor epochs without a cursor frame after them");
  }

  private adapterList(p: Uint8Array, v: DataView): void {
    if (this.sawAdapters) this.fail("a model has two adapter frames");
    this.sawAdapters = true;
    const names: string[] = [];
    let o = 0;
    while (o < p.length) {
      if (o + 4 > p.length) this.fail("an adapter name runs past its frame");
      if (names.length >= MAX_ADAPTERS) this.fail(`more than ${MAX_ADAPTERS} adapters in one model`);
      const len = v.getUint32(o, true);
      if (o + 4 + len > p.length) this.fail("an adapter name runs past its frame");
      names.push(this.string(p, o + 4, o + 4 + len));
      o += 4 + len;
    }
    this.sinks.adapters?.(this.key!, names);
  }
}
