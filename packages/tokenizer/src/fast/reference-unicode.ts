// The Unicode the reference knows. Hugging Face's tokenizers run their pre-tokenizer patterns on Oniguruma, whose
// tables are older than this runtime's: a code point Unicode added since (here: the 4803 of Unicode 17) is
// unassigned there, so no \p{L}, \p{N}, \p{M}, \p{P}, \p{S} or \s matches it, while this engine calls it a letter,
// a symbol, ... The hand-written scanners class these as the reference does (unassigned: "other"), so their
// pre-tokens, and the ids, stay equal on every text. Derived, not typed in: scripts/reference-unicode.ts probes
// every assigned code point through the native binding and prints this list (run it after upgrading Bun or
// `tokenizers`).

// 4803 code points in 47 ranges (Bun 1.4.5, Unicode 17.0; tokenizers 0.23)
export const REFERENCE_UNASSIGNED: readonly (readonly [number, number])[] = [
  [0x88f, 0x88f], [0xc5c, 0xc5c], [0xcdc, 0xcdc], [0x1acf, 0x1add], [0x1ae0, 0x1aeb], [0x20c1, 0x20c1], [0x2b96, 0x2b96],
  [0xa7ce, 0xa7cf], [0xa7d2, 0xa7d2], [0xa7d4, 0xa7d4], [0xa7f1, 0xa7f1], [0xfbc3, 0xfbd2], [0xfd90, 0xfd91], [0xfdc8, 0xfdce],
  [0x10940, 0x10959], [0x10ec5, 0x10ec7], [0x10ed0, 0x10ed8], [0x10efa, 0x10efb], [0x11b60, 0x11b67], [0x11db0, 0x11ddb],
  [0x11de0, 0x11de9], [0x16ea0, 0x16eb8], [0x16ebb, 0x16ed3], [0x16ff2, 0x16ff6], [0x187f8, 0x187ff], [0x18d09, 0x18d1e],
  [0x18d80, 0x18df2], [0x1ccfa, 0x1ccfc], [0x1ceba, 0x1ced0], [0x1cee0, 0x1cef0], [0x1e6c0, 0x1e6de], [0x1e6e0, 0x1e6f5],
  [0x1e6fe, 0x1e6ff], [0x1f6d8, 0x1f6d8], [0x1f777, 0x1f77a], [0x1f8d0, 0x1f8d8], [0x1fa54, 0x1fa57], [0x1fa8a, 0x1fa8a],
  [0x1fa8e, 0x1fa8e], [0x1fac8, 0x1fac8], [0x1facd, 0x1facd], [0x1faea, 0x1faea], [0x1faef, 0x1faef], [0x1fbfa, 0x1fbfa],
  [0x2b73a, 0x2b73f], [0x2cea2, 0x2cead], [0x323b0, 0x33479],
];

/** Whether the reference takes `cp` as unassigned though this engine classifies it (see REFERENCE_UNASSIGNED). */
export function unassignedForReference(cp: number): boolean {
  let lo = 0;
  let hi = REFERENCE_UNASSIGNED.length - 1;
  while (lo <= hi) {
    const mid = (lo + hi) >> 1;
    const [a, b] = REFERENCE_UNASSIGNED[mid]!;
    if (cp < a) hi = mid - 1;
    else if (cp > b) lo = mid + 1;
    else return true;
  }
  return false;
}

const LISTED = new RegExp(`[${REFERENCE_UNASSIGNED.map(([a, b]) => `\\u{${a.toString(16)}}-\\u{${b.toString(16)}}`).join("")}]`, "gu");

/**
 * `s.normalize(form)` as the reference normalizes: a listed code point is unassigned there, so it has no
 * decomposition, composes with nothing and is a starter (combining class 0), which no reordering or composition
 * crosses; the text is normalized in the parts between such code points, each kept as it is. (This engine may
 * know one as a combining mark that reorders, or composes with its neighbours.)
 */
export function normalizeAsReference(s: string, form: string): string {
  LISTED.lastIndex = 0;
  if (!LISTED.test(s)) return s.normalize(form);
  let out = "";
  let from = 0;
  LISTED.lastIndex = 0;
  for (const m of s.matchAll(LISTED)) {
    out += s.slice(from, m.index).normalize(form) + m[0];
    from = m.index + m[0].length;
  }
  return out + s.slice(from).normalize(form);
}
