import {
  DUMP_CHUNK_BYTES, DUMP_FIELDS as D, DUMP_JSON_BLOCK, DUMP_JSON_BLOCKS, DUMP_JSON_COPIES, DUMP_JSON_DP_RANK, DUMP_JSON_EVENT_ID, DUMP_JSON_PARENT,
  DUMP_JSON_TOKENS, DUMP_JSON_WORKER, type RouterEvent, type StreamCursor,
} from "@kv-epp/protocol";
import type { DumpSource } from "../types.ts";
import { ChunkBuffer } from "./chunk-buffer.ts";

// Streaming `/dump` writer (docs/CONTRACTS.md §7). The body is produced chunk by chunk from the source's iterators
// as the consumer pulls, so memory stays bounded by about one chunk (plus one event) however large the index
// is, and a slow reader slows the iteration instead of piling bytes up (pull-based stream, high-water mark 1).
// Written straight into bytes rather than via strings + TextEncoder, because a measurement said so: on the
// 1M-residency bench, string building made ~4 bytes of garbage per body byte (hundreds of MiB of RSS on the
// sender) and ran at ~60 MiB/s. u64 digits come from exact double arithmetic on two u32 halves.
// A model that brings its events pre-formatted (DumpModel.eventsJson: KvIndex.dumpJsonChunks, written inside
// the WASM module) is framed here and its chunks passed on as they are: measured ~3x less CPU for the sender.

const enc = new TextEncoder();
const F = {
  open: enc.encode("{"),
  modelOpen: enc.encode(`:{"${D.blockSize}":`),
  eventsOpen: enc.encode(`,"${D.events}":[`),
  close: enc.encode("}"),
  comma: enc.encode(","),
  worker: enc.encode(DUMP_JSON_WORKER),
  eventId: enc.encode(DUMP_JSON_EVENT_ID),
  parent: enc.encode(DUMP_JSON_PARENT),
  blocks: enc.encode(DUMP_JSON_BLOCKS),
  block: enc.encode(DUMP_JSON_BLOCK),
  nextBlock: enc.encode("," + DUMP_JSON_BLOCK),
  tokens: enc.encode(DUMP_JSON_TOKENS),
  dpRank: enc.encode(DUMP_JSON_DP_RANK),
  copies: enc.encode(DUMP_JSON_COPIES),
  cursorsOpen: enc.encode(`,"${D.cursors}":[`),
  adaptersOpen: enc.encode(`,"${D.adapters}":[`),
  arrayClose: enc.encode("]"),
  cursorWorker: enc.encode(`{"${D.workerId}":`),
  cursorRank: enc.encode(`,"${D.dpRank}":`),
  cursorSeq: enc.encode(`,"${D.seq}":`),
  cursorBaseline: enc.encode(`,"${D.baseline}":`),
  cursorComplete: enc.encode(`,"${D.complete}":`),
  cursorEpoch: enc.encode(`,"${D.epoch}":`),
  true: enc.encode("true"),
  false: enc.encode("false"),
  null: enc.encode("null"),
};
/** "0000".."9999" as ASCII, 4 bytes each. */
const DIGITS4 = new Uint8Array(40000);
for (let i = 0; i < 10000; i++) DIGITS4.set(enc.encode(String(i).padStart(4, "0")), i * 4);

/** The most bytes one block can take: `,{"block_hash":<20>,"tokens_hash":<20>,"copies":<10>}`. */
const MAX_BLOCK_BYTES = 15 + 20 + 15 + 20 + 10 + 10 + 1;

class ByteWriter extends ChunkBuffer {
  private readonly view = new DataView(new ArrayBuffer(8));
  private lastString = "";
  private lastStringBytes = enc.encode('""');

  constructor(chunkBytes: number) {
    super(chunkBytes, 4096);
  }

  raw(b: Uint8Array): void {
    this.ensure(b.length);
    const buf = this.buf;
    let p = this.pos;
    for (let i = 0; i < b.length; i++) buf[p++] = b[i]!;
    this.pos = p;
  }

  /** A non-negative safe integer (event ids, ranks, block sizes): rare, so String() is fine. */
  int(n: number): void {
    this.ascii(String(n));
  }

  private ascii(s: string): void {
    this.ensure(s.length);
    for (let i = 0; i < s.length; i++) this.buf[this.pos++] = s.charCodeAt(i);
  }

  /** A JSON string; consecutive repeats (the same worker across events) reuse their encoding. */
  string(s: string): void {
    if (s !== this.lastString) {
      this.lastString = s;
      this.lastStringBytes = enc.encode(JSON.stringify(s));
    }
    this.raw(this.lastStringBytes);
  }

  /** Writes an unsigned 64-bit value exactly; caller has ensured room for 20 digits. */
  u64(v: bigint): void {
    this.view.setBigUint64(0, v);
    const hi = this.view.getUint32(0);
    const lo = this.view.getUint32(4);
    // 2^32 = 42949 * 10^5 + 67296, so v = a * 10^5 + b with every product below 2^53 (exact doubles);
    // then v = x * 10^8 + y, and x = x1 * 10^8 + x2: groups of 8 digits written 4 at a time from a table
    // (measured ~1.5x faster than one division per digit, and than bigint.toString()).
    let a = hi * 42949;
    let b = hi * 67296 + lo;
    const carry = Math.floor(b / 100000);
    a += carry;
    b -= carry * 100000;
    const x = Math.floor(a / 1000);
    const y = (a - x * 1000) * 100000 + b;
    if (x === 0) return this.small(y);
    const x1 = Math.floor(x / 100000000);
    const x2 = x - x1 * 100000000;
    if (x1 > 0) {
      this.small(x1);
      this.pad8(x2);
    } else this.small(x2);
    this.pad8(y);
  }

  /** Exactly 8 digits, zero-padded, of n < 10^8. */
  private pad8(n: number): void {
    const h = Math.floor(n / 10000);
    const buf = this.buf;
    let o = h * 4;
    let p = this.pos;
    buf[p] = DIGITS4[o]!;
    buf[p + 1] = DIGITS4[o + 1]!;
    buf[p + 2] = DIGITS4[o + 2]!;
    buf[p + 3] = DIGITS4[o + 3]!;
    o = (n - h * 10000) * 4;
    buf[p + 4] = DIGITS4[o]!;
    buf[p + 5] = DIGITS4[o + 1]!;
    buf[p + 6] = DIGITS4[o + 2]!;
    buf[p + 7] = DIGITS4[o + 3]!;
    this.pos = p + 8;
  }

  /** Decimal digits of an integer below 10^8. */
  private small(n: number): void {
    const len = n < 10 ? 1 : n < 100 ? 2 : n < 1000 ? 3 : n < 10000 ? 4 : n < 100000 ? 5 : n < 1000000 ? 6 : n < 10000000 ? 7 : 8;
    const buf = this.buf;
    let p = this.pos + len;
    while (n >= 10) {
      const q = Math.floor(n / 10);
      buf[--p] = 48 + n - q * 10;
      n = q;
    }
    buf[--p] = 48 + n;
    this.pos += len;
  }

  event(e: RouterEvent): void {
    this.raw(F.worker);
    this.string(e.workerId);
    this.raw(F.eventId);
    this.int(e.eventId);
    this.raw(F.parent);
    this.optionalU64(e.parentHash);
    this.raw(F.blocks);
    const blocks = e.blocks;
    for (let i = 0; i < blocks.length; i++) {
      const b = blocks[i]!;
      this.ensure(MAX_BLOCK_BYTES);
      this.raw(i === 0 ? F.block : F.nextBlock);
      this.u64(b.blockHash);
      this.raw(F.tokens);
      this.u64(b.tokensHash);
      // Only when it says something: a dump of single copies keeps the shape every reader knows.
      if (b.copies !== undefined && b.copies !== 1) {
        this.raw(F.copies);
        this.int(b.copies);
      }
      this.buf[this.pos++] = 0x7d; // }
    }
    this.raw(F.dpRank);
    this.int(e.dpRank);
    this.raw(F.close);
  }

  /** `,"cursors":[...]` after a model's events (see StreamCursor). */
  cursors(cs: Iterable<StreamCursor>): void {
    this.raw(F.cursorsOpen);
    let first = true;
    for (const c of cs) {
      if (!first) this.raw(F.comma);
      first = false;
      this.raw(F.cursorWorker);
      this.string(c.workerId);
      this.raw(F.cursorRank);
      this.int(c.dpRank);
      this.raw(F.cursorSeq);
      this.optionalU64(c.seq);
      this.raw(F.cursorBaseline);
      this.optionalU64(c.baseline);
      this.raw(F.cursorComplete);
      this.raw(c.complete ? F.true : F.false);
      // Only when known: a cursor without one keeps the shape readers from before epochs know.
      if (c.epoch !== null) {
        this.raw(F.cursorEpoch);
        this.string(c.epoch);
      }
      this.raw(F.close);
    }
    this.raw(F.arrayClose);
  }

  /** `,"adapters":["name",...]` after a model's cursors. */
  adapters(names: Iterable<string>): void {
    this.raw(F.adaptersOpen);
    let first = true;
    for (const n of names) {
      if (!first) this.raw(F.comma);
      first = false;
      this.string(n);
    }
    this.raw(F.arrayClose);
  }

  private optionalU64(v: bigint | null): void {
    if (v === null) return this.raw(F.null);
    this.ensure(20);
    this.u64(v);
  }
}

/** The body as a lazy sequence of byte chunks of about `chunkBytes` (a large event may make one bigger). */
export function* dumpChunks(source: DumpSource, chunkBytes = DUMP_CHUNK_BYTES): Generator<Uint8Array> {
  const w = new ByteWriter(chunkBytes);
  w.raw(F.open);
  let firstModel = true;
  for (const m of source.models()) {
    if (!firstModel) w.raw(F.comma);
    firstModel = false;
    w.string(m.key);
    w.raw(F.modelOpen);
    w.int(m.blockSize);
    w.raw(F.eventsOpen);
    if (m.eventsJson !== undefined) {
      // Pre-formatted events (e.g. from the index module): handed on as they are; only a chunk that follows
      // framing bytes still in the buffer is copied, so the first chunk of the body is never just framing.
      for (const chunk of m.eventsJson(chunkBytes)) {
        if (w.pos === 0) yield chunk;
        else {
          w.bytes(chunk);
          if (w.full) yield w.take();
        }
      }
    } else {
      let firstEvent = true;
      for (const e of m.events) {
        if (!firstEvent) w.raw(F.comma);
        firstEvent = false;
        w.event(e);
        if (w.full) yield w.take();
      }
    }
    w.raw(F.arrayClose);
    // After the events: each rank's cursor is read when its blocks are, so it is known only now.
    if (m.cursors !== undefined) w.cursors(m.cursors());
    if (m.adapters !== undefined) w.adapters(m.adapters());
    w.raw(F.close);
  }
  w.raw(F.close);
  yield w.take();
}

/**
 * The `/dump` body as a pull-based byte stream. Errors thrown by the source surface as a stream error (the
 * HTTP layer then aborts the connection, and the peer sees a truncated body and fails its attempt).
 */
export function dumpStream(source: DumpSource, opts: { chunkBytes?: number } = {}): ReadableStream<Uint8Array> {
  const chunks = dumpChunks(source, opts.chunkBytes);
  return streamFromChunks(
    () => {
      const r = chunks.next();
      return r.done ? null : r.value;
    },
    null,
    () => void chunks.return(undefined),
  );
}

/** How long /dump writes chunks before it lets the event loop turn (picks, events) go on. */
export const DUMP_SLICE_MS = 2;

/**
 * `first`: a chunk pre-pulled by the caller (see the handler: a dump that cannot start becomes a 500).
 * `cancel`: the reader went away mid-body; it closes the source (the index module's dump generators
 * release the linear memory they hold in their `finally`, which nothing else would run).
 */
export function streamFromChunks(next: () => Uint8Array | null, first: Uint8Array | null, cancel: () => void): ReadableStream<Uint8Array> {
  let pending = first;
  /** Time spent producing chunks since the stream last waited for a turn. */
  let spent = 0;
  let cancelled = false;
  return new ReadableStream<Uint8Array>(
    {
      cancel: () => {
        cancelled = true;
        cancel();
      },
      pull(controller) {
        // A reader that keeps up (loopback) pulls again within the same turn: the whole dump would be written
        // in one turn, holding every pick back (~30-65 ms for 4 MB on an idle core, 150-220 ms in the demo).
        // Past a slice, the next pull waits for a turn of its own.
        if (spent >= DUMP_SLICE_MS) {
          return new Promise<void>((resolve) => setImmediate(() => {
            spent = 0;
            // The reader may have gone away meanwhile (cancel closed the source).
            if (!cancelled) produce(controller);
            resolve();
          }));
        }
        produce(controller);
      },
    },
    { highWaterMark: 1 },
  );

  function produce(controller: ReadableStreamDefaultController<Uint8Array>): void {
    let chunk: Uint8Array | null;
    const t0 = performance.now();
    try {
      chunk = pending ?? next();
      spent += performance.now() - t0;
    } catch (err) {
      // Errors the stream: the server aborts the response, the reader sees a truncated body.
      controller.error(err);
      return;
    }
    pending = null;
    if (chunk === null) controller.close();
    else controller.enqueue(chunk);
  }
}
