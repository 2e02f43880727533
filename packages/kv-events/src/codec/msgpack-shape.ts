// A pre-check of untrusted msgpack before msgpackr reads it. msgpackr allocates an array or map at
// the length its header declares and recurses per level: 32 random bytes declaring 81M elements took
// 1.7 s of event loop to fail, and deep nesting recurses until the stack overflows. One pass over the
// headers (spec: github.com/msgpack/msgpack/blob/master/spec.md) refuses both in time proportional to
// the payload.
import type { Unpackr } from "msgpackr";

/** Nesting deeper than this is refused (vLLM's batches and replica-agg messages are ~5 deep). */
export const MAX_MSGPACK_DEPTH = 64;

/**
 * Why `b` cannot be one well-formed msgpack value of sane shape, else undefined: a container that
 * declares more elements than bytes remain (each takes at least one), a length past the end,
 * nesting past MAX_MSGPACK_DEPTH, or the never-used type byte 0xc1. Bytes after the value are left
 * to the decoder.
 */
export function msgpackShapeError(b: Uint8Array): string | undefined {
  const view = new DataView(b.buffer, b.byteOffset, b.byteLength);
  let pos = 0;
  // Elements still to read at each open level (innermost last).
  const open: number[] = [1];
  while (open.length > 0) {
    if (open[open.length - 1] === 0) {
      open.pop();
      continue;
    }
    open[open.length - 1]!--;
    if (pos >= b.length) return "truncated";
    const t = b[pos++]!;
    let skip = 0;
    let items = -1;
    let short = false;
    const len = (bytes: 1 | 2 | 4) => {
      if (pos + bytes > b.length) {
        short = true;
        return 0;
      }
      const v = bytes === 1 ? b[pos]! : bytes === 2 ? view.getUint16(pos) : view.getUint32(pos);
      pos += bytes;
      return v;
    };
    if (t <= 0x7f || t >= 0xe0 || t === 0xc0 || t === 0xc2 || t === 0xc3) continue;
    if (t <= 0x8f) items = (t & 0x0f) * 2;
    else if (t <= 0x9f) items = t & 0x0f;
    else if (t <= 0xbf) skip = t & 0x1f;
    else if (t === 0xc4 || t === 0xd9) skip = len(1);
    else if (t === 0xc5 || t === 0xda) skip = len(2);
    else if (t === 0xc6 || t === 0xdb) skip = len(4);
    else if (t >= 0xc7 && t <= 0xc9) skip = len(t === 0xc7 ? 1 : t === 0xc8 ? 2 : 4) + 1; // ext: + type byte
    else if (t === 0xca || t === 0xcb) skip = t === 0xca ? 4 : 8;
    else if (t >= 0xcc && t <= 0xcf) skip = 1 << (t - 0xcc);
    else if (t >= 0xd0 && t <= 0xd3) skip = 1 << (t - 0xd0);
    else if (t >= 0xd4 && t <= 0xd8) skip = (1 << (t - 0xd4)) + 1; // fixext: + type byte
    else if (t === 0xdc || t === 0xdd) items = len(t === 0xdc ? 2 : 4);
    else if (t === 0xde || t === 0xdf) items = len(t === 0xde ? 2 : 4) * 2;
    else return "type byte 0xc1";
    if (short) return "truncated";
    if (items >= 0) {
      if (items > b.length - pos) return `a container of ${items} elements in ${b.length - pos} bytes`;
      if (open.length >= MAX_MSGPACK_DEPTH) return `nested deeper than ${MAX_MSGPACK_DEPTH}`;
      open.push(items);
    } else {
      pos += skip;
      if (pos > b.length) return "truncated";
    }
  }
  return undefined;
}

/** `unpackr.unpack(payload)` of untrusted bytes, after msgpackShapeError; throws with the reason. */
export function unpackUntrusted(unpackr: Unpackr, payload: Uint8Array): unknown {
  const shape = msgpackShapeError(payload);
  if (shape) throw new Error(shape);
  return unpackr.unpack(payload);
}
