import { describe, expect, test } from "bun:test";
import fc from "fast-check";
import { computeBlockHashes } from "../src/index.ts";
import { instantiate } from "../src/wasm-module.ts";

const PRIME32 = 2654435761n;
const PRIME64 = 11400714785074694797n;

// The xxHash sanity buffer: byte i is the top byte of PRIME32 * PRIME64^i (mod 2^64).
function sanityBuffer(len: number): Uint8Array {
  const buf = new Uint8Array(len);
  let gen = PRIME32;
  for (let i = 0; i < len; i++) {
    buf[i] = Number(gen >> 56n);
    gen = BigInt.asUintN(64, gen * PRIME64);
  }
  return buf;
}

// Published XXH3_64bits_withSeed vectors (xxHash cli/xsum_sanity_check.c), one per length class.
const vectors: [len: number, seed: bigint, hash: bigint][] = [
  [0, 0n, 0x2D06800538D394C2n], [0, PRIME64, 0xA8A6B918B2F0364An],
  [1, 0n, 0xC44BDFF4074EECDBn], [1, PRIME64, 0x032BE332DD766EF8n],
  [6, 0n, 0x27B56A84CD2D7325n], [6, PRIME64, 0x84589C116AB59AB9n],
  [12, 0n, 0xA713DAF0DFBB77E7n], [12, PRIME64, 0xE7303E1B2336DE0En],
  [24, 0n, 0xA3FE70BF9D3510EBn], [24, PRIME64, 0x850E80FC35BDD690n],
  [48, 0n, 0x397DA259ECBA1F11n], [48, PRIME64, 0xADC2CBAA44ACC616n],
  [80, 0n, 0xBCDEFBBB2C47C90An], [80, PRIME64, 0xC6DD0CB699532E73n],
  [195, 0n, 0xCD94217EE362EC3An], [195, PRIME64, 0xBA68003D370CB3D9n],
  [403, 0n, 0xCDEB804D65C6DEA4n], [403, PRIME64, 0x6259F6ECFD6443FDn],
  [512, 0n, 0x617E49599013CB6Bn], [512, PRIME64, 0x3CE457DE14C27708n],
  [2048, 0n, 0xDD59E2C3A5F038E0n], [2048, PRIME64, 0x66F81670669ABABCn],
  [2240, 0n, 0x6E73A90539CF2948n], [2240, PRIME64, 0x757BA8487D1B5247n],
  [2367, 0n, 0xCB37AEB9E5D361EDn], [2367, PRIME64, 0xD2DB3415B942B42An],
];

const ex = instantiate();
function wasmXxh3(bytes: Uint8Array, seed: bigint): bigint {
  const p = ex.reserve(Math.max(bytes.length, 1));
  new Uint8Array(ex.memory.buffer, p, bytes.length).set(bytes);
  const h = BigInt.asUintN(64, ex.hashBytes(p, bytes.length, seed));
  ex.release(p, Math.max(bytes.length, 1));
  return h;
}

describe("XXH3-64 in WebAssembly", () => {
  test("matches the published seeded test vectors for every length class", () => {
    const buf = sanityBuffer(2367);
    for (const [len, seed, want] of vectors) {
      expect({ len, seed, hash: wasmXxh3(buf.subarray(0, len), seed) }).toEqual({ len, seed, hash: want });
    }
  });

  test("agrees with Bun.hash.xxHash3 under seed 1337 on random inputs of any length", () => {
    fc.assert(fc.property(fc.uint8Array({ maxLength: 1200, size: "max" }), (bytes) => {
      expect(wasmXxh3(bytes, 1337n)).toBe(Bun.hash.xxHash3(bytes, 1337n));
    }), { numRuns: 500 });
  });
});

describe("computeBlockHashes", () => {
  test("hashes each full block of u32 little-endian token ids with seed 1337 and ignores the partial tail", () => {
    fc.assert(fc.property(
      fc.array(fc.nat({ max: 0xffffffff }), { maxLength: 300, size: "max" }), fc.integer({ min: 1, max: 80 }),
      (tokens, blockSize) => {
        const ids = Uint32Array.from(tokens);
        const got = computeBlockHashes(ids, blockSize);
        const n = Math.floor(ids.length / blockSize);
        expect(got.length).toBe(n);
        for (let i = 0; i < n; i++) {
          const le = new Uint8Array(blockSize * 4);
          const dv = new DataView(le.buffer);
          for (let j = 0; j < blockSize; j++) dv.setUint32(4 * j, ids[i * blockSize + j]!, true);
          expect(got[i]).toBe(Bun.hash.xxHash3(le, 1337n));
        }
      },
    ), { numRuns: 200 });
  });

  test("a block's hash does not depend on its position (local hash)", () => {
    const a = computeBlockHashes(Uint32Array.from([1, 2, 3, 4, 9, 9, 9, 9]), 4);
    const b = computeBlockHashes(Uint32Array.from([9, 9, 9, 9, 1, 2, 3, 4]), 4);
    expect(a[0]).toBe(b[1]);
    expect(a[1]).toBe(b[0]);
  });
});
