/**
 * Oniguruma's `\s` (Unicode White_Space, hf-regex.ts) for the hand-written scanners, and the whitespace
 * alternatives that the cl100k pattern and DeepSeek V3's word pattern both end with, word for word:
 *
 *   \s*[\r\n]+ | \s+(?!\S) | \s+
 *
 * Every White_Space character is in the BMP, so one UTF-16 unit is one character here (a surrogate is not
 * White_Space, whatever it pairs with).
 */

const UNKNOWN = 0;
const NOT = 1;
const SPACE = 2; // White_Space other than \r and \n
const NEWLINE = 3; // \r or \n

// By UTF-16 unit, filled lazily from the regex engine's Unicode tables (those the scanners' classes come from).
const kinds = new Uint8Array(0x10000);
const isWhiteSpace = /^\p{White_Space}$/u;

function kindOf(c: number): number {
  const k = kinds[c]!;
  if (k !== UNKNOWN) return k;
  return (kinds[c] = c === 13 || c === 10 ? NEWLINE : isWhiteSpace.test(String.fromCharCode(c)) ? SPACE : NOT);
}

/** Whether the UTF-16 unit c is White_Space other than "\r" and "\n". */
export function isSpace(c: number): boolean {
  return kindOf(c) === SPACE;
}

/**
 * The end of the whitespace alternatives' match from the whitespace character at i, in a subject that ends at
 * `end` (the end of the string for the lookahead): through the run's last "\r"/"\n" if it holds one; else the
 * whole run at the end of the subject or when it is one character; else all of it but the last character,
 * which goes with the non-space after it.
 */
export function whitespaceEnd(text: string, i: number, end: number): number {
  let runEnd = i;
  let lastNewline = -1;
  while (runEnd < end) {
    const k = kindOf(text.charCodeAt(runEnd));
    if (k === NEWLINE) lastNewline = runEnd;
    else if (k !== SPACE) break;
    runEnd++;
  }
  if (lastNewline >= 0) return lastNewline + 1;
  if (runEnd === end || runEnd - i < 2) return runEnd;
  return runEnd - 1;
}
