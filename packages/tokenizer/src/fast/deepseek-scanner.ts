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

// Filled lazily from the regex engine's Unicode tables, the ones the regex path reads.
let classes: Uint8Array | null = null;
const IS = { L: /^\p{L}$/u, M: /^\p{M}$/u, N: /^\p{N}$/u, P: /^\p{P}$/u, S: /^\p{S}$/u, WS: /^\p{White_Space}$/u };

function classify(table: Uint8Array, cp: number): number {
  const s = String.fromCodePoint(cp);
  const k = cp === 13 || cp === 10 ? NEWLINE : IS.WS.test(s) ? SPACE : IS.L.test(s) ? LETTER : IS.M.test(s) ? MARK
    : IS.N.test(s) ? NUMBER : IS.P.test(s) ? PUNCT : IS.S.test(s) ? SYMBOL : OTHER;
  table[cp] = k;
  return k;
}

function isCjk(cp: number): boolean {
  return (cp >= 0x4e00 && cp <= 0x9fa5) || (cp >= 0x3040 && cp <= 0x30ff);
}

function isAsciiLetter(c: number): boolean {
  return (c >= 0x41 && c <= 0x5a) || (c >= 0x61 && c <= 0x7a);
}

function isAsciiPunct(c: number): boolean {
  return (c >= 0x21 && c <= 0x2f) || (c >= 0x3a && c <= 0x40) || (c >= 0x5b && c <= 0x60) || (c >= 0x7b && c <= 0x7e);
}

/**
 * Splits text[start, end) into DeepSeek V3's pre-tokens: `emit(s, e)` for each, in order, covering the range.
 * Text is well-formed UTF-16 (the tokenizer makes it so).
 */
export function scanDeepSeekV3(text: string, start: number, end: number, emit: (s: number, e: number) => void): void {
  const table = classes ??= new Uint8Array(0x110000);
  // Code point and class at i; width in UTF-16 units.
  let width = 1;
  let cp = 0;
  const at = (i: number): number => {
    cp = text.charCodeAt(i);
    width = 1;
    if (cp >= 0xd800 && cp < 0xdc00) {
      cp = 0x10000 + ((cp - 0xd800) << 10) + (text.charCodeAt(i + 1) - 0xdc00);
      width = 2;
    }
    const k = table[cp]!;
    return k === UNKNOWN ? classify(table, cp) : k;
  };

  // Split 1: runs of numbers, cut every three; the rest goes to split 2.
  let from = start;
  let i = start;
  while (i < end) {
    if (at(i) !== NUMBER) {
      i += width;
      continue;
    }
    if (from < i) splitCjk(from, i);
    let count = 0;
    let j = i;
    while (j < end && at(j) === NUMBER) {
      j += width;
      if (++count === 3) {
        emit(i, j);
        i = j;
        count = 0;
      }
    }
    if (i < j) emit(i, j);
    from = i = j;
  }
  if (from < end) splitCjk(from, end);

  // Split 2: runs of CJK; everything goes on to split 3, each piece on its own.
  function splitCjk(s: number, e: number): void {
    let from = s;
    let i = s;
    while (i < e) {
      at(i);
      if (!isCjk(cp)) {
        i += width;
        continue;
      }
      let j = i + width; // before splitWords, which moves `width`
      if (from < i) splitWords(from, i);
      while (j < e && (at(j), isCjk(cp))) j += width;
      splitWords(i, j); // kana punctuation and marks are in these blocks
      from = i = j;
    }
    if (from < e) splitWords(from, e);
  }

  // Split 3 on text[s, e), which is the whole subject (its end is the end of the string for the lookahead).
  function splitWords(s: number, e: number): void {
    const runLetterMark = (j: number): number => {
      while (j < e) {
        const k = at(j);
        if (k !== LETTER && k !== MARK) break;
        j += width;
      }
      return j;
    };
    const runPunctSymbol = (j: number): number => {
      while (j < e) {
        const k = at(j);
        if (k !== PUNCT && k !== SYMBOL) break;
        j += width;
      }
      while (j < e && (text.charCodeAt(j) === 13 || text.charCodeAt(j) === 10)) j++;
      return j;
    };
    let gap = -1;
    let i = s;
    while (i < e) {
      const c = text.charCodeAt(i);
      const k = at(i);
      const w = width;
      let match = -1;
      if (isAsciiPunct(c) && i + 1 < e && isAsciiLetter(text.charCodeAt(i + 1))) {
        match = i + 2;
        while (match < e && isAsciiLetter(text.charCodeAt(match))) match++;
      } else if (k === LETTER || k === MARK) {
        // [^\r\n\p{L}\p{P}\p{S}]? takes a mark and gives it back if no letter follows: the run from i either way
        match = runLetterMark(i + w);
      } else if (k !== NEWLINE && k !== PUNCT && k !== SYMBOL && i + w < e && isLetterOrMark(at(i + w))) {
        match = runLetterMark(i + w);
      } else if (c === 32 && i + 1 < e && isPunctOrSymbol(at(i + 1))) {
        match = runPunctSymbol(i + 1);
      } else if (k === PUNCT || k === SYMBOL) {
        match = runPunctSymbol(i + w);
      } else if (k === SPACE || k === NEWLINE) {
        match = whitespace(text, i, e, table);
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
}

function isLetterOrMark(k: number): boolean {
  return k === LETTER || k === MARK;
}

function isPunctOrSymbol(k: number): boolean {
  return k === PUNCT || k === SYMBOL;
}

// \s*[\r\n]+ | \s+(?!\S) | \s+ from the whitespace character at i (all White_Space is in the BMP).
function whitespace(text: string, i: number, e: number, table: Uint8Array): number {
  let wsEnd = i;
  let lastNewline = -1;
  while (wsEnd < e) {
    const c = text.charCodeAt(wsEnd);
    if (c === 13 || c === 10) lastNewline = wsEnd;
    else if (c >= 0xd800 && c < 0xe000) break;
    else {
      const k = table[c] === UNKNOWN ? classify(table, c) : table[c];
      if (k !== SPACE) break;
    }
    wsEnd++;
  }
  if (lastNewline >= 0) return lastNewline + 1;
  if (wsEnd === e || wsEnd - i < 2) return wsEnd;
  return wsEnd - 1;
}
