import { cl100kDigits } from "./cl100k-scanner";
import { DEEPSEEK_V3_PATTERNS } from "./deepseek-scanner";
import { isSpace } from "./white-space";

/**
 * Where a text can be cut so that the ids of the two parts, each encoded alone, concatenated are the ids of the
 * whole: `next(text, from, end)` is the first such point q with from <= q < end, or -1. The caller encodes
 * text[start, end) for some start < from. Null when this tokenizer gives no such guarantee.
 */
export type CutPoints = { next(text: string, from: number, end: number): number };

type Json = Record<string, any>;

/**
 * The cut points of a tokenizer.json, from its normalizer, pre-tokenizer and added tokens. A point q qualifies
 * when text[q-1] is "\n" and text[q] is ASCII other than "\r"/"\n", and, when text[q] is whitespace, the
 * whitespace run from q holds no "\r"/"\n" before its first non-whitespace character (or the end). Why each
 * stage keeps that point exact, where A = text[0, q) and B = text[q, end):
 *
 * - Added tokens: encode first splits the raw text at its added tokens (leftmost-longest). An occurrence that
 *   straddles q contains "\n" followed by another character; a tokenizer with an added token holding "\n"
 *   anywhere but last gets no cut points, so every occurrence lies in A or in B and the split of the whole is
 *   the splits of A and B side by side.
 * - Normalizers NFC/NFD/NFKC/NFKD (and a Sequence of them, or none): "\n" and every ASCII character are
 *   starters (combining class 0) that never compose with a neighbour, so normalization restarts at q:
 *   N(A + B) = N(A) + N(B), and the normalized text still has "\n" then the same character there; no character
 *   normalizes to text holding "\r" or "\n", so a whitespace run after q still holds none. Any other
 *   normalizer (Replace may rewrite "\n" or the character after it) gives no cut points.
 * - Pre-tokenizer: a Sequence of Isolated Splits (then ByteLevel without its own regex, which splits nothing)
 *   is walked in order. A pattern proven below to "restart" at q (every piece it makes lies in A or in B, and
 *   those of A and of B are what A and B alone give, but q may fall inside a gap between its matches, which
 *   the next Split then sees with the same "\n" then character around q) lets the walk go on; a pattern proven
 *   to make q a piece boundary ends it with cut points; any other pattern, behaviour or pre-tokenizer
 *   (Metaspace's prepend, ByteLevel's own GPT-2 regex, whose \s+(?!\S) looks past "\n") ends it without.
 *   None of the patterns below has a lookbehind, anchor or \b, so the matching of the whole from q on is the
 *   matching of B alone; what needs proof is that every match starting before q ends at or before q and is
 *   decided by the characters before q (reading text[q] stops it exactly as the end of A does).
 * - BPE then merges within each piece: the same pieces give the same ids.
 */
export function cutPoints(json: Json): CutPoints | null {
  if (!restartsNormalizing(json.normalizer)) return null;
  if (((json.added_tokens ?? []) as Json[]).some((t) => newlineInside(t.content as string))) return null;
  return preTokenizerCuts(json.pre_tokenizer) ? NEWLINE_THEN_ASCII : null;
}

function newlineInside(content: string): boolean {
  const at = content.indexOf("\n");
  return at >= 0 && at < content.length - 1;
}

function restartsNormalizing(n: Json | null | undefined): boolean {
  if (n == null) return true;
  if (n.type === "Sequence") return (n.normalizers as Json[]).every(restartsNormalizing);
  return n.type === "NFC" || n.type === "NFD" || n.type === "NFKC" || n.type === "NFKD";
}

function preTokenizerCuts(p: Json | null | undefined): boolean {
  if (p == null) return false;
  const steps = p.type === "Sequence" ? (p.pretokenizers as Json[]) : [p];
  for (const s of steps) {
    if (s.type === "ByteLevel" && !s.use_regex) continue;
    if (s.type !== "Split" || s.behavior !== "Isolated" || s.invert || typeof s.pattern?.Regex !== "string") return false;
    const kind = patternKind(s.pattern.Regex);
    if (kind === "boundary") return true;
    if (kind !== "restart") return false;
  }
  return false;
}

/**
 * The patterns proven here, case by case (q as above: "\n" at q-1, then c = text[q], ASCII, not "\r"/"\n";
 * if c is whitespace, its run reaches a non-whitespace character or the end before any "\r"/"\n").
 *
 * cl100k (Qwen2/3 with \p{N}, Llama 3 with \p{N}{1,3}; every character is matched, no gaps):
 *   (?i:'s|'t|'re|'ve|'m|'ll|'d) | [^\r\n\p{L}\p{N}]?\p{L}+ | \p{N}{1,D} | ?[^\s\p{L}\p{N}]+[\r\n]* |
 *   \s*[\r\n]+ | \s+(?!\S) | \s+
 *   The first three alternatives cannot hold "\n" (the optional first character excludes it), so tried at
 *   any i < q they stop at q-1 at the latest without reading text[q]. The fourth can end with "\n" only in its
 *   greedy [\r\n]* tail, which stops at q since c is not "\r"/"\n" (as at the end of A). A match starting at a
 *   whitespace character of the run that holds q-1: the first four fail there (the run goes on to q-1, so no
 *   letter, digit or non-space follows a space before it), and \s*[\r\n]+ matches up to the last "\r"/"\n" of
 *   the run, which is q-1 in the whole (none after it before the run ends) as in A. So the match covering q-1
 *   ends at q: q is a piece boundary.
 * DeepSeek V3, its third Split (gaps possible, e.g. a lone control character):
 *   [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+ | [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+ | ?[\p{P}\p{S}]+[\r\n]* |
 *   \s*[\r\n]+ | \s+(?!\S) | \s+
 *   The same argument: the first two cannot hold "\n", the third ends with it only in its [\r\n]* tail, and
 *   from any whitespace start in the run holding q-1 the first three fail and \s*[\r\n]+ ends at q. A failed
 *   attempt (a gap) reads no further than q-1 either. q is a piece boundary.
 * DeepSeek V3, its first two Splits, \p{N}{1,3} and [一-龥぀-ゟ゠-ヿ]+: no match holds "\n", no lookaround: they
 *   restart at q ("\n" and c stay together in a gap when c is not a digit).
 */
function patternKind(pattern: string): "boundary" | "restart" | "unknown" {
  if (cl100kDigits(pattern) !== null) return "boundary";
  if (pattern === DEEPSEEK_V3_PATTERNS[2]) return "boundary";
  if (pattern === DEEPSEEK_V3_PATTERNS[0] || pattern === DEEPSEEK_V3_PATTERNS[1]) return "restart";
  return "unknown";
}

const NEWLINE_THEN_ASCII: CutPoints = {
  next(text, from, end) {
    // A loop rather than indexOf, which would search past `end` (a text of many sections without a newline).
    for (let q = Math.max(from, 1); q < end; q++) {
      if (text.charCodeAt(q - 1) !== 10) continue;
      const c = text.charCodeAt(q);
      if (c >= 0x80 || c === 10 || c === 13) continue;
      if (!isSpace(c) || whitespaceRunEndsWithoutNewline(text, q, end)) return q;
    }
    return -1;
  },
};

// From a whitespace character at q: true when the run reaches a non-whitespace character or `end` before any "\r"/"\n".
function whitespaceRunEndsWithoutNewline(text: string, q: number, end: number): boolean {
  for (let i = q; i < end; i++) {
    const c = text.charCodeAt(i);
    if (c === 10 || c === 13) return false;
    if (!isSpace(c)) return true;
  }
  return true;
}
