// A request body that came in pieces, joined where a pool member can read it without a copy of its own.
//
// The body is joined once anyway (its caller forwards it, and reads it itself when the budget ends first); joined
// into a SharedArrayBuffer, the pool posts it to its member by reference (TokenizerPool.pump) instead of copying
// it again. Neither side writes to it: the caller forwards and reads its bytes, the member only reads them. Its
// memory goes once both threads have dropped it. A body that came whole (one piece, a view of its gRPC message)
// is left where it is: the pool copies it into a buffer of its own and transfers that, which measured cheaper on
// the sending thread than a copy into shared memory (bench/body-handoff.ts); unless its gRPC reader joined that
// message from network chunks, which it does in shared memory (the EPP's grpc-h2.ts), for the same reason.

/** `chunks` as one body (`total` bytes): the one chunk itself (none: empty), or more joined once into shared memory. */
export function joinBody(chunks: Uint8Array[], total: number): Uint8Array {
  if (chunks.length <= 1) return chunks[0] ?? EMPTY;
  const out = new Uint8Array(new SharedArrayBuffer(total));
  let off = 0;
  for (const c of chunks) {
    out.set(c, off);
    off += c.length;
  }
  return out;
}

/** Whether a member can be given `body` as it is: its bytes in shared memory, read by both threads. */
export function isShared(body: Uint8Array): boolean {
  return body.buffer instanceof SharedArrayBuffer;
}

const EMPTY = new Uint8Array(0);
