/**
 * A growable byte buffer handed out in chunks of about `chunkBytes`, the one both `/dump` writers (JSON and
 * binary) fill. `slack` is room past `chunkBytes` so that the usual item after a chunk fills up needs no growth.
 */
export class ChunkBuffer {
  buf: Uint8Array;
  pos = 0;

  constructor(
    protected readonly chunkBytes: number,
    private readonly slack: number,
  ) {
    this.buf = new Uint8Array(chunkBytes + slack);
  }

  get full(): boolean {
    return this.pos >= this.chunkBytes;
  }

  /** Hands out the bytes written so far and starts a fresh buffer (the old one now belongs to the stream). */
  take(): Uint8Array {
    const out = this.buf.subarray(0, this.pos);
    this.replaced(new Uint8Array(this.chunkBytes + this.slack));
    this.pos = 0;
    return out;
  }

  ensure(n: number): void {
    if (this.pos + n <= this.buf.length) return;
    const bigger = new Uint8Array(Math.max(this.buf.length * 2, this.pos + n));
    bigger.set(this.buf.subarray(0, this.pos));
    this.replaced(bigger);
  }

  /** A run of bytes (one bulk copy). */
  bytes(b: Uint8Array): void {
    this.ensure(b.length);
    this.buf.set(b, this.pos);
    this.pos += b.length;
  }

  /** The buffer is now `buf` (a fresh chunk, or a grown copy); a subclass keeping a view of it renews that. */
  protected replaced(buf: Uint8Array): void {
    this.buf = buf;
  }
}
