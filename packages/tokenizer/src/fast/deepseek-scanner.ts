import { unassignedForReference } from "./reference-unicode";
import { whitespaceEnd } from "./white-space";

/**
 * DeepSeek V3's pre-tokenizer, three Isolated Splits in a row, written as one scanner:
 *
 *   1. \p{N}{1,3}                   numbers, in runs of up to three
 *   2. [一-龥぀-ゟ゠-ヿ]+             CJK ideographs U+4E00..U+9FA5, hiragana, katakana
 *   3. [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+ | [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+
 *      | ?[\p{P}\p{S}]+[\r\n]* | \s*[\r\n]+ | \s+(?!\S) | \s+
 *
 * Each Split runs on every piece the one before made, matched or not; text no alternative matches stays a
 * piece of its own (a "gap", e.g. a control character). A piece of numbers passes the next two whole (no CJK, and
 * split 3 matches nothing in it); a CJK run is split again by split 3 (its blocks hold kana punctuation, marks). Measured: the three regexes through JavaScriptCore took about as long as
 * the BPE behind them (the cl100k scanner's reason too). Equality with the regexes is property-tested
 * (test/pre-tokenizer-scanners.test.ts), and with Hugging Face's Oniguruma through the tokenizer tests.
 */

/** The three patterns as tokenizer.json holds them (its "\r\n" inside classes are the characters themselves). */
export const DEEPSEEK_V3_PATTERNS = [
  "\\p{N}{1,3}",
  "[一-龥぀-ゟ゠-ヿ]+",
  "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
] as const;

/** Whether a pre-tokenizer's Splits, in order, are these three (Isolated, not inverted). */
export function isDeepSeekV3(splits: readonly { pattern?: { Regex?: string }; behavior?: string; invert?: boolean }[]): boolean {
  return splits.length === 3 &&
    splits.every((s, i) => s.pattern?.Regex === DEEPSEEK_V3_PATTERNS[i] && s.behavior === "Isolated" && !s.invert);
}

const UNKNOWN = 0;
const LETTER = 1; // \p{L}
const MARK = 2; // \p{M}
const NUMBER = 3; // \p{N}
const PUNCT = 4; // \p{P}
const SYMBOL = 5; // \p{S}
const SPACE = 6; // White_Space (Oniguruma's \s) other than \r and \n
const NEWLINE = 7; // \r, \n
const OTHER = 8;
const KIND = 15;
const CJK = 16; // split 2's class, a flag beside the kind
const WIDE = 32; // in `at`'s answer: the character takes two UTF-16 units

// Filled lazily from the regex engine's Unicode tables, the ones the regex path reads.
let classes: Uint8Array | null = null;
const IS = { L: /^\p{L}$/u, M: /^\p{M}$/u, N: /^\p{N}$/u, P: /^\p{P}$/u, S: /^\p{S}$/u, WS: /^\p{White_Space}$/u };

function classify(table: Uint8Array, cp: number): number {
  const s = String.fromCodePoint(cp);
  const k = cp === 13 || cp === 10 ? NEWLINE : unassignedForReference(cp) ? OTHER : IS.WS.test(s) ? SPACE : IS.L.test(s) ? LETTER : IS.M.test(s) ? MARK
    : IS.N.test(s) ? NUMBER : IS.P.test(s) ? PUNCT : IS.S.test(s) ? SYMBOL : OTHER;
  const cjk = (cp >= 0x4e00 && cp <= 0x9fa5) || (cp >= 0x3040 && cp <= 0x30ff) ? CJK : 0;
  return (table[cp] = k | cjk);
}

// The class of the character at i (kind | CJK), | WIDE when it is a surrogate pair (well-formed text).
function at(table: Uint8Array, text: string, i: number): number {
  const c = text.charCodeAt(i);
  if (c < 0xd800 || c >= 0xdc00) {
    const k = table[c]!;
    return k === UNKNOWN ? classify(table, c) : k;
  }
  const cp = 0x10000 + ((c - 0xd800) << 10) + (text.charCodeAt(i + 1) - 0xdc00);
  const k = table[cp]!;
  return (k === UNKNOWN ? classify(table, cp) : k) | WIDE;
}

function width(k: number): number {
  return k & WIDE ? 2 : 1;
}

function isAsciiLetter(c: number): boolean {
  return (c >= 0x41 && c <= 0x5a) || (c >= 0x61 && c <= 0x7a);
}

function isAsciiPunct(c: number): boolean {
  return (c >= 0x21 && c <= 0x2f) || (c >= 0x3a && c <= 0x40) || (c >= 0x5b && c <= 0x60) || (c >= 0x7b && c <= 0x7e);
}

/**
 * Splits text[start, end) into DeepSeek V3's pre-tokens: `emit(s, e)` for each, in order, covering the range.
 * Text is well-formed UTF-16 (the tokenizer makes it so). One pass cuts the range into split 3's subjects
 * (numbers apart, CJK runs, the rest), each then scanned by split 3.
 */
export function scanDeepSeekV3(text: string, start: number, end: number, emit: (s: number, e: number) => void): void {
  const table = classes ??= new Uint8Array(0x110000);
  let i = start;
  while (i < end) {
    const k = at(table, text, i);
    if ((k & KIND) === NUMBER) {
      // split 1; its pieces pass splits 2 and 3 whole (no CJK; split 3 matches nothing in numbers)
      let j = i + width(k);
      for (let count = 1; count < 3 && j < end; count++) {
        const n = at(table, text, j);
        if ((n & KIND) !== NUMBER) break;
        j += width(n);
      }
      emit(i, j);
      i = j;
      continue;
    }
    // A run of CJK (split 2's match) or of neither CJK nor numbers (its gap); kana punctuation and marks are in
    // the CJK blocks, so split 3 cuts either.
    const cjk = k & CJK;
    let j = i + width(k);
    while (j < end) {
      const n = at(table, text, j);
      if ((n & CJK) !== cjk || (n & KIND) === NUMBER) break;
      j += width(n);
    }
    splitWords(table, text, i, j, emit);
    i = j;
  }
}

// Split 3 on text[s, e), which is its whole subject (its end is the end of the string for the lookahead).
function splitWords(table: Uint8Array, text: string, s: number, e: number, emit: (s: number, e: number) => void): void {
  let gap = -1;
  let i = s;
  while (i < e) {
    const c = text.charCodeAt(i);
    const cls = at(table, text, i);
    const k = cls & KIND;
    const w = width(cls);
    let match = -1;
    if (isAsciiPunct(c) && i + 1 < e && isAsciiLetter(text.charCodeAt(i + 1))) {
      match = i + 2;
      while (match < e && isAsciiLetter(text.charCodeAt(match))) match++;
    } else if (k === LETTER || k === MARK) {
      // [^\r\n\p{L}\p{P}\p{S}]? takes a mark and gives it back if no letter follows: the run from i either way
      match = runLetterMark(table, text, i + w, e);
    } else if (k !== NEWLINE && k !== PUNCT && k !== SYMBOL && i + w < e && isLetterOrMark(at(table, text, i + w))) {
      match = runLetterMark(table, text, i + w, e);
    } else if (c === 32 && i + 1 < e && isPunctOrSymbol(at(table, text, i + 1))) {
      match = runPunctSymbol(table, text, i + 1, e);
    } else if (k === PUNCT || k === SYMBOL) {
      match = runPunctSymbol(table, text, i + w, e);
    } else if (k === SPACE || k === NEWLINE) {
      match = whitespaceEnd(text, i, e);
    }
    if (match < 0) {
      if (gap < 0) gap = i;
      i += w;
      continue;
    }
    if (gap >= 0) {
      emit(gap, i);
      gap = -1;
    }
    emit(i, match);
    i = match;
  }
  if (gap >= 0) emit(gap, e);
}

function isLetterOrMark(cls: number): boolean {
  const k = cls & KIND;
  return k === LETTER || k === MARK;
}

function isPunctOrSymbol(cls: number): boolean {
  const k = cls & KIND;
  return k === PUNCT || k === SYMBOL;
}

function runLetterMark(table: Uint8Array, text: string, j: number, e: number): number {
  while (j < e) {
    const cls = at(table, text, j);
    if (!isLetterOrMark(cls)) break;
    j += width(cls);
  }
  return j;
}

// [\p{P}\p{S}]+[\r\n]* from j.
function runPunctSymbol(table: Uint8Array, text: string, j: number, e: number): number {
  while (j < e) {
    const cls = at(table, text, j);
    if (!isPunctOrSymbol(cls)) break;
    j += width(cls);
  }
  while (j < e && (text.charCodeAt(j) === 13 || text.charCodeAt(j) === 10)) j++;
  return j;
}
