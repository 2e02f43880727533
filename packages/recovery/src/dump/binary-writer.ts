import { DUMP_BINARY_MAGIC, DUMP_CHUNK_BYTES, DUMP_CURSOR_FLAGS, DUMP_FRAME, type RouterEvent, type StreamCursor } from "@kv-epp/protocol";
import type { DumpModel, DumpSource } from "../types.ts";
import { ChunkBuffer } from "./chunk-buffer.ts";
import { EventRunWriter } from "./event-run.ts";

// Streaming writer of the binary `/dump` body (docs/CONTRACTS.md §7 "binary"), pulled chunk by chunk like
// the JSON writer. A model that brings its events already in the layout (DumpModel.eventsBinary:
// KvIndex.dumpBinaryChunks, written inside the WASM module) is framed here; any other model's RouterEvents
// are written into event runs (event-run.ts) and framed the same way. Frames are small and many: they are packed into
// chunks of about `chunkBytes`.

const enc = new TextEncoder();
const MAGIC = enc.encode(DUMP_BINARY_MAGIC);

class FrameWriter extends ChunkBuffer {
  view: DataView;

  constructor(chunkBytes: number) {
    super(chunkBytes, 64);
    this.view = new DataView(this.buf.buffer);
  }

  protected override replaced(buf: Uint8Array): void {
    super.replaced(buf);
    this.view = new DataView(buf.buffer);
  }

  u32(v: number): void {
    this.ensure(4);
    this.view.setUint32(this.pos, v, true);
    this.pos += 4;
  }

  u64(v: bigint): void {
    this.ensure(8);
    this.view.setBigUint64(this.pos, v, true);
    this.pos += 8;
  }

  /** Opens a frame; `close(at)` writes its length once the payload is written. */
  open(type: number): number {
    this.u32(type);
    this.u32(0);
    return this.pos;
  }

  close(at: number): void {
    this.view.setUint32(at - 4, this.pos - at, true);
  }

  frame(type: number, payload: Uint8Array): void {
    this.u32(type);
    this.u32(payload.length);
    this.bytes(payload);
  }
}

function modelFrame(w: FrameWriter, m: DumpModel): void {
  const sizes = m.sizes?.() ?? { blocks: 0, residencies: 0 };
  const at = w.open(DUMP_FRAME.model);
  w.u32(m.blockSize);
  w.u32(sizes.blocks);
  w.u32(sizes.residencies);
  w.bytes(enc.encode(m.key));
  w.close(at);
}

function workerFrame(w: FrameWriter, workerId: string, dpRank: number): void {
  const at = w.open(DUMP_FRAME.worker);
  w.u32(dpRank);
  w.bytes(enc.encode(workerId));
  w.close(at);
}

function cursorsFrame(w: FrameWriter, cursors: Iterable<StreamCursor>): void {
  const cs = [...cursors];
  // The epochs go in a frame of their own, which a reader from before epochs skips as an unknown frame; a dump
  // without any keeps the bytes it had before them.
  if (cs.some((c) => c.epoch !== null)) {
    const at = w.open(DUMP_FRAME.cursorEpochs);
    for (const c of cs) {
      const b = c.epoch === null ? new Uint8Array(0) : enc.encode(c.epoch);
      w.u32(b.length);
      w.bytes(b);
    }
    w.close(at);
  }
  const at = w.open(DUMP_FRAME.cursors);
  for (const c of cs) {
    w.u32((c.complete ? DUMP_CURSOR_FLAGS.complete : 0) | (c.seq !== null ? DUMP_CURSOR_FLAGS.seq : 0) | (c.baseline !== null ? DUMP_CURSOR_FLAGS.baseline : 0));
    w.u32(c.dpRank);
    w.u64(c.seq ?? 0n);
    w.u64(c.baseline ?? 0n);
    const id = enc.encode(c.workerId);
    w.u32(id.length);
    w.bytes(id);
  }
  w.close(at);
}

function adaptersFrame(w: FrameWriter, names: Iterable<string>): void {
  const at = w.open(DUMP_FRAME.adapters);
  for (const name of names) {
    const b = enc.encode(name);
    w.u32(b.length);
    w.bytes(b);
  }
  w.close(at);
}

/** The binary body as a lazy sequence of chunks of about `chunkBytes` (one large event may make one bigger). */
export function* dumpBinaryChunks(source: DumpSource, chunkBytes = DUMP_CHUNK_BYTES): Generator<Uint8Array> {
  const w = new FrameWriter(chunkBytes);
  w.bytes(MAGIC);
  for (const m of source.models()) {
    modelFrame(w, m);
    if (m.eventsBinary !== undefined) {
      for (const item of m.eventsBinary(chunkBytes)) {
        if (item instanceof Uint8Array) w.frame(DUMP_FRAME.events, item);
        else workerFrame(w, item.workerId, item.dpRank);
        if (w.full) yield w.take();
      }
    } else {
      // Events as objects (tests, sources without a module): written into runs of one rank here.
      const run = new EventRunWriter();
      const frame = () => {
        if (run.length > 0) w.frame(DUMP_FRAME.events, run.take());
      };
      let last: RouterEvent | null = null;
      for (const e of m.events) {
        if (last === null || last.workerId !== e.workerId || last.dpRank !== e.dpRank) {
          frame();
          workerFrame(w, e.workerId, e.dpRank);
        }
        run.event(e);
        last = e;
        if (run.length * 8 >= chunkBytes) frame();
        if (w.full) yield w.take();
      }
      frame();
    }
    // After the events, as in JSON: each rank's cursor is read when its blocks are.
    if (m.cursors !== undefined) cursorsFrame(w, m.cursors());
    if (m.adapters !== undefined) adaptersFrame(w, m.adapters());
    if (w.full) yield w.take();
  }
  w.open(DUMP_FRAME.end);
  yield w.take();
}
