// FNV-1a (32 bits) over UTF-16 code units: the vocabulary table's hash as it is, and the word cache's seeded.

export const FNV_OFFSET = 0x811c9dc5 | 0;
export const FNV_PRIME = 0x01000193;

/** `h` continued over src[start, end). */
export function hashRange(h: number, src: string, start: number, end: number): number {
  for (let i = start; i < end; i++) h = Math.imul(h ^ src.charCodeAt(i), FNV_PRIME);
  return h;
}
