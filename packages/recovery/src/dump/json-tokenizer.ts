// An incremental (push) JSON tokenizer over UTF-8 bytes, written here rather than taken from JSON.parse for two
// hard constraints of the `/dump` body (docs/CONTRACTS.md §7): JSON.parse turns every integer into a double, so u64
// block hashes above 2^53 would silently lose bits, and it needs the whole body materialised in memory, while
// a dump of a large index must be consumed as a stream in bounded memory. Tokens go to a SAX-style handler as
// soon as their last byte arrives; chunk boundaries may fall anywhere (inside strings, escapes, numbers,
// literals). Integers are delivered exactly as two u32 halves; the grammar is validated strictly.

export class JsonSyntaxError extends Error {
  constructor(message: string, readonly offset: number) {
    super(`${message} at byte ${offset}`);
    this.name = "JsonSyntaxError";
  }
}

export interface JsonHandler {
  startObject(): void;
  endObject(): void;
  startArray(): void;
  endArray(): void;
  /** A key or string value as unescaped UTF-8 bytes in `buf[start, end)`; the view is only valid during the call. */
  key(buf: Uint8Array, start: number, end: number): void;
  string(buf: Uint8Array, start: number, end: number): void;
  /** A non-negative integer that fits u64, as `hi * 2^32 + lo`. */
  integer(hi: number, lo: number): void;
  /** Any other number (negative, fractional, exponent, or beyond u64): the dump never needs one exactly. */
  otherNumber(): void;
  literal(value: boolean | null): void;
  /**
   * Optional fast path for a hot object shape: called where an object value starts (`buf[i]` is '{');
   * returns the index after the whole object if the handler consumed it, or -1 to let the tokenizer parse it.
   */
  fastObject?(buf: Uint8Array, i: number): number;
}

/** Where scanU64 leaves its result. */
export type U64Parts = { hi: number; lo: number };
const scanned: U64Parts = { hi: 0, lo: 0 };

/**
 * Scans the decimal digits of a u64 at buf[i..] (first digit 1-9, or a lone 0) into `out` as u32 halves.
 * Returns the index after the digits, or -1 if there are none or the value exceeds u64. Exact: the first 15
 * digits accumulate in a double (< 2^53), the last (at most 5) are folded in on u32 halves.
 */
export function scanU64(buf: Uint8Array, i: number, out: U64Parts): number {
  const n = buf.length;
  let j = i;
  let acc = 0;
  const accEnd = Math.min(n, i + 15);
  for (; j < accEnd; j++) {
    const d = buf[j]! - 0x30;
    if (d < 0 || d > 9) break;
    acc = acc * 10 + d;
  }
  if (j === i || (buf[i] === 0x30 && j > i + 1)) return -1;
  let tail = 0;
  let tailDigits = 0;
  if (j === i + 15) {
    for (; j < n; j++, tailDigits++) {
      const d = buf[j]! - 0x30;
      if (d < 0 || d > 9) break;
      if (tailDigits === 5) return -1;
      tail = tail * 10 + d;
    }
  }
  if (tailDigits === 0) {
    out.hi = Math.floor(acc / TWO32);
    out.lo = acc - out.hi * TWO32;
    return j;
  }
  // acc * 10^k + tail, exactly, in u32 halves: acc = aH*2^32 + aL with aH < 2^18, every product < 2^53.
  const m = POW10[tailDigits]!;
  const aH = Math.floor(acc / TWO32);
  const aL = acc - aH * TWO32;
  const low = aL * m + tail;
  const carry = Math.floor(low / TWO32);
  const hi = aH * m + carry;
  if (hi >= TWO32) return -1;
  out.hi = hi;
  out.lo = low - carry * TWO32;
  return j;
}

export type TokenizerLimits = { maxDepth: number; maxStringBytes: number };

const enum Mode { Between, String, Number, Literal }
const enum Expect { Value, ValueOrEnd, KeyOrEnd, Key, Colon, CommaOrEnd, Eof }
const enum Num { Sign, Zero, Int, Frac0, Frac, Exp0, ExpSign, Exp }

const TWO32 = 4294967296;
const POW10 = [1, 10, 100, 1000, 10000, 100000, 1000000];
const LITERALS: Record<number, { bytes: Uint8Array; value: boolean | null }> = {
  0x74: { bytes: new TextEncoder().encode("true"), value: true },
  0x66: { bytes: new TextEncoder().encode("false"), value: false },
  0x6e: { bytes: new TextEncoder().encode("null"), value: null },
};

function isDelimiter(c: number): boolean {
  return c === 0x2c || c === 0x5d || c === 0x7d || c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09;
}

export class JsonTokenizer {
  private mode = Mode.Between;
  private expect = Expect.Value;
  private readonly stack: Uint8Array; // 1 = object, 2 = array
  private depth = 0;
  private offset = 0; // bytes consumed before the current chunk

  // string state (slow path: escapes or a chunk boundary inside the string)
  private strIsKey = false;
  private scratch = new Uint8Array(256);
  private scratchLen = 0;
  private escape = 0; // 0 none, 1 after '\', 2..5 reading \u hex digits
  private uCode = 0;
  private highSurrogate = 0;

  // number state: the first 15 digits in `acc` (exact in a double), the rest (at most 5 for a u64) in `tail`
  private numState = Num.Sign;
  private negative = false;
  private isInteger = true;
  private acc = 0;
  private accDigits = 0;
  private tail = 0;
  private tailDigits = 0;

  // literal state
  private lit: { bytes: Uint8Array; value: boolean | null } | null = null;
  private litPos = 0;

  constructor(private readonly h: JsonHandler, private readonly limits: TokenizerLimits) {
    this.stack = new Uint8Array(limits.maxDepth + 1);
  }

  get complete(): boolean {
    return this.expect === Expect.Eof && this.mode === Mode.Between;
  }

  push(buf: Uint8Array): void {
    const n = buf.length;
    let i = 0;
    while (i < n) {
      switch (this.mode) {
        case Mode.String:
          i = this.continueString(buf, i);
          break;
        case Mode.Number:
          i = this.continueNumber(buf, i);
          break;
        case Mode.Literal:
          i = this.continueLiteral(buf, i);
          break;
        default:
          i = this.between(buf, i);
      }
    }
    this.offset += n;
  }

  /** Call at end of input: throws unless exactly one complete JSON value was seen. */
  end(): void {
    if (this.mode === Mode.Number) {
      const s = this.numState;
      if (s !== Num.Zero && s !== Num.Int && s !== Num.Frac && s !== Num.Exp) this.fail("unexpected end of input in a number", 0);
      this.finishNumber();
    }
    if (!this.complete) this.fail(this.offset === 0 ? "empty body" : "unexpected end of input (truncated body)", 0);
  }

  private fail(msg: string, i: number): never {
    throw new JsonSyntaxError(msg, this.offset + i);
  }

  private between(buf: Uint8Array, i: number): number {
    const c = buf[i]!;
    if (c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09) return i + 1;
    switch (this.expect) {
      case Expect.Colon:
        if (c !== 0x3a) this.fail("expected ':'", i);
        this.expect = Expect.Value;
        return i + 1;
      case Expect.CommaOrEnd:
        if (c === 0x2c) {
          this.expect = this.stack[this.depth] === 1 ? Expect.Key : Expect.Value;
          return i + 1;
        }
        if (c === 0x7d && this.stack[this.depth] === 1) return this.close(i, true);
        if (c === 0x5d && this.stack[this.depth] === 2) return this.close(i, false);
        this.fail("expected ',' or the end of the container", i);
      case Expect.Key:
      case Expect.KeyOrEnd:
        if (c === 0x22) return this.beginString(buf, i + 1, true);
        if (c === 0x7d && this.expect === Expect.KeyOrEnd) return this.close(i, true);
        this.fail("expected an object key", i);
      case Expect.Eof:
        this.fail("unexpected data after the end of the body", i);
      default:
        if (c === 0x5d && this.expect === Expect.ValueOrEnd) return this.close(i, false);
        return this.beginValue(buf, i, c);
    }
  }

  private beginValue(buf: Uint8Array, i: number, c: number): number {
    if (c === 0x7b && this.h.fastObject !== undefined) {
      const j = this.h.fastObject(buf, i);
      if (j > 0) {
        this.valueDone();
        return j;
      }
    }
    if (c === 0x7b || c === 0x5b) {
      if (this.depth >= this.limits.maxDepth) this.fail("nesting too deep", i);
      const obj = c === 0x7b;
      this.stack[++this.depth] = obj ? 1 : 2;
      this.expect = obj ? Expect.KeyOrEnd : Expect.ValueOrEnd;
      if (obj) this.h.startObject();
      else this.h.startArray();
      return i + 1;
    }
    if (c === 0x22) return this.beginString(buf, i + 1, false);
    if (c >= 0x31 && c <= 0x39) {
      const j = this.fastInteger(buf, i);
      if (j > i) return j;
    }
    if ((c >= 0x30 && c <= 0x39) || c === 0x2d) {
      this.mode = Mode.Number;
      this.negative = c === 0x2d;
      this.isInteger = true;
      this.acc = 0;
      this.accDigits = 0;
      this.tail = 0;
      this.tailDigits = 0;
      this.numState = Num.Sign;
      return this.continueNumber(buf, this.negative ? i + 1 : i);
    }
    const lit = LITERALS[c];
    if (lit === undefined) this.fail(`unexpected byte 0x${c.toString(16)}`, i);
    this.mode = Mode.Literal;
    this.lit = lit;
    this.litPos = 1;
    return i + 1;
  }

  private valueDone(): void {
    this.expect = this.depth === 0 ? Expect.Eof : Expect.CommaOrEnd;
  }

  private close(i: number, obj: boolean): number {
    this.depth--;
    if (obj) this.h.endObject();
    else this.h.endArray();
    this.valueDone();
    return i + 1;
  }

  private beginString(buf: Uint8Array, i: number, isKey: boolean): number {
    // Fast path: the whole string sits in this chunk and has no escapes, so the handler reads it in place.
    const n = buf.length;
    for (let j = i; j < n; j++) {
      const c = buf[j]!;
      if (c === 0x22) {
        if (j - i > this.limits.maxStringBytes) this.fail("string too long", i);
        if (isKey) {
          this.h.key(buf, i, j);
          this.expect = Expect.Colon;
        } else {
          this.h.string(buf, i, j);
          this.valueDone();
        }
        return j + 1;
      }
      if (c === 0x5c || c < 0x20) break;
    }
    this.mode = Mode.String;
    this.strIsKey = isKey;
    this.scratchLen = 0;
    this.escape = 0;
    this.highSurrogate = 0;
    return i;
  }

  private put(b: number, i: number): void {
    if (this.scratchLen >= this.limits.maxStringBytes) this.fail("string too long", i);
    if (this.scratchLen === this.scratch.length) {
      const bigger = new Uint8Array(Math.min(this.scratch.length * 2, this.limits.maxStringBytes));
      bigger.set(this.scratch);
      this.scratch = bigger;
    }
    this.scratch[this.scratchLen++] = b;
  }

  private putCodePoint(cp: number, i: number): void {
    if (cp < 0x80) this.put(cp, i);
    else if (cp < 0x800) {
      this.put(0xc0 | (cp >> 6), i);
      this.put(0x80 | (cp & 0x3f), i);
    } else if (cp < 0x10000) {
      this.put(0xe0 | (cp >> 12), i);
      this.put(0x80 | ((cp >> 6) & 0x3f), i);
      this.put(0x80 | (cp & 0x3f), i);
    } else {
      this.put(0xf0 | (cp >> 18), i);
      this.put(0x80 | ((cp >> 12) & 0x3f), i);
      this.put(0x80 | ((cp >> 6) & 0x3f), i);
      this.put(0x80 | (cp & 0x3f), i);
    }
  }

  private flushSurrogate(i: number): void {
    // A lone UTF-16 surrogate cannot be UTF-8: it becomes U+FFFD, as TextDecoder would make it.
    if (this.highSurrogate !== 0) this.putCodePoint(0xfffd, i);
    this.highSurrogate = 0;
  }

  private continueString(buf: Uint8Array, i: number): number {
    const n = buf.length;
    for (; i < n; i++) {
      const c = buf[i]!;
      if (this.escape === 0) {
        if (c === 0x22) {
          this.flushSurrogate(i);
          this.mode = Mode.Between;
          if (this.strIsKey) {
            this.h.key(this.scratch, 0, this.scratchLen);
            this.expect = Expect.Colon;
          } else {
            this.h.string(this.scratch, 0, this.scratchLen);
            this.valueDone();
          }
          return i + 1;
        }
        if (c === 0x5c) {
          this.escape = 1;
          continue;
        }
        if (c < 0x20) this.fail("control character in a string", i);
        this.flushSurrogate(i);
        this.put(c, i);
      } else if (this.escape === 1) {
        if (c === 0x75) {
          this.escape = 2;
          this.uCode = 0;
          continue;
        }
        this.flushSurrogate(i);
        const simple = c === 0x22 ? 0x22 : c === 0x5c ? 0x5c : c === 0x2f ? 0x2f : c === 0x62 ? 8 : c === 0x66 ? 12 : c === 0x6e ? 10 : c === 0x72 ? 13 : c === 0x74 ? 9 : -1;
        if (simple < 0) this.fail("invalid escape", i);
        this.put(simple, i);
        this.escape = 0;
      } else {
        const d = c >= 0x30 && c <= 0x39 ? c - 0x30 : c >= 0x61 && c <= 0x66 ? c - 0x57 : c >= 0x41 && c <= 0x46 ? c - 0x37 : -1;
        if (d < 0) this.fail("invalid \\u escape", i);
        this.uCode = this.uCode * 16 + d;
        if (++this.escape < 6) continue;
        this.escape = 0;
        const u = this.uCode;
        if (u >= 0xdc00 && u <= 0xdfff && this.highSurrogate !== 0) {
          this.putCodePoint(0x10000 + ((this.highSurrogate - 0xd800) << 10) + (u - 0xdc00), i);
          this.highSurrogate = 0;
        } else {
          this.flushSurrogate(i);
          if (u >= 0xd800 && u <= 0xdbff) this.highSurrogate = u;
          else this.putCodePoint(u >= 0xdc00 && u <= 0xdfff ? 0xfffd : u, i);
        }
      }
    }
    return i;
  }

  private continueNumber(buf: Uint8Array, i: number): number {
    const n = buf.length;
    for (; i < n; i++) {
      const c = buf[i]!;
      const digit = c >= 0x30 && c <= 0x39;
      switch (this.numState) {
        case Num.Sign:
          if (!digit) this.fail("expected a digit", i);
          this.numState = c === 0x30 ? Num.Zero : Num.Int;
          this.addDigit(c - 0x30);
          continue;
        case Num.Zero:
        case Num.Int:
          if (digit) {
            if (this.numState === Num.Zero) this.fail("leading zero in a number", i);
            this.addDigit(c - 0x30);
            continue;
          }
          if (c === 0x2e) {
            this.isInteger = false;
            this.numState = Num.Frac0;
            continue;
          }
          if (c === 0x65 || c === 0x45) {
            this.isInteger = false;
            this.numState = Num.Exp0;
            continue;
          }
          break;
        case Num.Frac0:
        case Num.Frac:
          if (digit) {
            this.numState = Num.Frac;
            continue;
          }
          if (this.numState === Num.Frac && (c === 0x65 || c === 0x45)) {
            this.numState = Num.Exp0;
            continue;
          }
          if (this.numState === Num.Frac0) this.fail("expected a digit after '.'", i);
          break;
        case Num.Exp0:
        case Num.ExpSign:
          if (this.numState === Num.Exp0 && (c === 0x2b || c === 0x2d)) {
            this.numState = Num.ExpSign;
            continue;
          }
          if (!digit) this.fail("expected a digit in the exponent", i);
          this.numState = Num.Exp;
          continue;
        case Num.Exp:
          if (digit) continue;
          break;
      }
      if (!isDelimiter(c)) this.fail(`unexpected byte 0x${c.toString(16)} after a number`, i);
      this.finishNumber();
      return i;
    }
    return i;
  }

  /**
   * The hot path of a dump (two u64 per block): a plain integer wholly inside this chunk, scanned in a tight
   * loop. Returns the index after it, or `i` when the general state machine must take over (a chunk boundary,
   * a fraction or exponent, more than 20 digits).
   */
  private fastInteger(buf: Uint8Array, i: number): number {
    const j = scanU64(buf, i, scanned);
    if (j < 0 || j >= buf.length || !isDelimiter(buf[j]!)) return i;
    this.mode = Mode.Between;
    this.h.integer(scanned.hi, scanned.lo);
    this.valueDone();
    return j;
  }

  private addDigit(d: number): void {
    if (this.accDigits < 15) {
      this.acc = this.acc * 10 + d;
      this.accDigits++;
    } else {
      this.tail = this.tail * 10 + d;
      this.tailDigits++;
    }
  }

  private finishNumber(): void {
    this.mode = Mode.Between;
    if (this.negative || !this.isInteger || this.tailDigits > 5) {
      this.h.otherNumber();
    } else if (this.tailDigits === 0) {
      const hi = Math.floor(this.acc / TWO32);
      this.h.integer(hi, this.acc - hi * TWO32);
    } else {
      // acc * 10^k + tail, exactly, in u32 halves: acc = aH*2^32 + aL with aH < 2^18, every product < 2^53.
      const m = POW10[this.tailDigits]!;
      const aH = Math.floor(this.acc / TWO32);
      const aL = this.acc - aH * TWO32;
      const low = aL * m + this.tail;
      const carry = Math.floor(low / TWO32);
      const hi = aH * m + carry;
      if (hi >= TWO32) this.h.otherNumber();
      else this.h.integer(hi, low - carry * TWO32);
    }
    this.valueDone();
  }

  private continueLiteral(buf: Uint8Array, i: number): number {
    const lit = this.lit!;
    const n = buf.length;
    for (; i < n && this.litPos < lit.bytes.length; i++, this.litPos++) {
      if (buf[i] !== lit.bytes[this.litPos]) this.fail("invalid literal", i);
    }
    if (this.litPos === lit.bytes.length) {
      if (i < n && !isDelimiter(buf[i]!)) this.fail("invalid literal", i);
      // At a chunk end, a stray byte after the literal ("nullx") is caught by between() on the next chunk.
      this.mode = Mode.Between;
      this.h.literal(lit.value);
      this.valueDone();
    }
    return i;
  }
}
