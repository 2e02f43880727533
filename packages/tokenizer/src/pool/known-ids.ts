// The exact prefix a member tells of a long job, report by report (protocol.ts, "known"), kept whole on the
// decision thread for its caller's `decides` and for an answer before the job ends.

/**
 * `known` with `added` after it. Written into the room after `known` in its buffer when there is some, else into a
 * new buffer of twice the length (the first report's array is adopted as it came): a prefix told in k reports costs
 * copies of O(its length) in all, not O(k x length). Views of the prefix given out before keep their ids (only what
 * follows them is written); `known`'s buffer must be the pool's alone (transferred to it, or made here).
 */
export function appendIds(known: Uint32Array | undefined, added: Uint32Array): Uint32Array {
  if (known === undefined) return added;
  if (added.length === 0) return known;
  const length = known.length + added.length;
  const room = known.buffer.byteLength - known.byteOffset >= length * Uint32Array.BYTES_PER_ELEMENT;
  const out = room ? new Uint32Array(known.buffer, known.byteOffset, length) : new Uint32Array(new ArrayBuffer(2 * length * Uint32Array.BYTES_PER_ELEMENT), 0, length);
  if (!room) out.set(known);
  out.set(added, known.length);
  return out;
}
