// XXH3-64 with a seed, written from the xxHash specification (doc/xxhash_spec.md): the local block hash
// of docs/CONTRACTS.md §3. WebAssembly has no 64x64->128 multiply, so mul128Fold64 composes 32-bit halves.

const PRIME32_1: u64 = 0x9E3779B1;
const PRIME32_2: u64 = 0x85EBCA77;
const PRIME32_3: u64 = 0xC2B2AE3D;
const PRIME64_1: u64 = 0x9E3779B185EBCA87;
const PRIME64_2: u64 = 0xC2B2AE3D27D4EB4F;
const PRIME64_3: u64 = 0x165667B19E3779F9;
const PRIME64_4: u64 = 0x85EBCA77C2B2AE63;
const PRIME64_5: u64 = 0x27D4EB2F165667C5;
const PRIME_MX1: u64 = 0x165667919E3779F9;
const PRIME_MX2: u64 = 0x9FB21C651E98DF25;

const SECRET_SIZE: usize = 192;
const SECRET_SIZE_MIN: usize = 136;
const STRIPE_LEN: usize = 64;

// The default 192-byte secret of the specification.
const K_SECRET: usize = memory.data<u8>([
  0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,
  0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,
  0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
  0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,
  0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,
  0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
  0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,
  0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,
  0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
  0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e,
  0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,
  0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
]);

// Long inputs with a non-zero seed use a secret derived from it; derived once per seed.
const CUSTOM_SECRET: usize = memory.data(192, 16);
let customSeed: u64 = 0;
let customReady = false;

@inline function r64(p: usize): u64 { return load<u64>(p); }
@inline function r32(p: usize): u64 { return <u64>load<u32>(p); }

@inline function mul128Fold64(a: u64, b: u64): u64 {
  const aLo = a & 0xFFFFFFFF, aHi = a >> 32, bLo = b & 0xFFFFFFFF, bHi = b >> 32;
  const loLo = aLo * bLo, hiLo = aHi * bLo, loHi = aLo * bHi, hiHi = aHi * bHi;
  const cross = (loLo >> 32) + (hiLo & 0xFFFFFFFF) + loHi;
  const upper = (hiLo >> 32) + (cross >> 32) + hiHi;
  const lower = (cross << 32) | (loLo & 0xFFFFFFFF);
  return lower ^ upper;
}

@inline function avalanche(h: u64): u64 {
  h ^= h >> 37;
  h *= PRIME_MX1;
  return h ^ (h >> 32);
}

@inline function xxh64Avalanche(h: u64): u64 {
  h ^= h >> 33;
  h *= PRIME64_2;
  h ^= h >> 29;
  h *= PRIME64_3;
  return h ^ (h >> 32);
}

@inline function rrmxmx(h: u64, len: u64): u64 {
  h ^= rotl<u64>(h, 49) ^ rotl<u64>(h, 24);
  h *= PRIME_MX2;
  h ^= (h >> 35) + len;
  h *= PRIME_MX2;
  return h ^ (h >> 28);
}

@inline function mix16(p: usize, s: usize, seed: u64): u64 {
  return mul128Fold64(r64(p) ^ (r64(s) + seed), r64(p + 8) ^ (r64(s + 8) - seed));
}

function len0to16(p: usize, len: usize, s: usize, seed: u64): u64 {
  if (len > 8) {
    const flip1 = (r64(s + 24) ^ r64(s + 32)) + seed;
    const flip2 = (r64(s + 40) ^ r64(s + 48)) - seed;
    const lo = r64(p) ^ flip1;
    const hi = r64(p + len - 8) ^ flip2;
    const acc = <u64>len + bswap<u64>(lo) + hi + mul128Fold64(lo, hi);
    return avalanche(acc);
  }
  if (len >= 4) {
    const s2 = seed ^ (<u64>bswap<u32>(<u32>seed) << 32);
    const in1 = r32(p), in2 = r32(p + len - 4);
    const flip = (r64(s + 8) ^ r64(s + 16)) - s2;
    return rrmxmx((in2 + (in1 << 32)) ^ flip, <u64>len);
  }
  if (len > 0) {
    const c1 = <u32>load<u8>(p), c2 = <u32>load<u8>(p + (len >> 1)), c3 = <u32>load<u8>(p + len - 1);
    const combined: u32 = (c1 << 16) | (c2 << 24) | c3 | (<u32>len << 8);
    const flip = (r32(s) ^ r32(s + 4)) + seed;
    return xxh64Avalanche(<u64>combined ^ flip);
  }
  return xxh64Avalanche(seed ^ (r64(s + 56) ^ r64(s + 64)));
}

function len17to128(p: usize, len: usize, s: usize, seed: u64): u64 {
  let acc = <u64>len * PRIME64_1;
  if (len > 32) {
    if (len > 64) {
      if (len > 96) {
        acc += mix16(p + 48, s + 96, seed);
        acc += mix16(p + len - 64, s + 112, seed);
      }
      acc += mix16(p + 32, s + 64, seed);
      acc += mix16(p + len - 48, s + 80, seed);
    }
    acc += mix16(p + 16, s + 32, seed);
    acc += mix16(p + len - 32, s + 48, seed);
  }
  acc += mix16(p, s, seed);
  acc += mix16(p + len - 16, s + 16, seed);
  return avalanche(acc);
}

function len129to240(p: usize, len: usize, s: usize, seed: u64): u64 {
  let acc = <u64>len * PRIME64_1;
  const rounds = len / 16;
  for (let i: usize = 0; i < 8; i++) acc += mix16(p + 16 * i, s + 16 * i, seed);
  acc = avalanche(acc);
  for (let i: usize = 8; i < rounds; i++) acc += mix16(p + 16 * i, s + 16 * (i - 8) + 3, seed);
  acc += mix16(p + len - 16, s + SECRET_SIZE_MIN - 17, seed);
  return avalanche(acc);
}

const ACC: usize = memory.data(64, 16);

@inline function accumulate512(p: usize, s: usize): void {
  for (let i: usize = 0; i < 8; i++) {
    const v = r64(p + 8 * i);
    const k = v ^ r64(s + 8 * i);
    store<u64>(ACC + 8 * (i ^ 1), load<u64>(ACC + 8 * (i ^ 1)) + v);
    store<u64>(ACC + 8 * i, load<u64>(ACC + 8 * i) + (k & 0xFFFFFFFF) * (k >> 32));
  }
}

function hashLong(p: usize, len: usize, s: usize): u64 {
  store<u64>(ACC, PRIME32_3); store<u64>(ACC + 8, PRIME64_1);
  store<u64>(ACC + 16, PRIME64_2); store<u64>(ACC + 24, PRIME64_3);
  store<u64>(ACC + 32, PRIME64_4); store<u64>(ACC + 40, PRIME32_2);
  store<u64>(ACC + 48, PRIME64_5); store<u64>(ACC + 56, PRIME32_1);
  const stripesPerBlock = (SECRET_SIZE - STRIPE_LEN) / 8;
  const blockLen = STRIPE_LEN * stripesPerBlock;
  const blocks = (len - 1) / blockLen;
  for (let b: usize = 0; b < blocks; b++) {
    for (let n: usize = 0; n < stripesPerBlock; n++) accumulate512(p + b * blockLen + n * STRIPE_LEN, s + n * 8);
    const ks = s + SECRET_SIZE - STRIPE_LEN;
    for (let i: usize = 0; i < 8; i++) {
      let a = load<u64>(ACC + 8 * i);
      a ^= a >> 47;
      a ^= r64(ks + 8 * i);
      store<u64>(ACC + 8 * i, a * PRIME32_1);
    }
  }
  const stripes = ((len - 1) - blockLen * blocks) / STRIPE_LEN;
  for (let n: usize = 0; n < stripes; n++) accumulate512(p + blocks * blockLen + n * STRIPE_LEN, s + n * 8);
  accumulate512(p + len - STRIPE_LEN, s + SECRET_SIZE - STRIPE_LEN - 7);
  let result = <u64>len * PRIME64_1;
  for (let i: usize = 0; i < 4; i++) {
    result += mul128Fold64(load<u64>(ACC + 16 * i) ^ r64(s + 11 + 16 * i), load<u64>(ACC + 16 * i + 8) ^ r64(s + 11 + 16 * i + 8));
  }
  return avalanche(result);
}

function customSecret(seed: u64): usize {
  if (!customReady || customSeed != seed) {
    for (let i: usize = 0; i < SECRET_SIZE / 16; i++) {
      store<u64>(CUSTOM_SECRET + 16 * i, r64(K_SECRET + 16 * i) + seed);
      store<u64>(CUSTOM_SECRET + 16 * i + 8, r64(K_SECRET + 16 * i + 8) - seed);
    }
    customSeed = seed;
    customReady = true;
  }
  return CUSTOM_SECRET;
}

export function xxh3(p: usize, len: usize, seed: u64): u64 {
  if (len <= 16) return len0to16(p, len, K_SECRET, seed);
  if (len <= 128) return len17to128(p, len, K_SECRET, seed);
  if (len <= 240) return len129to240(p, len, K_SECRET, seed);
  return hashLong(p, len, seed == 0 ? K_SECRET : customSecret(seed));
}
