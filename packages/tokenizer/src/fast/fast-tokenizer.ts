import { AddedTokenMatcher } from "./added-tokens";
import { bpeModelOf, type BpeModel } from "./bpe-model";
import { WordMerger } from "./bpe-word";
import { cl100kDigits, scanCl100k } from "./cl100k-scanner";
import { cutPoints, type CutPoints } from "./cut-points";
import { isDeepSeekV3, scanDeepSeekV3 } from "./deepseek-scanner";
import { hfRegexToJs } from "./hf-regex";
import { normalizeAsReference } from "./reference-unicode";
import { BYTE_TO_CHAR } from "./whole-words";
import { TextTable, textHash, WordCache } from "./word-cache";

/**
 * A byte-level (GPT-2 style: Qwen, Llama 3, DeepSeek) or SentencePiece-style (Gemma: byte fallback) BPE
 * tokenizer compiled from a tokenizer.json, giving the ids Hugging Face's `encode(text, add_special_tokens=
 * false)` gives. Hand-written because it is the hot path of every pick and the measurement says so: on fresh
 * text (bench:tokenize, CPU time per token, one run) it costs 0.15-0.32 µs/token on each shipped model where
 * `@huggingface/tokenizers` costs 4-9 and Hugging Face's own native binding 1.4-6; the property tests hold it
 * equal to the native binding (Hugging Face's Rust code) on random text for each shipped model.
 * Anything this does not implement (another model type, normalizer, pre-tokenizer, lstrip/rstrip tokens)
 * makes `compileFastTokenizer` return the reason instead, and the caller keeps the library.
 */
export type FastTokenizer = {
  encode(text: string): Uint32Array;
  /** Where a text can be cut with its ids unchanged (see cut-points.ts), or null when nowhere is proven. */
  readonly cuts: CutPoints | null;
};
export type Compiled = { ok: true; tokenizer: FastTokenizer } | { ok: false; reason: string };
export type FastTokenizerOptions = {
  /** Bound of the word cache (pre-token -> ids), in bytes, allocated up front. */
  wordCacheBytes?: number;
};

type Json = Record<string, any>;
type Normalize = (s: string) => string;
/** A pre-token: text[start, end). */
type Emit = (text: string, start: number, end: number) => void;
/** Splits text[start, end), seen as a string of its own, into pieces given to `emit` in order. */
type Splitter = (text: string, start: number, end: number, emit: Emit) => void;

// 4 MiB: ~35k words per generation (both: ~70k). On the fresh-text bench 90-97% of pre-tokens hit once warm; a
// miss costs about twice a hit's whole per-token price (bench:tokenize's "every word new" row).
const WORD_CACHE_BYTES = 4 << 20;
// Hugging Face's BPE caches words shorter than this; longer ones are not worth keeping.
const WORD_CACHE_MAX_LENGTH = 256;
// SentencePiece's word-start mark, which a Replace normalizer puts for each space (Gemma).
const META = 0x2581;
const META_CHAR = String.fromCharCode(META);

export function compileFastTokenizer(json: Json, options: FastTokenizerOptions = {}): Compiled {
  try {
    return { ok: true, tokenizer: new BpeTokenizer(json, options) };
  } catch (err) {
    if (err instanceof Unsupported) return { ok: false, reason: err.message };
    throw err;
  }
}

class Unsupported extends Error {}

// ES2024 string methods (in Bun; not in this project's TypeScript lib setting).
type WellFormed = { isWellFormed(): boolean; toWellFormed(): string };

class BpeTokenizer implements FastTokenizer {
  private readonly rawTokens: AddedTokenMatcher;
  private readonly normalizedTokens: AddedTokenMatcher;
  private readonly normalize: Normalize | null;
  /** Pre-tokenizes text[start, end) and encodes each pre-token. */
  private readonly pretokenize: Emit;
  private readonly byteLevel: boolean;
  // Byte-level: the id of each byte's symbol. SentencePiece-style: the id of each <0xXX> byte token.
  private readonly byteIds = new Int32Array(256);
  // SentencePiece-style: the id of each character that is a token (BMP by code unit, the rest by code point).
  private readonly charIds = new Int32Array(0x10000).fill(-1);
  private readonly astralIds = new Map<number, number>();
  private readonly unkId: number;
  private readonly fuseUnk: boolean;
  // ignore_merges: a word that is itself in the vocabulary is one token (keys are the word's raw text).
  private readonly wholeWords: TextTable | null;
  // SentencePiece-style without a pre-tokenizer that splits (Gemma), a section is one BPE word. It may be cut
  // before a META whose preceding character is flagged here: no merge's result holds that character followed by
  // META, so no merge can join the symbols on either side, and the parts merge alone exactly as inside the whole
  // (each part's merges keep their order). Cut, the parts are ordinary words for the word cache; uncut, a
  // 30k-character section went through the heap whole (measured: most of Gemma 3's time).
  private readonly cutBeforeMeta: Uint8Array | null;
  // A code unit read as META (the raw text's space when the normalizer would replace it), or -1.
  private readonly metaAlias: number;
  private readonly merger: WordMerger;
  private readonly wordCache: WordCache;
  private syms = new Int32Array(256);
  private out = new Uint32Array(1024);
  private outLen = 0;
  readonly cuts: CutPoints | null;

  constructor(json: Json, options: FastTokenizerOptions) {
    const added = (json.added_tokens ?? []) as Json[];
    if (added.some((t) => t.lstrip || t.rstrip || t.single_word)) throw new Unsupported("added tokens with lstrip/rstrip/single_word");
    const normalize = compileNormalizer(json.normalizer);
    this.rawTokens = new AddedTokenMatcher(added.filter((t) => !t.normalized || normalize === null) as never);
    this.normalizedTokens = new AddedTokenMatcher(added.filter((t) => t.normalized && normalize !== null) as never);
    const pre = compilePreTokenizer(json.pre_tokenizer);
    this.byteLevel = pre.byteLevel;

    const model = json.model as Json;
    if (model?.type !== "BPE") throw new Unsupported(`model ${model?.type}`);
    if (model.dropout != null && model.dropout !== 0) throw new Unsupported("BPE dropout");
    if (model.continuing_subword_prefix || model.end_of_word_suffix) throw new Unsupported("subword prefix/suffix");
    const vocab = bpeModelOf(model); // only while compiling
    const missing = (token: string) => new Unsupported(`token ${JSON.stringify(token)} missing from the vocabulary`);
    const id = (token: string) => {
      const v = vocab.get(token);
      if (v === undefined) throw missing(token);
      return v;
    };
    if (vocab.missing !== null) throw missing(vocab.missing);
    this.merger = new WordMerger(vocab.mergeTable());
    const unk = model.unk_token == null ? undefined : vocab.get(model.unk_token);
    this.unkId = unk ?? -1;
    this.fuseUnk = model.fuse_unk === true;
    if (this.byteLevel) {
      BYTE_TO_CHAR.forEach((ch, byte) => (this.byteIds[byte] = id(ch)));
    } else {
      if (!model.byte_fallback && this.unkId < 0) throw new Unsupported("no byte fallback and no unk token");
      if (model.byte_fallback) {
        for (let b = 0; b < 256; b++) this.byteIds[b] = id(`<0x${b.toString(16).toUpperCase().padStart(2, "0")}>`);
      } else this.byteIds.fill(-1);
      for (const [token, tokenId] of vocab.entries()) {
        const cp = token.codePointAt(0)!;
        if (token.length === 1) this.charIds[cp] = tokenId;
        else if (token.length === 2 && cp > 0xffff) this.astralIds.set(cp, tokenId);
      }
    }
    // A table keyed by text ranges: a substring and a Map lookup per missed word were a fifth of Llama 3's time.
    this.wholeWords = model.ignore_merges ? vocab.wholeWords(this.byteLevel) : null;
    this.cutBeforeMeta = null;
    if (!this.byteLevel && this.wholeWords === null && this.charIds[META]! >= 0) {
      // A character that is a token of its own ends the symbol before the cut; anything else (a byte or unknown
      // token, a surrogate half) is not cut after.
      const glue = metaGlue(vocab);
      const cut = new Uint8Array(0x10000);
      for (let c = 0; c < 0x10000; c++) cut[c] = this.charIds[c]! >= 0 && glue[c] === 0 && (c < 0xd800 || c >= 0xe000) ? 1 : 0;
      this.cutBeforeMeta = cut;
    }
    // Gemma: the normalizer puts META for each space and the pre-tokenizer then splits at spaces, of which there
    // are none left. The raw text is read instead, a space taken as META (the same symbols and cuts): no
    // normalized copy of each section (its split/join was a sixth of Gemma's time), nothing to split.
    const alias = this.cutBeforeMeta !== null && this.normalizedTokens.empty ? replacedByMeta(json) : -1;
    this.metaAlias = alias;
    this.normalize = alias >= 0 ? null : normalize;
    if (alias >= 0) {
      this.charIds[alias] = this.charIds[META]!;
      this.cutBeforeMeta![alias] = this.cutBeforeMeta![META]!;
    }
    this.wordCache = new WordCache(options.wordCacheBytes ?? WORD_CACHE_BYTES, WORD_CACHE_MAX_LENGTH);

    const word: Emit = this.cutBeforeMeta !== null ? (t, s, e) => this.encodeCutting(t, s, e) : (t, s, e) => this.encodeWord(t, s, e);
    this.pretokenize = alias >= 0 ? word : pre.splitters.reduceRight<Emit>((next, split) => (t, s, e) => split(t, s, e, next), word);
    this.cuts = cutPoints(json);
  }

  encode(text: string): Uint32Array {
    this.outLen = 0;
    // Rust strings cannot hold a lone surrogate; the binding hands Rust U+FFFD in its place.
    const w = text as unknown as WellFormed;
    const t = w.isWellFormed() ? text : w.toWellFormed();
    this.rawTokens.split(t, (start, end) => {
      if (start === end) return;
      if (this.normalize === null) this.pretokenize(t, start, end);
      else {
        const normalized = this.normalize(start === 0 && end === t.length ? t : t.slice(start, end));
        if (this.normalizedTokens.empty) this.pretokenize(normalized, 0, normalized.length);
        else this.normalizedTokens.split(normalized, (s, e) => {
          if (s < e) this.pretokenize(normalized, s, e);
        }, (tokenId) => this.push(tokenId));
      }
    }, (tokenId) => this.push(tokenId));
    const ids = new Uint32Array(this.outLen);
    ids.set(this.out.subarray(0, this.outLen));
    return ids;
  }

  // One SentencePiece-style word, cut into parts before each META the merges cannot cross (see cutBeforeMeta).
  private encodeCutting(text: string, start: number, end: number): void {
    const cut = this.cutBeforeMeta!;
    const alias = this.metaAlias;
    let from = start;
    for (let i = start + 1; i < end; i++) {
      const c = text.charCodeAt(i);
      if ((c === META || c === alias) && cut[text.charCodeAt(i - 1)] === 1) {
        this.encodeWord(text, from, i);
        from = i;
      }
    }
    this.encodeWord(text, from, end);
  }

  private encodeWord(text: string, start: number, end: number): void {
    const cache = this.wordCache;
    const whole = this.wholeWords;
    const cacheable = end - start <= cache.maxWordLength;
    const hash = cacheable || whole !== null ? textHash(text, start, end) : 0;
    if (cacheable) {
      this.reserveOut(cache.maxWordLength);
      const n = cache.get(text, start, end, hash, this.out, this.outLen);
      if (n >= 0) {
        this.outLen += n;
        return;
      }
    }
    const entry = whole === null ? -1 : whole.find(text, start, end, hash);
    let m: number;
    if (entry >= 0) {
      this.syms[0] = whole!.firstId(entry);
      m = 1;
    } else {
      const n = this.byteLevel ? this.byteSymbols(text, start, end) : this.charSymbols(text, start, end);
      m = this.merger.merge(this.syms, n);
    }
    this.reserveOut(m);
    const out = this.out;
    for (let i = 0; i < m; i++) out[this.outLen++] = this.syms[i]!;
    if (cacheable) cache.add(text, start, end, hash, this.syms, 0, m);
  }

  // The UTF-8 bytes of text[start, end), each as its byte-level symbol.
  private byteSymbols(text: string, start: number, end: number): number {
    this.reserveSyms((end - start) * 3);
    const syms = this.syms;
    const ids = this.byteIds;
    let n = 0;
    for (let i = start; i < end; i++) {
      let c = text.charCodeAt(i);
      if (c < 0x80) syms[n++] = ids[c]!;
      else {
        // well-formed text: a high surrogate is followed by its low one
        if (c >= 0xd800 && c < 0xdc00) c = 0x10000 + ((c - 0xd800) << 10) + (text.charCodeAt(++i) - 0xdc00);
        n = utf8Symbols(c, ids, syms, n);
      }
    }
    return n;
  }

  // Each character of text[start, end) as its vocabulary symbol; one missing from the vocabulary as its UTF-8
  // byte tokens (byte fallback), else as the unknown token, consecutive ones fused when the model says so.
  private charSymbols(text: string, start: number, end: number): number {
    this.reserveSyms((end - start) * 4);
    const syms = this.syms;
    const bytes = this.byteIds;
    let n = 0;
    let lastUnk = false;
    for (let i = start; i < end; i++) {
      let c = text.charCodeAt(i);
      let id: number;
      if (c >= 0xd800 && c < 0xdc00) {
        c = 0x10000 + ((c - 0xd800) << 10) + (text.charCodeAt(++i) - 0xdc00);
        id = this.astralIds.get(c) ?? -1;
      } else id = this.charIds[c]!;
      if (id >= 0) {
        syms[n++] = id;
        lastUnk = false;
      } else if (bytes[0]! >= 0) {
        n = utf8Symbols(c, bytes, syms, n);
        lastUnk = false;
      } else if (!(this.fuseUnk && lastUnk)) {
        syms[n++] = this.unkId;
        lastUnk = true;
      }
    }
    return n;
  }

  private reserveSyms(n: number): void {
    if (this.syms.length < n) this.syms = new Int32Array(Math.max(n, this.syms.length * 2));
  }

  private reserveOut(n: number): void {
    if (this.outLen + n <= this.out.length) return;
    const grown = new Uint32Array(Math.max(this.outLen + n, this.out.length * 2));
    grown.set(this.out.subarray(0, this.outLen));
    this.out = grown;
  }

  private push(id: number): void {
    this.reserveOut(1);
    this.out[this.outLen++] = id;
  }
}

// The UTF-8 bytes of code point c, each as its symbol in `byteIds` (by byte value), written to syms from n; the new n.
function utf8Symbols(c: number, byteIds: Int32Array, syms: Int32Array, n: number): number {
  if (c < 0x80) syms[n++] = byteIds[c]!;
  else if (c < 0x800) {
    syms[n++] = byteIds[0xc0 | (c >> 6)]!;
    syms[n++] = byteIds[0x80 | (c & 63)]!;
  } else if (c < 0x10000) {
    syms[n++] = byteIds[0xe0 | (c >> 12)]!;
    syms[n++] = byteIds[0x80 | ((c >> 6) & 63)]!;
    syms[n++] = byteIds[0x80 | (c & 63)]!;
  } else {
    syms[n++] = byteIds[0xf0 | (c >> 18)]!;
    syms[n++] = byteIds[0x80 | ((c >> 12) & 63)]!;
    syms[n++] = byteIds[0x80 | ((c >> 6) & 63)]!;
    syms[n++] = byteIds[0x80 | (c & 63)]!;
  }
  return n;
}

/**
 * The code unit a tokenizer's normalizer replaces by META, when that is all it does and its pre-tokenizer only
 * splits at that unit (so finds nothing after normalizing); else -1.
 */
function replacedByMeta(json: Json): number {
  let n = json.normalizer as Json | null;
  if (n?.type === "Sequence" && (n.normalizers as Json[]).length === 1) n = (n.normalizers as Json[])[0]!;
  const from = n?.type === "Replace" ? n.pattern?.String : undefined;
  if (typeof from !== "string" || from.length !== 1 || n!.content !== META_CHAR) return -1;
  const unit = from.charCodeAt(0);
  if (unit === META || (unit >= 0xd800 && unit < 0xe000)) return -1;
  const p = json.pre_tokenizer as Json | null;
  const steps = p == null ? [] : p.type === "Sequence" ? (p.pretokenizers as Json[]) : [p];
  return steps.every((s) => s.type === "Split" && s.pattern?.String === from && !s.invert) ? unit : -1;
}

function compileNormalizer(n: Json | null | undefined): Normalize | null {
  if (n == null) return null;
  switch (n.type) {
    case "NFC": case "NFD": case "NFKC": case "NFKD": {
      const form = n.type as string;
      return (s) => normalizeAsReference(s, form);
    }
    case "Replace": {
      if (typeof n.pattern?.String !== "string") throw new Unsupported("Replace normalizer with a regex");
      const from = n.pattern.String as string;
      const to = n.content as string;
      // split/join: JavaScriptCore's replaceAll took ~2x as long (Gemma's every space)
      return from === "" ? (s) => s.replaceAll(from, to) : (s) => s.split(from).join(to);
    }
    case "Sequence": {
      const parts = (n.normalizers as Json[]).map(compileNormalizer).filter((f): f is Normalize => f !== null);
      if (parts.length === 0) return null;
      return parts.length === 1 ? parts[0]! : (s) => parts.reduce((acc, f) => f(acc), s);
    }
    default:
      throw new Unsupported(`normalizer ${n.type}`);
  }
}

// GPT-2's pattern, which ByteLevel applies itself when use_regex is true.
const GPT2_PATTERN = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

function compilePreTokenizer(p: Json | null | undefined): { splitters: Splitter[]; byteLevel: boolean } {
  if (p == null) return { splitters: [], byteLevel: false };
  let steps = p.type === "Sequence" ? (p.pretokenizers as Json[]) : [p];
  const splitters: Splitter[] = [];
  if (isDeepSeekV3(steps.slice(0, 3).filter((s) => s.type === "Split"))) {
    splitters.push((text, start, end, emit) => scanDeepSeekV3(text, start, end, (s, e) => emit(text, s, e)));
    steps = steps.slice(3);
  }
  let byteLevel = false;
  for (const s of steps) {
    if (byteLevel) throw new Unsupported("a pre-tokenizer after ByteLevel");
    switch (s.type) {
      case "Split": {
        if (s.invert) throw new Unsupported("inverted Split");
        const digits = s.pattern?.Regex !== undefined && s.behavior === "Isolated" ? cl100kDigits(s.pattern.Regex) : null;
        if (digits !== null) {
          splitters.push((text, start, end, emit) => scanCl100k(text, start, end, digits, (s, e) => emit(text, s, e)));
          break;
        }
        const re = s.pattern?.Regex !== undefined ? hfRegexToJs(s.pattern.Regex) : new RegExp(escapeRegExp(s.pattern.String), "gu");
        splitters.push(splitter(re, s.behavior));
        break;
      }
      case "ByteLevel":
        if (s.add_prefix_space) throw new Unsupported("ByteLevel add_prefix_space");
        if (s.use_regex) splitters.push(splitter(hfRegexToJs(GPT2_PATTERN), "Isolated"));
        byteLevel = true;
        break;
      default:
        throw new Unsupported(`pre-tokenizer ${s.type}`);
    }
  }
  return { splitters, byteLevel };
}

// Hugging Face's Split behaviours: "Isolated" makes each match a piece of its own, "MergedWithPrevious" ends
// a piece with each match; the text between matches is a piece either way. The regex sees the range as a
// string of its own (lookarounds stop at its ends).
function splitter(re: RegExp, behavior: string): Splitter {
  if (behavior !== "Isolated" && behavior !== "MergedWithPrevious") throw new Unsupported(`Split behavior ${behavior}`);
  const isolated = behavior === "Isolated";
  return (text, start, end, emit) => {
    const piece = start === 0 && end === text.length ? text : text.slice(start, end);
    re.lastIndex = 0;
    let from = 0;
    for (let m = re.exec(piece); m !== null; m = re.exec(piece)) {
      const to = m.index + m[0].length;
      if (to === m.index) {
        re.lastIndex++;
        continue;
      }
      if (isolated) {
        if (m.index > from) emit(piece, from, m.index);
        emit(piece, m.index, to);
      } else emit(piece, from, to);
      from = to;
    }
    if (from < piece.length) emit(piece, from, piece.length);
  };
}

// The code units found right before META inside a merge's result.
function metaGlue(model: BpeModel): Uint8Array {
  const glue = new Uint8Array(0x10000);
  for (let i = 0; i < model.merges.length / 3; i++) {
    const joined = model.mergeParts(i).join("");
    for (let at = joined.indexOf(META_CHAR, 1); at > 0; at = joined.indexOf(META_CHAR, at + 1)) glue[joined.charCodeAt(at - 1)] = 1;
  }
  return glue;
}

function escapeRegExp(s: string): string {
  return s.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
}
