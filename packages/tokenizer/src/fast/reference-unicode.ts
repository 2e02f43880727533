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
  return inRanges(REFERENCE_UNASSIGNED, cp);
}

// The reference's normalizers (NFC, NFD, NFKC, NFKD) come from the Rust crate unicode-normalization-alignments,
// whose tables are Unicode 9.0: a code point added since is, to them, a starter (combining class 0) with no
// decomposition that composes with nothing. These are the ones this runtime normalizes otherwise: combining marks
// (which reorder, or block or let through a composition), characters with a canonical or compatibility
// decomposition, and parts of compositions. Derived by scripts/reference-unicode.ts, which probes every assigned
// code point through the native binding's normalizers; gaps of code points unassigned here are folded in.

// 364 code points (43 unassigned ones folded in) in 67 ranges (Bun 1.4.5, Unicode 17.0; tokenizers 0.23)
export const REFERENCE_NORMALIZER_UNKNOWN: readonly (readonly [number, number])[] = [
  [0x7fd, 0x7fd], [0x897, 0x89f], [0x8ca, 0x8d3], [0x9fe, 0x9fe], [0xc3c, 0xc3c], [0xd3b, 0xd3c], [0xeba, 0xeba],
  [0x1715, 0x1715], [0x1abf, 0x1aeb], [0x1df6, 0x1dfa], [0x32ff, 0x32ff], [0xa7f1, 0xa7f4], [0xa82c, 0xa82c],
  [0xab69, 0xab69], [0x105c9, 0x105c9], [0x105d2, 0x105d2], [0x105da, 0x105da], [0x105e4, 0x105e4], [0x10781, 0x107ba],
  [0x10d24, 0x10d27], [0x10d69, 0x10d6d], [0x10eab, 0x10eac], [0x10efa, 0x10efb], [0x10efd, 0x10eff],
  [0x10f46, 0x10f50], [0x10f82, 0x10f85], [0x11070, 0x11070], [0x1133b, 0x1133b], [0x11382, 0x11385],
  [0x1138b, 0x11391], [0x113b8, 0x113b8], [0x113bb, 0x113bb], [0x113c2, 0x113c9], [0x113ce, 0x113d0],
  [0x1145e, 0x1145e], [0x11839, 0x1183a], [0x11930, 0x11930], [0x11935, 0x11935], [0x11938, 0x11938],
  [0x1193d, 0x1193e], [0x11943, 0x11943], [0x119e0, 0x119e0], [0x11a34, 0x11a34], [0x11a47, 0x11a47],
  [0x11a99, 0x11a99], [0x11d42, 0x11d42], [0x11d44, 0x11d45], [0x11d97, 0x11d97], [0x11f41, 0x11f42],
  [0x1611e, 0x16129], [0x1612f, 0x1612f], [0x16d63, 0x16d63], [0x16d67, 0x16d6a], [0x16ff0, 0x16ff1],
  [0x1ccd6, 0x1ccf9], [0x1e030, 0x1e08f], [0x1e130, 0x1e136], [0x1e2ae, 0x1e2ae], [0x1e2ec, 0x1e2ef],
  [0x1e4ec, 0x1e4ef], [0x1e5ee, 0x1e5ef], [0x1e6e3, 0x1e6e3], [0x1e6e6, 0x1e6e6], [0x1e6ee, 0x1e6ef],
  [0x1e6f5, 0x1e6f5], [0x1f16c, 0x1f16c], [0x1fbf0, 0x1fbf9],
];

/** Whether the reference's normalizers take `cp` as a starter they leave alone (see REFERENCE_NORMALIZER_UNKNOWN). */
export function unknownToReferenceNormalizer(cp: number): boolean {
  return inRanges(REFERENCE_NORMALIZER_UNKNOWN, cp);
}

function inRanges(ranges: readonly (readonly [number, number])[], cp: number): boolean {
  let lo = 0;
  let hi = ranges.length - 1;
  while (lo <= hi) {
    const mid = (lo + hi) >> 1;
    const [a, b] = ranges[mid]!;
    if (cp < a) hi = mid - 1;
    else if (cp > b) lo = mid + 1;
    else return true;
  }
  return false;
}

// Per UTF-16 unit: 1 for a listed BMP code point and for a high surrogate that may start a listed one, so text
// without any (nearly all) is checked by one table load per unit.
const FLAGGED = new Uint8Array(0x10000);
for (const [a, b] of REFERENCE_NORMALIZER_UNKNOWN) {
  for (let cp = a; cp <= b; cp++) FLAGGED[cp > 0xffff ? 0xd800 + ((cp - 0x10000) >> 10) : cp] = 1;
}
// Where the scan starts: the regex engine skips text below the lowest listed code point (ASCII, Latin, ...) faster.
const ABOVE_LOWEST = new RegExp(`[^\\0-\\u${(REFERENCE_NORMALIZER_UNKNOWN[0]![0] - 1).toString(16).padStart(4, "0")}]`);

/**
 * `s.normalize(form)` as the reference normalizes: a listed code point stays as it is and no reordering or
 * composition crosses it, so the text is normalized in the parts between them.
 */
export function normalizeAsReference(s: string, form: string): string {
  let out = "";
  let from = 0;
  for (let i = s.search(ABOVE_LOWEST); i >= 0 && i < s.length; i++) {
    const unit = s.charCodeAt(i);
    if (FLAGGED[unit] === 0) continue;
    const cp = s.codePointAt(i)!;
    const width = cp > 0xffff ? 2 : 1;
    if (unit >= 0xd800 && !unknownToReferenceNormalizer(cp)) {
      i += width - 1;
      continue;
    }
    out += s.slice(from, i).normalize(form) + s.slice(i, i + width);
    from = i + width;
    i += width - 1;
  }
  return from === 0 ? s.normalize(form) : out + s.slice(from).normalize(form);
}
