// Incremental inbound ZMTP stream parser: the 64-byte greeting, then frames.
// Written by hand (no library speaks ZMTP under Bun). Hot-path choices, measured by
// bench/events.bench.ts: a frame that lies inside one TCP chunk is handed out as a subarray
// of that chunk (no copy); only a frame split across chunks is copied, once, into a buffer of
// its exact size (past EAGER_FRAME bytes, grown as its bytes arrive: a header declaring 64 MiB costs
// what was sent, not 64 MiB); a split header (< 9 bytes) is the only thing ever concatenated.
import { FLAG_LONG, GREETING_SIZE } from "./wire.ts";

export type ParserSink = {
  /** Return an error string to reject the greeting. */
  greeting(g: Buffer): string | undefined;
  /** flags: MORE / COMMAND bits as on the wire. Return an error string to stop. */
  frame(flags: number, body: Buffer): string | undefined;
};

/** Frames up to this size get their whole buffer at once; larger ones grow by doubling as bytes arrive. */
export const EAGER_FRAME = 1024 * 1024;

export class ZmtpParser {
  private head: Buffer | null = null; // unparsed tail shorter than a header (or greeting)
  private body: Buffer | null = null; // frame body being filled across chunks
  private bodySize = 0; // its declared size (body.length may still be below it)
  private bodyFill = 0;
  private bodyFlags = 0;
  private greeted = false;
  /** Set once the stream is unusable; further input is ignored. */
  error: string | null = null;

  /** The largest frame accepted; the connection raises it once the handshake is done. */
  maxFrame: number;

  constructor(
    private readonly sink: ParserSink,
    maxFrame: number,
  ) {
    this.maxFrame = maxFrame;
  }

  push(chunk: Buffer): void {
    if (this.error !== null) return;
    let off = 0;
    if (this.body !== null) {
      off = this.fillBody(chunk);
      if (this.body !== null || this.error !== null) return;
    }
    if (this.head !== null) {
      chunk = Buffer.concat([this.head, chunk.subarray(off)]);
      this.head = null;
      off = 0;
    }
    const len = chunk.length;
    if (!this.greeted) {
      if (len - off < GREETING_SIZE) {
        // Signature check early, so garbage is rejected without waiting for 64 bytes.
        if (len > off && chunk[off] !== 0xff) return this.fail("bad signature");
        this.head = chunk.subarray(off);
        return;
      }
      const err = this.sink.greeting(chunk.subarray(off, off + GREETING_SIZE));
      if (err !== undefined) return this.fail(err);
      this.greeted = true;
      off += GREETING_SIZE;
    }
    while (off < len) {
      const flags = chunk[off]!;
      if (flags & 0xf8) return this.fail(`reserved frame flags 0x${flags.toString(16)}`);
      let size: number;
      let start: number;
      if (flags & FLAG_LONG) {
        if (len - off < 9) break;
        const hi = chunk.readUInt32BE(off + 1);
        size = hi * 0x100000000 + chunk.readUInt32BE(off + 5);
        start = off + 9;
      } else {
        if (len - off < 2) break;
        size = chunk[off + 1]!;
        start = off + 2;
      }
      if (size > this.maxFrame) return this.fail(`frame of ${size} bytes exceeds the maximum ${this.maxFrame}`);
      const end = start + size;
      if (end > len) {
        // Split frame: copy once into an exact-size body (never re-concatenate growing buffers).
        this.body = Buffer.allocUnsafe(size <= EAGER_FRAME ? size : Math.min(size, Math.max(EAGER_FRAME, 2 * (len - start))));
        this.bodySize = size;
        chunk.copy(this.body, 0, start, len);
        this.bodyFill = len - start;
        this.bodyFlags = flags;
        return;
      }
      const err = this.sink.frame(flags & ~FLAG_LONG, chunk.subarray(start, end));
      if (err !== undefined) return this.fail(err);
      if (this.error !== null) return;
      off = end;
    }
    if (off < len) this.head = chunk.subarray(off);
  }

  private fillBody(chunk: Buffer): number {
    let body = this.body!;
    const n = Math.min(this.bodySize - this.bodyFill, chunk.length);
    if (this.bodyFill + n > body.length) {
      const grown = Buffer.allocUnsafe(Math.min(this.bodySize, Math.max(2 * body.length, this.bodyFill + n)));
      body.copy(grown, 0, 0, this.bodyFill);
      this.body = body = grown;
    }
    chunk.copy(body, this.bodyFill, 0, n);
    this.bodyFill += n;
    if (this.bodyFill < this.bodySize) return n;
    this.body = null;
    const err = this.sink.frame(this.bodyFlags & ~FLAG_LONG, body);
    if (err !== undefined) this.fail(err);
    return n;
  }

  private fail(reason: string): void {
    this.error = reason;
    this.head = null;
    this.body = null;
  }
}
