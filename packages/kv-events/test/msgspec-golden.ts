// Golden payloads written by msgpackr (an independent msgpack writer) in the exact field order and
// widths the producers' msgspec structs write, so a test compares our codec against bytes we did not
// write by hand. msgspec and msgpackr agree on: fixmap/fixarray/fixstr headers, narrowest unsigned
// ints below 2^32, float64 for non-integral floats, nil, bin for bytes, uint64 (0xcf) at or above 2^63.
// They differ on integral floats (msgpackr writes an int, msgspec a float64) and on ints in
// [2^32, 2^63) (msgpackr writes int64 0xd3, msgspec uint64 0xcf): the goldens avoid both (non-integral
// ts, hashes below 2^32 or at/above 2^63), which `msgspecBytes` checks.
import { Packr } from "msgpackr";

const packr = new Packr({ useRecords: false, variableMapSize: true });

/** msgspec's bytes for `value`, a JS rendering of the producer's struct (maps in declaration order). */
export function msgspecBytes(value: unknown): Buffer {
  check(value);
  return Buffer.from(packr.pack(value));
}

function check(v: unknown): void {
  if (typeof v === "bigint" && v >= 2n ** 32n && v < 2n ** 63n) throw new Error(`${v}: msgpackr and msgspec write this width differently`);
  if (typeof v === "number" && Number.isInteger(v) && (v >= 2 ** 32 || v < -(2 ** 31))) throw new Error(`${v}: out of the shared int range`);
  if (Array.isArray(v)) v.forEach(check);
  else if (v && typeof v === "object" && !(v instanceof Uint8Array)) Object.values(v).forEach(check);
}
