// Intent ids: random from a cryptographic source, masked to 53 bits so they survive JSON (and every
// JS number) exactly, and never 0 (0 reads as "no id" in too many places).

/** Fills a buffer with random bytes; injectable so the masking can be tested on every input. */
export type RandomFill = (bytes: Uint8Array) => Uint8Array;

const cryptoFill: RandomFill = (bytes) => crypto.getRandomValues(bytes);

/** 53-bit id from 8 bytes (the top 11 bits dropped), or 0 when the masked value is 0. */
export function maskIntentId(bytes: Uint8Array): number {
  const view = new DataView(bytes.buffer, bytes.byteOffset, 8);
  const hi = view.getUint32(0) & 0x1f_ffff; // 21 bits
  const lo = view.getUint32(4); // 32 bits
  return hi * 0x1_0000_0000 + lo;
}

export function newIntentId(fill: RandomFill = cryptoFill): number {
  for (;;) {
    const id = maskIntentId(fill(new Uint8Array(8)));
    if (id !== 0) return id;
  }
}
