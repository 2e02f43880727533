// Block-hash normalisation: every engine hash becomes a u64 BigInt.

const U64 = 64;

/** Folds a bytes digest to u64: the low 64 bits of its big-endian value (what vLLM's int mode sends). */
export function foldHashBytes(b: Uint8Array): bigint {
  const n = b.length;
  if (n >= 8) {
    const o = n - 8;
    // Two u32 halves avoid a DataView allocation per hash on the hot path.
    const hi = ((b[o]! << 24) | (b[o + 1]! << 16) | (b[o + 2]! << 8) | b[o + 3]!) >>> 0;
    const lo = ((b[o + 4]! << 24) | (b[o + 5]! << 16) | (b[o + 6]! << 8) | b[o + 7]!) >>> 0;
    return (BigInt(hi) << 32n) | BigInt(lo);
  }
  let v = 0n;
  for (let i = 0; i < n; i++) v = (v << 8n) | BigInt(b[i]!);
  return v;
}

/** A decoded msgpack value as a u64 hash, or undefined when it is not a hash. */
export function toHash(v: unknown): bigint | undefined {
  if (typeof v === "bigint") return v >= 0n && v < 0x10000000000000000n ? v : BigInt.asUintN(U64, v);
  if (typeof v === "number") {
    if (!Number.isInteger(v)) return undefined;
    return v >= 0 ? BigInt(v) : BigInt.asUintN(U64, BigInt(v));
  }
  if (v instanceof Uint8Array) return foldHashBytes(v);
  return undefined;
}

/** A deterministic 32-byte digest whose low 64 bits are `h` (for bytes-mode publishers). */
export function hashToDigest(h: bigint): Uint8Array {
  const out = new Uint8Array(32);
  const dv = new DataView(out.buffer);
  // The high 24 bytes are filler derived from h so digests look like real ones but fold back to h.
  let x = h ^ 0x9e3779b97f4a7c15n;
  for (let i = 0; i < 3; i++) {
    x = BigInt.asUintN(U64, (x ^ (x >> 31n)) * 0xbf58476d1ce4e5b9n);
    dv.setBigUint64(i * 8, x);
  }
  dv.setBigUint64(24, BigInt.asUintN(U64, h));
  return out;
}
