// The bytes a gRPC call has received and not yet taken as messages, kept in a number of pieces that grows with
// their size, not with how many reads brought them: Bun's node:http2 hands on every DATA frame as its own
// Buffer (measured), and a client may send a message one byte per frame. Kept as they come, 256 KiB so would
// be 262,144 Buffer objects, each many times the size of its one byte. The receive budget counts heldBytes.

/** Chunks from this size are kept as they came (a view, no copy); smaller ones are copied together. */
const COPY_BELOW = 4 * 1024;
/** What small chunks are copied into, one after another (a block is replaced only once full). */
const BLOCK_BYTES = 16 * 1024;

export class ByteQueue {
  /** The pieces not yet taken start at `first` (taking from an index, not shift(): linear overall). */
  private pieces: Buffer[] = [];
  private first = 0;
  /** Where small chunks are copied, how much of it is used, and the piece that still grows in it (-1: none). */
  private block: Buffer | undefined;
  private used = 0;
  private growing = -1;
  private growingStart = 0;
  /** Bytes held. */
  length = 0;

  /**
   * What the receive budget counts for this queue: the bytes held, and the block small chunks are copied into at
   * its whole size while it is kept (two small chunks cost a block, not their few bytes), so its bytes count
   * twice; a full block replaced counts by the bytes still held in it.
   */
  get heldBytes(): number {
    return this.length + (this.block === undefined ? 0 : BLOCK_BYTES);
  }

  /** Pieces held: at most two per chunk of COPY_BELOW or more, and one per BLOCK_BYTES of smaller ones. */
  get pieceCount(): number {
    return this.pieces.length - this.first;
  }

  push(chunk: Buffer): void {
    if (chunk.length === 0) return;
    // A chunk into an empty queue is kept as it is: most are taken whole (a message in one frame) at once.
    if (chunk.length >= COPY_BELOW || this.length === 0) {
      this.pieces.push(chunk);
      this.growing = -1;
    } else {
      if (this.block === undefined || this.used + chunk.length > this.block.length) {
        this.block = Buffer.allocUnsafe(BLOCK_BYTES);
        this.used = 0;
        this.growing = -1;
      }
      chunk.copy(this.block, this.used);
      if (this.growing < 0) {
        this.growing = this.pieces.length;
        this.growingStart = this.used;
        this.pieces.push(EMPTY);
      }
      this.used += chunk.length;
      this.pieces[this.growing] = this.block.subarray(this.growingStart, this.used);
    }
    this.length += chunk.length;
  }

  /**
   * The next `n` bytes (n <= length): a view when they lie in one piece, else joined into `alloc(n)`. A view may
   * share its memory with bytes received after it (a block): it is the caller's to keep or copy.
   */
  take(n: number, alloc: (n: number) => Buffer): Buffer {
    if (n === 0) return EMPTY;
    this.length -= n;
    const head = this.pieces[this.first]!;
    let out: Buffer;
    if (head.length >= n) {
      out = head.subarray(0, n);
      this.consume(n);
    } else {
      out = alloc(n);
      for (let off = 0; off < n; ) {
        const p = this.pieces[this.first]!;
        const k = Math.min(p.length, n - off);
        p.copy(out, off, 0, k);
        off += k;
        this.consume(k);
      }
    }
    return out;
  }

  /** The first `n` bytes held (n <= length), left in place: a view when they lie in one piece, else a copy. */
  peek(n: number): Buffer {
    if (n === 0) return EMPTY;
    const head = this.pieces[this.first]!;
    if (head.length >= n) return head.subarray(0, n);
    const out = Buffer.allocUnsafe(n);
    for (let i = this.first, off = 0; off < n; i++) {
      const p = this.pieces[i]!;
      const k = Math.min(p.length, n - off);
      p.copy(out, off, 0, k);
      off += k;
    }
    return out;
  }

  /** Empty: nothing of it kept, the block neither (an idle call holds no 16 KiB). */
  clear(): void {
    this.pieces = [];
    this.first = 0;
    this.block = undefined;
    this.used = 0;
    this.growing = -1;
    this.length = 0;
  }

  /** Drops `k` bytes of the first piece (all of it or a part). */
  private consume(k: number): void {
    const p = this.pieces[this.first]!;
    if (k < p.length) {
      this.pieces[this.first] = p.subarray(k);
      if (this.growing === this.first) this.growingStart += k;
      return;
    }
    if (this.growing === this.first) this.growing = -1;
    // Let go of it now: a message's last piece may also start the next one, which keeps the array alive.
    this.pieces[this.first++] = EMPTY;
    if (this.first === this.pieces.length) this.clear();
    else if (this.first >= 1024 && this.first * 2 >= this.pieces.length) {
      // Taken pieces dropped from the array now and then: each piece is moved O(1) times on average.
      this.pieces = this.pieces.slice(this.first);
      if (this.growing >= 0) this.growing -= this.first;
      this.first = 0;
    }
  }
}

const EMPTY = Buffer.alloc(0);
