import { AddedTokenMatcher } from "./added-tokens";
import { WordMerger } from "./bpe-word";
import { cl100kDigits, scanCl100k } from "./cl100k-scanner";
import { cutPoints, type CutPoints } from "./cut-points";
import { hfRegexToJs } from "./hf-regex";
import { MergeTable } from "./merge-table";

/**
 * A byte-level (GPT-2 style: Qwen, Llama 3, DeepSeek) or SentencePiece-style (Gemma: byte fallback) BPE
 * tokenizer compiled from a tokenizer.json, giving the ids Hugging Face's `encode(text, add_special_tokens=
 * false)` gives. Hand-written because it is the hot path of every pick and measured ~4x faster per core than
 * `@huggingface/tokenizers` and the native `tokenizers` binding on fresh text (bench:tokenize); the property
 * tests hold it equal to the native binding (Hugging Face's Rust code) on random text for each shipped model.
 * Anything this does not implement (another model type, normalizer, pre-tokenizer, lstrip/rstrip tokens)
 * makes `compileFastTokenizer` return the reason instead, and the caller keeps the library.
 */
export type FastTokenizer = {
  encode(text: string): Uint32Array;
  /** Where a text can be cut with its ids unchanged (see cut-points.ts), or null when nowhere is proven. */
  readonly cuts: CutPoints | null;
};
export type Compiled = { ok: true; tokenizer: FastTokenizer } | { ok: false; reason: string };

type Json = Record<string, any>;
type Normalize = (s: string) => string;
type Splitter = (piece: string, emit: (s: string) => void) => void;

const WORD_CACHE_ENTRIES = 50_000;
// Hugging Face's BPE caches words shorter than this; longer ones (a SentencePiece section) are not worth keeping.
const WORD_CACHE_MAX_LENGTH = 256;

export function compileFastTokenizer(json: Json): Compiled {
  try {
    return { ok: true, tokenizer: new BpeTokenizer(json) };
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
  private readonly splitters: Splitter[];
  private readonly byteLevel: boolean;
  private readonly vocab: Map<string, number>;
  // Byte-level: the id of each byte's symbol. SentencePiece-style: the id of each <0xXX> byte token.
  private readonly byteIds = new Int32Array(256);
  private readonly unkId: number;
  private readonly fuseUnk: boolean;
  // ignore_merges: a word that is itself in the vocabulary is one token (keys are the word's raw text).
  private readonly wholeWords: Map<string, number> | null;
  private readonly merger: WordMerger;
  private readonly wordCache = new Map<string, Int32Array>();
  private syms = new Int32Array(256);
  private out = new Uint32Array(1024);
  private outLen = 0;
  private readonly emitWord = (w: string) => this.encodeWord(w);
  readonly cuts: CutPoints | null;

  constructor(json: Json) {
    const added = (json.added_tokens ?? []) as Json[];
    if (added.some((t) => t.lstrip || t.rstrip || t.single_word)) throw new Unsupported("added tokens with lstrip/rstrip/single_word");
    this.normalize = compileNormalizer(json.normalizer);
    this.rawTokens = new AddedTokenMatcher(added.filter((t) => !t.normalized || this.normalize === null) as never);
    this.normalizedTokens = new AddedTokenMatcher(added.filter((t) => t.normalized && this.normalize !== null) as never);
    const pre = compilePreTokenizer(json.pre_tokenizer);
    this.splitters = pre.splitters;
    this.byteLevel = pre.byteLevel;

    const model = json.model as Json;
    if (model?.type !== "BPE") throw new Unsupported(`model ${model?.type}`);
    if (model.dropout != null && model.dropout !== 0) throw new Unsupported("BPE dropout");
    if (model.continuing_subword_prefix || model.end_of_word_suffix) throw new Unsupported("subword prefix/suffix");
    this.vocab = new Map(Object.entries(model.vocab as Record<string, number>));
    const id = (token: string) => {
      const v = this.vocab.get(token);
      if (v === undefined) throw new Unsupported(`token ${JSON.stringify(token)} missing from the vocabulary`);
      return v;
    };
    const merges: [number, number, number][] = (model.merges as (string | [string, string])[]).map((m) => {
      const [a, b] = typeof m === "string" ? splitMerge(m) : m;
      return [id(a), id(b), id(a + b)];
    });
    this.merger = new WordMerger(new MergeTable(merges));
    const unk = model.unk_token == null ? undefined : this.vocab.get(model.unk_token);
    this.unkId = unk ?? -1;
    this.fuseUnk = model.fuse_unk === true;
    if (this.byteLevel) {
      BYTE_TO_CHAR.forEach((ch, byte) => (this.byteIds[byte] = id(ch)));
    } else {
      if (!model.byte_fallback && this.unkId < 0) throw new Unsupported("no byte fallback and no unk token");
      if (model.byte_fallback) {
        for (let b = 0; b < 256; b++) this.byteIds[b] = id(`<0x${b.toString(16).toUpperCase().padStart(2, "0")}>`);
      } else this.byteIds.fill(-1);
    }
    this.wholeWords = model.ignore_merges ? wholeWordIds(this.vocab, this.byteLevel) : null;
    this.cuts = cutPoints(json);
  }

  encode(text: string): Uint32Array {
    this.outLen = 0;
    // Rust strings cannot hold a lone surrogate; the binding hands Rust U+FFFD in its place.
    const w = text as unknown as WellFormed;
    const t = w.isWellFormed() ? text : w.toWellFormed();
    this.rawTokens.split(t, (start, end) => {
      if (start === end) return;
      const gap = start === 0 && end === t.length ? t : t.slice(start, end);
      if (this.normalize === null) this.pretokenize(gap);
      else {
        const normalized = this.normalize(gap);
        if (this.normalizedTokens.empty) this.pretokenize(normalized);
        else this.normalizedTokens.split(normalized, (s, e) => {
          if (s < e) this.pretokenize(normalized.slice(s, e));
        }, (tokenId) => this.push(tokenId));
      }
    }, (tokenId) => this.push(tokenId));
    return this.out.slice(0, this.outLen);
  }

  private pretokenize(text: string): void {
    if (this.splitters.length === 0) this.encodeWord(text);
    else this.splitAt(0, text);
  }

  private splitAt(level: number, piece: string): void {
    const last = level === this.splitters.length - 1;
    this.splitters[level]!(piece, last ? this.emitWord : (p) => this.splitAt(level + 1, p));
  }

  private encodeWord(word: string): void {
    const cached = this.wordCache.get(word);
    if (cached !== undefined) {
      for (let i = 0; i < cached.length; i++) this.push(cached[i]!);
      return;
    }
    if (this.wholeWords !== null) {
      const whole = this.wholeWords.get(word);
      if (whole !== undefined) return this.push(whole);
    }
    const n = this.byteLevel ? this.byteSymbols(word) : this.charSymbols(word);
    const m = this.merger.merge(this.syms, n);
    for (let i = 0; i < m; i++) this.push(this.syms[i]!);
    if (word.length < WORD_CACHE_MAX_LENGTH) {
      if (this.wordCache.size >= WORD_CACHE_ENTRIES) this.wordCache.clear();
      this.wordCache.set(detach(word), this.syms.slice(0, m));
    }
  }

  // The UTF-8 bytes of the word, each as its byte-level symbol.
  private byteSymbols(word: string): number {
    this.reserveSyms(word.length * 3);
    const syms = this.syms;
    const ids = this.byteIds;
    let n = 0;
    for (let i = 0; i < word.length; i++) {
      let c = word.charCodeAt(i);
      if (c < 0x80) syms[n++] = ids[c]!;
      else if (c < 0x800) {
        syms[n++] = ids[0xc0 | (c >> 6)]!;
        syms[n++] = ids[0x80 | (c & 63)]!;
      } else if (c >= 0xd800 && c < 0xdc00) {
        // well-formed text: a high surrogate is followed by its low one
        c = 0x10000 + ((c - 0xd800) << 10) + (word.charCodeAt(++i) - 0xdc00);
        syms[n++] = ids[0xf0 | (c >> 18)]!;
        syms[n++] = ids[0x80 | ((c >> 12) & 63)]!;
        syms[n++] = ids[0x80 | ((c >> 6) & 63)]!;
        syms[n++] = ids[0x80 | (c & 63)]!;
      } else {
        syms[n++] = ids[0xe0 | (c >> 12)]!;
        syms[n++] = ids[0x80 | ((c >> 6) & 63)]!;
        syms[n++] = ids[0x80 | (c & 63)]!;
      }
    }
    return n;
  }

  // Each character as its vocabulary symbol; one missing from the vocabulary as its UTF-8 byte tokens (byte
  // fallback), else as the unknown token, consecutive ones fused when the model says so.
  private charSymbols(word: string): number {
    this.reserveSyms(word.length * 4);
    const syms = this.syms;
    let n = 0;
    let lastUnk = false;
    for (let i = 0; i < word.length; i++) {
      const c = word.charCodeAt(i);
      const wide = c >= 0xd800 && c < 0xdc00;
      const ch = wide ? word.slice(i, i + 2) : word[i]!;
      if (wide) i++;
      const id = this.vocab.get(ch);
      if (id !== undefined) {
        syms[n++] = id;
        lastUnk = false;
      } else if (this.byteIds[0]! >= 0) {
        const bytes = Buffer.from(ch, "utf8");
        for (const b of bytes) syms[n++] = this.byteIds[b]!;
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

  private push(id: number): void {
    if (this.outLen === this.out.length) {
      const grown = new Uint32Array(this.out.length * 2);
      grown.set(this.out);
      this.out = grown;
    }
    this.out[this.outLen++] = id;
  }
}

function compileNormalizer(n: Json | null | undefined): Normalize | null {
  if (n == null) return null;
  switch (n.type) {
    case "NFC": case "NFD": case "NFKC": case "NFKD": {
      const form = n.type as string;
      return (s) => s.normalize(form);
    }
    case "Replace": {
      if (typeof n.pattern?.String !== "string") throw new Unsupported("Replace normalizer with a regex");
      const from = n.pattern.String as string;
      const to = n.content as string;
      return (s) => s.replaceAll(from, to);
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
  const steps = p.type === "Sequence" ? (p.pretokenizers as Json[]) : [p];
  const splitters: Splitter[] = [];
  let byteLevel = false;
  for (const s of steps) {
    if (byteLevel) throw new Unsupported("a pre-tokenizer after ByteLevel");
    switch (s.type) {
      case "Split": {
        if (s.invert) throw new Unsupported("inverted Split");
        const digits = s.pattern?.Regex !== undefined && s.behavior === "Isolated" ? cl100kDigits(s.pattern.Regex) : null;
        if (digits !== null) {
          splitters.push((piece, emit) =>
            scanCl100k(piece, digits, (start, end) => emit(start === 0 && end === piece.length ? piece : piece.slice(start, end))));
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
// a piece with each match; the text between matches is a piece either way.
function splitter(re: RegExp, behavior: string): Splitter {
  if (behavior !== "Isolated" && behavior !== "MergedWithPrevious") throw new Unsupported(`Split behavior ${behavior}`);
  const isolated = behavior === "Isolated";
  return (piece, emit) => {
    re.lastIndex = 0;
    let from = 0;
    for (let m = re.exec(piece); m !== null; m = re.exec(piece)) {
      const end = m.index + m[0].length;
      if (end === m.index) {
        re.lastIndex++;
        continue;
      }
      if (isolated) {
        if (m.index > from) emit(piece.slice(from, m.index));
        emit(m.index === 0 && end === piece.length ? piece : piece.slice(m.index, end));
      } else emit(piece.slice(from, end));
      from = end;
    }
    if (from < piece.length) emit(from === 0 ? piece : piece.slice(from));
  };
}

function splitMerge(m: string): [string, string] {
  const at = m.indexOf(" ", 1);
  return [m.slice(0, at), m.slice(at + 1)];
}

// GPT-2's byte-to-unicode table: printable bytes stand for themselves, the others map to U+0100 onwards.
const BYTE_TO_CHAR: string[] = (() => {
  const printable = (b: number) => (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
  let next = 256;
  return Array.from({ length: 256 }, (_, b) => String.fromCharCode(printable(b) ? b : next++));
})();

function wholeWordIds(vocab: Map<string, number>, byteLevel: boolean): Map<string, number> {
  if (!byteLevel) return vocab;
  const charToByte = new Map(BYTE_TO_CHAR.map((ch, b) => [ch, b]));
  const decoder = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });
  const out = new Map<string, number>();
  for (const [token, id] of vocab) {
    const bytes = Uint8Array.from(token, (ch) => charToByte.get(ch) ?? -1);
    if ([...token].some((ch) => !charToByte.has(ch))) continue;
    try {
      out.set(decoder.decode(bytes), id);
    } catch {
      // not whole UTF-8 characters: no word of text can equal it
    }
  }
  return out;
}

function escapeRegExp(s: string): string {
  return s.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
}

// Words are slices of a request's text, and JavaScriptCore lets a slice keep its whole source alive; a cached
// word gets a buffer of its own (see the segment cache).
function detach(word: string): string {
  return Buffer.from(word, "utf16le").toString("utf16le");
}
