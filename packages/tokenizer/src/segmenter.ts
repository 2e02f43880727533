import type { CutPoints } from "./fast/cut-points";
import type { SegmentCache } from "./segment-cache";
import type { AddedTokenJson } from "./tokenizer-files";

/**
 * What is known of a text before tokenizing anything: the ids up to the first piece the cache does not hold
 * (split-on tokens included), and the length of the text from there on. Told as it grows, each report carries only
 * what it adds: `added`, the ids after the previous report's (the first: all those known), in a new array of the
 * receiver's own (the pool member transfers it as it is); `tokens`, the whole prefix's length (the whole prefix each
 * time would cost a copy of everything known per report).
 */
export type KnownPrefix = { added: Uint32Array; tokens: number; unknownChars: number };

/**
 * Hooks into one tokenization, for the worker pool: `knownPrefix` is told what the cache already knows when the
 * first piece it does not hold comes up (not at all when it holds every one), before tokenizing anything, and
 * then again as the pieces tokenized extend what is known (after the first one, then each time the ids have
 * doubled: a few reports, each the ids it adds); `shouldStop` is asked before each piece that must be tokenized (a
 * cancelled request stops there, keeping the pieces done so far in the cache).
 */
export type EncodeControl = {
  knownPrefix?(known: KnownPrefix): void;
  /** Texts shorter than this skip knownPrefix (telling the known ids is not worth it for them). */
  knownPrefixMinChars?: number;
  shouldStop?(): boolean;
  /**
   * A background warm (nothing waits for its ids): the pieces it caches are marked, and a later tokenization
   * that finds one counts its tokens as warmed (fresh for it, had nothing warmed the cache).
   */
  warm?: boolean;
  /**
   * Resumes a stopped walk over the same text (EncodeStopped.at): the pieces before it, done already, are skipped,
   * and the ids returned are only the rest's. For a background warm, which needs the cache filled, not the ids.
   */
  from?: number;
};

/**
 * Thrown by an encode that `shouldStop` stopped: the text it walked and where the first piece it did not tokenize
 * starts, to resume from (EncodeControl.from). The pieces before are cached.
 */
export class EncodeStopped extends Error {
  constructor(readonly text: string, readonly at: number) {
    super("tokenization stopped");
  }
}

/**
 * What encodes one section: ids without special tokens added. `independentSections` is true when a section's
 * ids never depend on its position (no Metaspace "first"), so later sections need no anchor. `cuts`: where a
 * section can be cut with its ids unchanged (the fast BPE's proven cut points), absent when nowhere is proven.
 */
export type SectionEncoder = { encode(text: string): Uint32Array; independentSections: boolean; cuts?: CutPoints | null };

/** Default length from one cut of a long section to the next (see Segmenter); measured in bench:tokenize. */
export const DEFAULT_PIECE_CHARS = 2048;

/**
 * Tokenizes text piecewise, caching the ids of each piece. First at added tokens ("<|im_start|>", "<|im_end|>",
 * "<think>", ...): a Hugging Face tokenizer splits the raw text at its added tokens and then normalizes,
 * pre-tokenizes and BPE-encodes each section on its own, so the sections are independent. The only context a
 * section sees is whether it is the first one (Metaspace's prepend_scheme "first"); a later section is therefore
 * encoded behind an anchor token, whose id is dropped, and the cache key records the position. Tokens with
 * lstrip/rstrip/single_word, normalized tokens, and tokens that overlap another added token are not split on
 * here (they change their neighbours), so they stay inside a section where the encoder handles them itself.
 *
 * Then a section longer than `pieceChars` is cut into pieces at the encoder's cut points: points where its
 * added-token split, normalizer and pre-tokenizer provably restart, so the ids of the pieces, each encoded
 * alone, concatenated are the ids of the section (the proof, pattern by pattern, is in fast/cut-points.ts;
 * there a tokenizer without such a guarantee, such as one with no pre-tokenizer or a Metaspace prepend, has no
 * cut points and keeps whole sections). Only independent encoders have cut points, so a piece needs no anchor.
 * The cuts are deterministic from the section's start (the first cut point at or after `pieceChars` characters
 * from the previous cut), so two texts that share a prefix share its pieces up to the piece where they differ:
 * a RAG prompt with a known document and a new question re-tokenizes only the question and the document's last
 * piece.
 */
export class Segmenter {
  private readonly ids = new Map<string, number>();
  private readonly pattern: RegExp | null;
  private readonly anchor: string | null;
  private readonly cuts: CutPoints | null;

  constructor(
    private readonly encoder: SectionEncoder,
    addedTokens: readonly AddedTokenJson[],
    hasNormalizer: boolean,
    private readonly pieceChars = DEFAULT_PIECE_CHARS,
  ) {
    const overlapping = overlappingContents(addedTokens.map((t) => t.content));
    const splitOn = addedTokens.filter((t) =>
      t.content.length > 0 && !t.lstrip && !t.rstrip && !t.single_word && !(t.normalized && hasNormalizer) &&
      !overlapping.has(t.content));
    for (const t of splitOn) this.ids.set(t.content, t.id);
    const alternatives = [...this.ids.keys()].sort((a, b) => b.length - a.length).map(escapeRegExp);
    this.pattern = alternatives.length > 0 ? new RegExp(alternatives.join("|"), "g") : null;
    this.anchor = alternatives.length > 0 ? [...this.ids.keys()][0]! : null;
    this.cuts = encoder.independentSections && pieceChars > 0 ? (encoder.cuts ?? null) : null;
  }

  /** Ids of `text` without post-processing (no special tokens added), through the cache. */
  encode(text: string, cache: SegmentCache, control?: EncodeControl): Uint32Array {
    // The known prefix is what this walk has found before its first miss: told there, in the same pass (a
    // second walk over the pieces cost several times the cached encode itself).
    const report = control?.knownPrefix !== undefined && text.length >= (control.knownPrefixMinChars ?? 0) ? control.knownPrefix : undefined;
    const pieces: (Uint32Array | number)[] = [];
    let total = 0;
    // Reported so far: -1 before the first miss; then the length at which the known ids are told again.
    let nextReport = -1;
    // The pieces and ids told already: a report adds what follows them.
    let toldPieces = 0;
    let toldIds = 0;
    const tell = (unknownChars: number) => {
      report!({ added: concat(pieces, toldPieces, total - toldIds), tokens: total, unknownChars });
      toldPieces = pieces.length;
      toldIds = total;
    };
    this.forEachPiece(text, control?.from ?? 0, (start, end) => {
      let missed = false;
      const onMiss = report && (() => {
        missed = true;
        if (nextReport >= 0) return;
        tell(text.length - start);
        nextReport = total + 1;
      });
      const ids = this.piece(start === 0 && end === text.length ? text : text.slice(start, end), start === 0, cache, control, onMiss);
      if (ids === null) throw new EncodeStopped(text, start);
      pieces.push(ids);
      total += ids.length;
      if (missed && end < text.length && total >= nextReport) {
        tell(text.length - end);
        nextReport = 2 * total;
      }
    }, (id) => {
      pieces.push(id);
      total += 1;
    });
    return concat(pieces, 0, total);
  }

  // Calls `piece` for each piece of the sections between split-on tokens and `token` for each of them, in order,
  // from `from`: a piece's start (the cuts run from a section's start, so the pieces after it are the same).
  private forEachPiece(text: string, from: number, piece: (start: number, end: number) => void, token: (id: number) => void): void {
    let start = from;
    if (this.pattern !== null) {
      const re = this.pattern;
      re.lastIndex = from;
      for (let m = re.exec(text); m !== null; m = re.exec(text)) {
        if (m.index > start) this.cutSection(text, start, m.index, piece);
        token(this.ids.get(m[0])!);
        start = m.index + m[0].length;
      }
    }
    if (start < text.length) this.cutSection(text, start, text.length, piece);
  }

  private cutSection(text: string, start: number, end: number, piece: (start: number, end: number) => void): void {
    const cuts = this.cuts;
    if (cuts !== null) {
      for (let at = cuts.next(text, start + this.pieceChars, end); at >= 0; at = cuts.next(text, start + this.pieceChars, end)) {
        piece(start, at);
        start = at;
      }
    }
    piece(start, end);
  }

  private key(text: string, first: boolean): string {
    // A piece never contains a split-on token, so prefixing the rare first piece with one keeps the two
    // kinds of key apart without copying the common (later) pieces into new key strings.
    return first && !this.encoder.independentSections && this.anchor !== null ? this.anchor + text : text;
  }

  /** null: not cached, and `shouldStop` said to stop before tokenizing it. */
  private piece(text: string, first: boolean, cache: SegmentCache, control: EncodeControl | undefined, onMiss?: () => void): Uint32Array | null {
    const independent = this.encoder.independentSections;
    const key = this.key(text, first);
    const warm = control?.warm === true;
    const hit = cache.get(key, warm);
    if (hit !== undefined) return hit;
    onMiss?.();
    if (control?.shouldStop?.() === true) return null;
    const ids = first || independent || this.anchor === null
      ? this.encoder.encode(text)
      : this.encoder.encode(this.anchor + text).subarray(1);
    cache.set(key, ids, warm);
    cache.freshTokens += ids.length;
    return ids;
  }
}

/**
 * The contents an occurrence of which could share characters with an occurrence of another, different content:
 * one contains the other, or a proper suffix of one is a proper prefix of the other. Indexed by substrings, so
 * Gemma 3's 6k added tokens take milliseconds (a pairwise check took about a minute).
 */
export function overlappingContents(contents: readonly string[]): Set<string> {
  const distinct = [...new Set(contents)];
  // Each substring (proper prefix, proper suffix) -> the first content it was seen in, or null once two were.
  const inside = new Map<string, string | null>();
  const prefixes = new Map<string, string | null>();
  const suffixes = new Map<string, string | null>();
  const note = (m: Map<string, string | null>, key: string, owner: string) => {
    const seen = m.get(key);
    if (seen === undefined) m.set(key, owner);
    else if (seen !== owner) m.set(key, null);
  };
  for (const c of distinct) {
    for (let i = 0; i <= c.length; i++) for (let j = i; j <= c.length; j++) note(inside, c.slice(i, j), c);
    for (let k = 1; k < c.length; k++) {
      note(prefixes, c.slice(0, k), c);
      note(suffixes, c.slice(c.length - k), c);
    }
  }
  const other = (m: Map<string, string | null>, key: string, c: string) => {
    const seen = m.get(key);
    return seen === null || (seen !== undefined && seen !== c);
  };
  const all = new Set(distinct);
  const out = new Set<string>();
  for (const c of distinct) {
    // Another content contains c, or c contains another (a proper substring of c that is a content).
    let hit = other(inside, c, c);
    for (let i = 0; !hit && i <= c.length; i++) for (let j = i; !hit && j <= c.length; j++) hit = j - i < c.length && all.has(c.slice(i, j));
    for (let k = 1; !hit && k < c.length; k++) hit = other(suffixes, c.slice(0, k), c) || other(prefixes, c.slice(c.length - k), c);
    if (hit) out.add(c);
  }
  return out;
}

/** The ids of `pieces` from the `from`th on, `total` of them. */
function concat(pieces: readonly (Uint32Array | number)[], from: number, total: number): Uint32Array {
  const out = new Uint32Array(total);
  let at = 0;
  for (let i = from; i < pieces.length; i++) {
    const p = pieces[i]!;
    if (typeof p === "number") out[at++] = p;
    else {
      out.set(p, at);
      at += p.length;
    }
  }
  return out;
}

function escapeRegExp(s: string): string {
  return s.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
}
