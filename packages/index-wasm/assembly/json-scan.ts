// Top-level fields of a JSON object, with the whole text validated (RFC 8259 grammar), for the EPP's
// request path: JSON.parse of an 8k-token prompt builds a 50 KB string and an 8k-element JS array per
// request, only for the picker to copy the ids into a Uint32Array (measured in packages/epp/bench:
// ~130 µs of a ~600 µs decision, and most of its garbage). Here arrays of plain unsigned integers under
// a wanted key are decoded straight to u32s.
//
// jsonScan returns 1 when the text is one JSON object and `info` describes the wanted keys, 0 for
// anything else and for what it leaves to JSON.parse (nesting deeper than MAX_DEPTH, a top-level key
// written with escapes, a wanted key given twice): the caller then parses with JSON.parse, which
// decides. Bytes >= 0x80 are accepted inside strings only (a decoder maps bad UTF-8 to U+FFFD there).
//
// info, per wanted key (KEY_INFO bytes): kind u32 | value start u32 | value end u32 (byte offsets)
// | first u32 and count u32 of its decoded u32s in `out` (kind UINTS).

const ABSENT: u32 = 0;
const STRING: u32 = 1;
const UINTS: u32 = 2;
const OTHER: u32 = 3;
const KEY_INFO: usize = 20;
const MAX_DEPTH: i32 = 256;
const FAIL: usize = 0; // positions are addresses in linear memory, never 0

let base: usize = 0;
let end: usize = 0;
let keysAt: usize = 0;
let wanted: u32 = 0;
let infoAt: usize = 0;
let outAt: usize = 0;
let outTop: u32 = 0;

@inline function isWs(c: u32): bool { return c == 0x20 || c == 0x0A || c == 0x0D || c == 0x09; }
@inline function isDigit(c: u32): bool { return c - 0x30 <= 9; }
@inline function isHex(c: u32): bool { return c - 0x30 <= 9 || (c | 0x20) - 0x61 <= 5; }
@inline function at(p: usize): u32 { return <u32>load<u8>(p); }

function skipWs(p: usize): usize {
  while (p < end && isWs(at(p))) p++;
  return p;
}

/** Set by nextItem: it stepped past the container's closing byte. */
let closed = false;

/**
 * After an array element or object member: past `,` and whitespace to the next item, or past the
 * closing byte `close` (then `closed` is set); FAIL for anything else.
 */
@inline function nextItem(p: usize, close: u32): usize {
  p = skipWs(p);
  if (p >= end) return FAIL;
  const c = at(p);
  closed = c == close;
  if (closed) return p + 1;
  return c == 0x2C ? skipWs(p + 1) : FAIL;
}

/** p at the opening quote; returns the position after the closing one. */
function scanString(p: usize): usize {
  p++;
  while (p < end) {
    const c = at(p);
    if (c == 0x22) return p + 1;
    if (c == 0x5C) {
      if (p + 1 >= end) return FAIL;
      const e = at(p + 1);
      if (e == 0x75) {
        if (p + 6 > end) return FAIL;
        if (!(isHex(at(p + 2)) && isHex(at(p + 3)) && isHex(at(p + 4)) && isHex(at(p + 5)))) return FAIL;
        p += 6;
      } else if (e == 0x22 || e == 0x5C || e == 0x2F || e == 0x62 || e == 0x66 || e == 0x6E || e == 0x72 || e == 0x74) {
        p += 2;
      } else return FAIL;
    } else if (c < 0x20) return FAIL;
    else p++;
  }
  return FAIL;
}

function digits(p: usize): usize {
  while (p < end && isDigit(at(p))) p++;
  return p;
}

function scanNumber(p: usize): usize {
  if (at(p) == 0x2D) p++;
  if (p >= end) return FAIL;
  const c = at(p);
  if (c == 0x30) p++;
  else if (c - 0x31 <= 8) p = digits(p + 1);
  else return FAIL;
  if (p < end && at(p) == 0x2E) {
    const s = p + 1;
    p = digits(s);
    if (p == s) return FAIL;
  }
  if (p < end && (at(p) | 0x20) == 0x65) {
    p++;
    if (p < end && (at(p) == 0x2B || at(p) == 0x2D)) p++;
    const s = p;
    p = digits(s);
    if (p == s) return FAIL;
  }
  return p;
}

/** `word` holds the literal's bytes little-endian (e.g. "true" = 0x65757274). */
function scanLiteral(p: usize, word: u64, len: usize): usize {
  if (p + len > end) return FAIL;
  for (let k: usize = 0; k < len; k++) if (at(p + k) != <u32>((word >> (k << 3)) & 0xFF)) return FAIL;
  return p + len;
}

function scanValue(p: usize, depth: i32): usize {
  if (p >= end) return FAIL;
  const c = at(p);
  if (c == 0x22) return scanString(p);
  if (c == 0x7B) return scanObject(p, depth + 1, false);
  if (c == 0x5B) return scanArray(p, depth + 1);
  if (c == 0x74) return scanLiteral(p, 0x65757274, 4); // true
  if (c == 0x66) return scanLiteral(p, 0x65736C6166, 5); // false
  if (c == 0x6E) return scanLiteral(p, 0x6C6C756E, 4); // null
  if (c == 0x2D || isDigit(c)) return scanNumber(p);
  return FAIL;
}

function scanArray(p: usize, depth: i32): usize {
  if (depth > MAX_DEPTH) return FAIL;
  p = skipWs(p + 1);
  if (p < end && at(p) == 0x5D) return p + 1;
  while (true) {
    p = scanValue(p, depth);
    if (p == FAIL) return FAIL;
    p = nextItem(p, 0x5D);
    if (p == FAIL || closed) return p;
  }
}

/**
 * The value and length of the digit run at p when it is 1..7 digits (SWAR: eight bytes at a time, no
 * branch on the length, which is what a byte loop mispredicts once per token); 0 length otherwise.
 * The text is followed by 8 zero bytes (jsonScan), so the load never reads digits past its end.
 */
let runLen: u32 = 0;
@inline function shortDigitRun(p: usize): u32 {
  const x = load<u64>(p);
  const nonDigit = ((x & 0xF0F0F0F0F0F0F0F0) ^ 0x3030303030303030) | (((x + 0x0606060606060606) & 0xF0F0F0F0F0F0F0F0) ^ 0x3030303030303030);
  const n = <u32>(ctz<u64>(nonDigit) >> 3); // 8 when all eight are digits
  runLen = n == 8 ? 0 : n;
  // digits moved to the top bytes (leading zeros below), then 8-digit decimal -> binary in 3 multiplies
  let y = (x & 0x0F0F0F0F0F0F0F0F) << (<u64>(8 - n) << 3);
  y = y * 10 + (y >> 8);
  y = (((y & 0x000000FF000000FF) * 0x000F424000000064) + (((y >> 16) & 0x000000FF000000FF) * 0x0000271000000001)) >> 32;
  return <u32>y;
}

/**
 * An array of plain unsigned integers that fit u32 (no sign, fraction, exponent), decoded to out;
 * FAIL (and nothing kept) for any other array, which the caller then scans as a generic value.
 */
function scanUints(p: usize, info: usize): usize {
  const first = outTop;
  p = skipWs(p + 1);
  if (p < end && at(p) == 0x5D) {
    store<u32>(info, first, 12);
    store<u32>(info, 0, 16);
    return p + 1;
  }
  while (true) {
    if (p >= end) break;
    let v: u64 = <u64>shortDigitRun(p);
    let n = <usize>runLen;
    if (n == 0) {
      // not a digit, or 8+ digits: byte by byte
      let c = at(p) - 0x30;
      if (c > 9) break;
      v = 0;
      const s = p;
      while (p < end) {
        c = at(p) - 0x30;
        if (c > 9) break;
        v = v * 10 + <u64>c;
        p++;
        if (v > 0xFFFFFFFF) break;
      }
      if (v > 0xFFFFFFFF) break;
      n = p - s;
      p = s;
    }
    if (at(p) == 0x30 && n > 1) break; // 01
    p += n;
    if (p < end) {
      const d = at(p);
      if (d == 0x2E || (d | 0x20) == 0x65) break; // 1.5, 1e3
    }
    store<u32>(outAt + (<usize>outTop << 2), <u32>v);
    outTop++;
    // compact "1,2,3": no whitespace to skip (nextItem costs ~40% more on an 8k-id body)
    if (p + 1 < end && at(p) == 0x2C && isDigit(at(p + 1))) {
      p++;
      continue;
    }
    p = nextItem(p, 0x5D);
    if (p == FAIL) break;
    if (closed) {
      store<u32>(info, first, 12);
      store<u32>(info, outTop - first, 16);
      return p;
    }
  }
  outTop = first;
  return FAIL;
}

/** The wanted key's index for the key bytes [ks, ke), -1 for none, -2 for a key written with escapes. */
function wantedKey(ks: usize, ke: usize): i32 {
  const len = ke - ks;
  for (let p = ks; p < ke; p++) if (at(p) == 0x5C) return -2;
  for (let i: u32 = 0; i < wanted; i++) {
    const off = <usize>load<u32>(keysAt + (<usize>i << 3));
    const klen = <usize>load<u32>(keysAt + (<usize>i << 3), 4);
    if (klen == len && memory.compare(keysAt + off, ks, len) == 0) return <i32>i;
  }
  return -1;
}

function scanObject(p: usize, depth: i32, top: bool): usize {
  if (depth > MAX_DEPTH) return FAIL;
  p = skipWs(p + 1);
  if (p < end && at(p) == 0x7D) return p + 1;
  while (true) {
    if (p >= end || at(p) != 0x22) return FAIL;
    const ks = p;
    p = scanString(p);
    if (p == FAIL) return FAIL;
    let want: i32 = -1;
    if (top) {
      want = wantedKey(ks + 1, p - 1);
      if (want == -2) return FAIL;
    }
    p = skipWs(p);
    if (p >= end || at(p) != 0x3A) return FAIL;
    p = skipWs(p + 1);
    if (want >= 0) {
      const info = infoAt + <usize>want * KEY_INFO;
      if (load<u32>(info) != ABSENT) return FAIL; // JSON.parse keeps the last of duplicates: let it
      const vs = p;
      let kind = UINTS;
      let q: usize = p < end && at(p) == 0x5B ? scanUints(p, info) : FAIL;
      if (q == FAIL) {
        q = scanValue(p, depth);
        if (q == FAIL) return FAIL;
        kind = at(vs) == 0x22 ? STRING : OTHER;
      }
      store<u32>(info, kind);
      store<u32>(info, <u32>(vs - base), 4);
      store<u32>(info, <u32>(q - base), 8);
      p = q;
    } else {
      p = scanValue(p, depth);
      if (p == FAIL) return FAIL;
    }
    p = nextItem(p, 0x7D);
    if (p == FAIL || closed) return p;
  }
}

/**
 * Scans the JSON text at [p, p + len), which has 8 writable bytes after it. keys: nKeys (offset u32,
 * length u32) pairs, offsets from `keys` to each key's bytes. out: room for (len >> 1) + 1 u32s.
 */
export function jsonScan(p: usize, len: usize, keys: usize, nKeys: u32, info: usize, out: usize): u32 {
  base = p;
  end = p + len;
  keysAt = keys;
  wanted = nKeys;
  infoAt = info;
  outAt = out;
  outTop = 0;
  store<u64>(end, 0); // the 8 bytes after the text (reserved by the caller) end any digit run
  memory.fill(info, 0, <usize>nKeys * KEY_INFO);
  let q = skipWs(p);
  if (q >= end || at(q) != 0x7B) return 0;
  q = scanObject(q, 1, true);
  if (q == FAIL) return 0;
  return skipWs(q) == end ? 1 : 0;
}
