import type { Tokenizer } from "@huggingface/tokenizers";
import type { SegmentCache } from "./segment-cache";
import type { AddedTokenJson } from "./tokenizer-files";

/**
 * Tokenizes text piecewise between added tokens ("<|im_start|>", "<|im_end|>", "<think>", ...), caching the ids
 * of each piece. This is exact, not an approximation: a Hugging Face tokenizer first splits the raw text at its
 * added tokens and then normalizes, pre-tokenizes and BPE-encodes each section on its own, so the sections are
 * independent. The only context a section sees is whether it is the first one (Metaspace's prepend_scheme
 * "first"); a later section is therefore encoded behind an anchor token, whose id is dropped, and the cache key
 * records the position. Tokens with lstrip/rstrip/single_word, normalized tokens, and tokens that overlap another
 * added token are not split on here (they change their neighbours), so they stay inside a section where the
 * library handles them itself.
 */
export class Segmenter {
  private readonly ids = new Map<string, number>();
  private readonly pattern: RegExp | null;
  private readonly anchor: string | null;

  constructor(private readonly tokenizer: Tokenizer, addedTokens: readonly AddedTokenJson[], hasNormalizer: boolean) {
    const splitOn = addedTokens.filter((t) =>
      t.content.length > 0 && !t.lstrip && !t.rstrip && !t.single_word && !(t.normalized && hasNormalizer) &&
      !addedTokens.some((o) => o.content !== t.content && overlaps(o.content, t.content)));
    for (const t of splitOn) this.ids.set(t.content, t.id);
    const alternatives = [...this.ids.keys()].sort((a, b) => b.length - a.length).map(escapeRegExp);
    this.pattern = alternatives.length > 0 ? new RegExp(alternatives.join("|"), "g") : null;
    this.anchor = alternatives.length > 0 ? [...this.ids.keys()][0]! : null;
  }

  /** Ids of `text` without post-processing (no special tokens added), through the cache. */
  encode(text: string, cache: SegmentCache): Uint32Array {
    const pieces: (Uint32Array | number)[] = [];
    let total = 0;
    let start = 0;
    if (this.pattern !== null) {
      const re = this.pattern;
      re.lastIndex = 0;
      for (let m = re.exec(text); m !== null; m = re.exec(text)) {
        if (m.index > start) {
          const ids = this.section(text.slice(start, m.index), start === 0, cache);
          pieces.push(ids);
          total += ids.length;
        }
        pieces.push(this.ids.get(m[0])!);
        total += 1;
        start = m.index + m[0].length;
      }
    }
    if (start < text.length) {
      const ids = this.section(start === 0 ? text : text.slice(start), start === 0, cache);
      pieces.push(ids);
      total += ids.length;
    }
    const out = new Uint32Array(total);
    let at = 0;
    for (const p of pieces) {
      if (typeof p === "number") out[at++] = p;
      else {
        out.set(p, at);
        at += p.length;
      }
    }
    return out;
  }

  private section(text: string, first: boolean, cache: SegmentCache): Uint32Array {
    // A section never contains a split-on token, so prefixing the rare first section with one keeps the two
    // kinds of key apart without copying the common (later) sections into new key strings.
    const key = first && this.anchor !== null ? this.anchor + text : text;
    const hit = cache.get(key);
    if (hit !== undefined) return hit;
    const ids = first || this.anchor === null
      ? Uint32Array.from(this.tokenizer.encode(text, { add_special_tokens: false }).ids)
      : Uint32Array.from(this.tokenizer.encode(this.anchor + text, { add_special_tokens: false }).ids).subarray(1);
    cache.set(key, ids);
    return ids;
  }
}

// True when an occurrence of `a` could share characters with an occurrence of `b` without being equal:
// containment, or a suffix of one equal to a prefix of the other.
function overlaps(a: string, b: string): boolean {
  if (a.includes(b) || b.includes(a)) return true;
  for (let k = 1; k < Math.min(a.length, b.length); k++) {
    if (a.endsWith(b.slice(0, k)) || b.endsWith(a.slice(0, k))) return true;
  }
  return false;
}

function escapeRegExp(s: string): string {
  return s.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
}
