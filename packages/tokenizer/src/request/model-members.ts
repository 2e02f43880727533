// Where a JSON object's top-level `model` values are, found without parsing it: strings are passed by a native
// search for their closing quote (most of a request body's bytes are inside strings), nested values by counting
// brackets. Linear in the body, and no larger than it in memory: usable on a body of any size, on any thread.
// Counterpart: fast/bpe-model.ts walkObject/skipValue, the same walk over a decoded string; no shared code, as a
// body is walked undecoded, in bytes.
import { skipSpace, stringEnd } from "./openai-body";

const decoder = new TextDecoder();
const MODEL_KEY = new TextEncoder().encode('"model"');
/** The longest key that can decode to `model`: each letter written as a `\uXXXX` escape, and its quotes. */
const MODEL_KEY_MAX_BYTES = 2 + 5 * 6;

export type Span = { start: number; end: number };

/**
 * `open`: the offset of the object's `{`; `values`: each top-level member whose key decodes to `model` (written
 * with escapes or not, given once or more), the byte span of its value, in order. Null when the text is not a JSON
 * object as far as this walk checks, which is its structure, not its tokens: a body that parsed already, or one
 * too large to parse where it is looked at (the walk never throws, and a body it accepts may still be invalid).
 */
export function modelMembers(b: Uint8Array): { open: number; values: Span[] } | null {
  const open = skipSpace(b, 0);
  if (b[open] !== 0x7b) return null;
  const values: Span[] = [];
  let i = skipSpace(b, open + 1);
  if (b[i] === 0x7d) return { open, values };
  for (;;) {
    if (b[i] !== 0x22) return null;
    const keyEnd = stringEnd(b, i);
    if (keyEnd < 0) return null;
    const key = b.subarray(i, keyEnd);
    i = skipSpace(b, keyEnd);
    if (b[i] !== 0x3a) return null;
    const start = skipSpace(b, i + 1);
    const end = valueEnd(b, start);
    if (end < 0) return null;
    if (isModelKey(key)) values.push({ start, end });
    i = skipSpace(b, end);
    if (b[i] === 0x7d) return { open, values };
    if (b[i] !== 0x2c) return null;
    i = skipSpace(b, i + 1);
  }
}

/** The offset just past the value that starts at `i` (a string, an object or array, or a literal), or -1. */
function valueEnd(b: Uint8Array, i: number): number {
  const c = b[i];
  if (c === undefined) return -1;
  if (c === 0x22) return stringEnd(b, i);
  if (c === 0x7b || c === 0x5b) {
    let depth = 0;
    for (let j = i; j < b.length; j++) {
      const d = b[j]!;
      if (d < 0x5b && d !== 0x22) continue; // digits, separators, whitespace: most bytes outside strings
      if (d === 0x22) {
        const end = stringEnd(b, j);
        if (end < 0) return -1;
        j = end - 1;
      } else if (d === 0x7b || d === 0x5b) depth++;
      else if ((d === 0x7d || d === 0x5d) && --depth === 0) return j + 1;
    }
    return -1;
  }
  let j = i;
  while (j < b.length && !isDelimiter(b[j]!)) j++;
  return j > i ? j : -1;
}

/** Ends a literal (a number, true, false, null): a separator, a closing bracket, or whitespace. */
function isDelimiter(c: number): boolean {
  return c === 0x2c || c === 0x7d || c === 0x5d || c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09;
}

/** `key` (its quotes included) names `model`: as written, or with escapes (Python's json decodes them alike). */
function isModelKey(key: Uint8Array): boolean {
  if (key.length === MODEL_KEY.length) return key.every((c, n) => c === MODEL_KEY[n]);
  if (key.length > MODEL_KEY_MAX_BYTES || !key.includes(0x5c)) return false;
  try {
    return JSON.parse(decoder.decode(key)) === "model";
  } catch {
    return false;
  }
}
