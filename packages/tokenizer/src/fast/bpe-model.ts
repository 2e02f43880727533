import { FNV_OFFSET, FNV_PRIME, hashRange } from "./fnv";
import { MergeTable, type MergeArrays } from "./merge-table";
import { sharedCopy } from "./shared-arrays";
import { grown, VocabTable, type VocabArrays } from "./vocab-table";
import { wholeWordTable } from "./whole-words";
import { TextTable, type TextTableArrays } from "./word-cache";

/**
 * A BPE model's vocabulary and merges as the fast BPE compiles them. `parseTokenizerJson` reads them straight out
 * of a tokenizer.json's text into a VocabTable (JSON.parse reads the rest of the file); `bpeModelOf` gives them
 * for a model object either way.
 *
 * Hand-written because the measurement says so (Qwen3's 11 MB tokenizer.json, createPreprocessor, bun, 2 cores):
 * JSON.parse of the whole file was ~35% of the load, `Object.entries(vocab)` into a Map ~12% and the merges' splits
 * and Map lookups ~15%; the scanner does all of it in one pass over the text without a string per token.
 * createPreprocessor on Qwen3 went from 590-694 ms to 269-300 (3 runs each; with tokenizer-files.ts' mapped read).
 */
export type BpeModel = {
  get(token: string): number | undefined;
  entries(): Iterable<[string, number]>;
  /** Per merge in rank order: left id, right id, merged id. */
  merges: Int32Array;
  /** Merge i's two parts. */
  mergeParts(i: number): [string, string];
  /** The first token (in the order merges are read: left, right, merged) that the vocabulary lacks, or null. */
  missing: string | null;
  /** The merges as the fast BPE looks them up, built on first call. */
  mergeTable(): MergeTable;
  /** The whole-word table of an `ignore_merges` model (whole-words.ts), built on first call for each kind. */
  wholeWords(byteLevel: boolean): TextTable;
};

type Json = Record<string, any>;

/** A scanned model's tables: the vocabulary, and per merge its parts' and result's ids and its parts' entries. */
type Tables = { vocab: VocabTable; merges: Omit<ScannedMerges, "end"> };

// The scanned model of each model object parseTokenizerJson made (its vocab and merges are built on first read).
const scanned = new WeakMap<object, BpeModel & { tables: Tables }>();

/** A token's id in a model object's vocabulary, without building a scanned model's vocab object. */
export function vocabIdOf(model: Json | undefined, token: string): number | undefined {
  if (model == null) return undefined;
  const known = scanned.get(model);
  return known !== undefined ? known.get(token) : (model.vocab as Record<string, number> | undefined)?.[token];
}

/** The vocabulary and merges of a BPE model object (`tokenizer.json`'s `model`). */
export function bpeModelOf(model: Json): BpeModel {
  const known = scanned.get(model);
  if (known !== undefined) return known;
  const vocab = new Map(Object.entries(model.vocab as Record<string, number>));
  const parts: string[] = [];
  for (const m of model.merges as (string | [string, string])[]) {
    const [a, b] = typeof m === "string" ? splitMerge(m) : m;
    parts.push(a, b);
  }
  const merges = new Int32Array((parts.length / 2) * 3);
  let missing: string | null = null;
  for (let k = 0; k < merges.length && missing === null; k++) {
    const i = Math.floor(k / 3);
    const token = k % 3 === 2 ? parts[2 * i]! + parts[2 * i + 1]! : parts[2 * i + (k % 3)]!;
    const id = vocab.get(token);
    if (id === undefined) missing = token;
    else merges[k] = id;
  }
  const mergeTable = once(() => new MergeTable(merges));
  const wholeWords = wholeWordsOnce(() => vocab, null);
  return { get: (t) => vocab.get(t), entries: () => vocab, merges, mergeParts: (i) => [parts[2 * i]!, parts[2 * i + 1]!], missing, mergeTable, wholeWords };
}

/**
 * A tokenizer.json's `model` object for other threads (posted as workerData): a scanned one as its other fields and
 * its tables, vocabulary and merges (and the merge table the fast BPE builds from them, and an `ignore_merges` model's
 * whole-word table for a tokenizer `byteLevel` or not) in shared memory, which every thread that adopts it reads and
 * none copies; any other as it is.
 */
export type SharedModel = { fields: Json; tables: SharedTables | null };
export type SharedTables = {
  vocab: VocabArrays; ids: Int32Array; entries: Int32Array; strings: boolean; mergeTable: MergeArrays;
  wholeWords: SharedWholeWords | null;
};
type SharedWholeWords = { byteLevel: boolean; table: TextTableArrays };

export function shareModel(model: Json, byteLevel: boolean): SharedModel {
  const known = scanned.get(model);
  if (known === undefined) return { fields: model, tables: null };
  // Its vocab and merges are left out, not read: they are getters building them (see lazy).
  const fields = Object.fromEntries(Object.keys(model).filter((k) => k !== "vocab" && k !== "merges").map((k) => [k, model[k]]));
  const { vocab, merges } = known.tables;
  return {
    fields,
    tables: {
      vocab: vocab.shared(), ids: sharedCopy(merges.ids), entries: sharedCopy(merges.entries), strings: merges.strings,
      mergeTable: known.mergeTable().shared(),
      wholeWords: model.ignore_merges ? { byteLevel, table: known.wholeWords(byteLevel).shared() } : null,
    },
  };
}

/** The model object of a SharedModel, as parseTokenizerJson gives it, its tables the shared ones (read-only). */
export function adoptModel(shared: SharedModel): Json {
  const { fields, tables } = shared;
  if (tables === null) return fields;
  const merges = { ids: tables.ids, entries: tables.entries, strings: tables.strings };
  const model = { ...fields };
  install(model, { vocab: new VocabTable(tables.vocab), merges }, new MergeTable(tables.mergeTable), tables.wholeWords);
  return model;
}

// The model's vocab and merges built on first read from its tables, which the fast BPE reads directly.
function install(model: Json, tables: Tables, mergeTable?: MergeTable, wholeWords: SharedWholeWords | null = null): void {
  const { vocab: table, merges } = tables;
  const mergeParts = (i: number): [string, string] => [table.key(merges.entries[2 * i]!), table.key(merges.entries[2 * i + 1]!)];
  lazy(model, "vocab", () => Object.fromEntries(table.entries()));
  lazy(model, "merges", () => Array.from({ length: merges.entries.length / 2 }, (_, i) => {
    const [a, b] = mergeParts(i);
    return merges.strings ? `${a} ${b}` : [a, b];
  }));
  scanned.set(model, {
    get: (t) => table.get(t), entries: () => table.entries(), merges: merges.ids, mergeParts, missing: null,
    mergeTable: mergeTable === undefined ? once(() => new MergeTable(merges.ids)) : () => mergeTable,
    wholeWords: wholeWordsOnce(() => table.entries(), wholeWords), tables,
  });
}

// A model's whole-word tables, each built on first call; a shared one adopted as it is.
function wholeWordsOnce(vocab: () => Iterable<[string, number]>, shared: SharedWholeWords | null): (byteLevel: boolean) => TextTable {
  const made = new Map<boolean, TextTable>();
  if (shared !== null) made.set(shared.byteLevel, TextTable.adopt(shared.table));
  return (byteLevel) => {
    let table = made.get(byteLevel);
    if (table === undefined) made.set(byteLevel, (table = wholeWordTable(vocab(), byteLevel)));
    return table;
  };
}

function once<T>(make: () => T): () => T {
  let made: T | undefined;
  return () => (made ??= make());
}

function splitMerge(m: string): [string, string] {
  const at = m.indexOf(" ", 1);
  return [m.slice(0, at), m.slice(at + 1)];
}

/**
 * `JSON.parse(text)` of a tokenizer.json, the same value. When `model.vocab` and `model.merges` have the usual
 * shapes (token -> integer id; merges all "a b" strings or all [a, b] pairs, each part and result in the
 * vocabulary) a scanner reads them and they are built only when something reads them (the reference library, for
 * decoding); anything else, malformed text included, goes to JSON.parse whole, errors and all.
 */
export function parseTokenizerJson(text: string): Json {
  const table = new VocabTable(text.length);
  const spans = findModelSpans(text, table);
  const merges = spans === null ? null : (spans.scanned ?? scanMerges(text, spans.merges[0], table));
  // The scanner's last token would hold the whole text (Qwen3's: ~20 MB as UTF-16) for the life of the thread.
  tok.src = "";
  if (spans === null || merges === null || merges.end !== spans.merges[1]) return JSON.parse(text);
  table.trim();
  const [first, second] = spans.vocab[0] < spans.merges[0] ? [spans.vocab, spans.merges] : [spans.merges, spans.vocab];
  const hole = (span: Span) => (span === spans.vocab ? "{}" : "[]");
  let rest: Json;
  try {
    rest = JSON.parse(text.slice(0, first[0]) + hole(first) + text.slice(first[1], second[0]) + hole(second) + text.slice(second[1]));
  } catch {
    return JSON.parse(text); // its own error, about the text as given
  }
  install(rest.model as Json, { vocab: table, merges });
  return rest;
}

// An own enumerable property built on first read, then an ordinary data property. A value written over it makes
// the model's scanned form stale: bpeModelOf then reads the object.
function lazy(target: Json, key: string, build: () => unknown): void {
  const settle = (value: unknown) => Object.defineProperty(target, key, { value, writable: true, configurable: true, enumerable: true });
  Object.defineProperty(target, key, {
    configurable: true,
    enumerable: true,
    get() {
      const value = build();
      settle(value);
      return value;
    },
    set(value) {
      scanned.delete(target);
      settle(value);
    },
  });
}

type Span = [number, number];

const QUOTE = 0x22;
const BACKSLASH = 0x5c;

/**
 * The spans [start, end) of the top-level `model`'s `vocab` object and `merges` array, the vocabulary read into
 * `table` on the way; null when the text is not an object holding them once each, in the usual shapes.
 */
function findModelSpans(text: string, table: VocabTable): { vocab: Span; merges: Span; scanned: ScannedMerges | null } | null {
  let vocab: Span | null = null;
  let merges: Span | null = null;
  let scanned: ScannedMerges | null = null;
  let sawModel = false;
  const end = walkObject(text, skipWs(text, 0), (key, at) => {
    if (key !== "model") return skipValue(text, at);
    // A repeated key is left to JSON.parse (the last one wins there).
    if (sawModel) return -1;
    sawModel = true;
    return walkObject(text, at, (inner, v) => {
      if (inner !== "vocab" && inner !== "merges") return skipValue(text, v);
      if ((inner === "vocab" ? vocab : merges) !== null) return -1;
      if (inner === "vocab") {
        vocab = [v, scanVocab(text, v, table)];
        return vocab[1];
      }
      // Before the vocabulary (never so in Hugging Face's files), the merges are looked up once it is read.
      const m = vocab === null ? null : scanMerges(text, v, table);
      scanned = m;
      merges = [v, m === null ? skipValue(text, v) : m.end];
      return vocab === null ? merges[1] : m === null ? -1 : m.end;
    });
  });
  if (end < 0 || skipWs(text, end) !== text.length || vocab === null || merges === null) return null;
  return { vocab, merges, scanned };
}

/**
 * Walks the object at `at`, calling `value(key, start)` for each member, which returns where the value ends (or
 * -1 to give up). Returns the index after the object, or -1. Counterpart: request/model-members.ts modelMembers/valueEnd,
 * the same walk over a request body's bytes; no shared code, as a tokenizer file is read as decoded text.
 */
function walkObject(text: string, at: number, value: (key: string, start: number) => number): number {
  if (text.charCodeAt(at) !== 0x7b) return -1;
  let i = skipWs(text, at + 1);
  if (text.charCodeAt(i) === 0x7d) return i + 1;
  for (;;) {
    const keyEnd = stringEnd(text, i);
    const key = keyEnd < 0 ? null : readString(text, i, keyEnd);
    if (key === null) return -1;
    i = skipWs(text, keyEnd);
    if (text.charCodeAt(i) !== 0x3a) return -1;
    const end = value(key, skipWs(text, i + 1));
    if (end < 0) return -1;
    i = skipWs(text, end);
    const c = text.charCodeAt(i);
    if (c === 0x7d) return i + 1;
    if (c !== 0x2c) return -1;
    i = skipWs(text, i + 1);
  }
}

// Where the value at `at` ends, its grammar inside not checked (JSON.parse of the rest checks it), or -1.
function skipValue(text: string, at: number): number {
  const c = text.charCodeAt(at);
  if (c === QUOTE) return stringEnd(text, at);
  if (c === 0x7b || c === 0x5b) {
    let depth = 0;
    for (let i = at; i < text.length; ) {
      const d = text.charCodeAt(i);
      if (d === QUOTE) {
        i = stringEnd(text, i);
        if (i < 0) return -1;
        continue;
      }
      if (d === 0x7b || d === 0x5b) depth++;
      else if ((d === 0x7d || d === 0x5d) && --depth === 0) return i + 1;
      i++;
    }
    return -1;
  }
  let i = at;
  for (let d = c; i < text.length && d !== 0x2c && d !== 0x7d && d !== 0x5d && !isWs(d); d = text.charCodeAt(++i));
  return i === at ? -1 : i;
}

function isWs(c: number): boolean {
  return c === 0x20 || c === 0x0a || c === 0x0d || c === 0x09;
}

// The hot loop of a pretty-printed file (most of Qwen3's merges are indentation): the test inlined.
function skipWs(text: string, i: number): number {
  for (;;) {
    const c = text.charCodeAt(i);
    if (c > 0x20 || (c !== 0x20 && c !== 0x0a && c !== 0x0d && c !== 0x09)) return i;
    i++;
  }
}

/**
 * The index after the JSON string starting at `at`, or -1 when there is none or it holds a raw control character
 * (which JSON.parse refuses). Escapes are stepped over, not checked: readString's JSON.parse checks them.
 */
function stringEnd(text: string, at: number): number {
  if (text.charCodeAt(at) !== QUOTE) return -1;
  for (let i = at + 1; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c === QUOTE) return i + 1;
    if (c === BACKSLASH) i++;
    else if (c < 0x20) return -1;
  }
  return -1;
}

// The string text[at, end) (a stringEnd found, quotes included) as JSON.parse reads it, or null when it refuses it.
function readString(text: string, at: number, end: number): string | null {
  const body = text.slice(at + 1, end - 1);
  if (!body.includes("\\")) return body;
  try {
    return JSON.parse(text.slice(at, end)) as string;
  } catch {
    return null;
  }
}

/** A token read by scanToken: src[start, end), hashed (VocabTable's hash). */
const tok = { src: "", start: 0, end: 0, hash: 0 };

/**
 * Reads the JSON string at `at` into `tok`, hashing it on the way: in place, or JSON.parse's reading of it when it
 * holds a backslash. Returns the index after it, or -1 (not a string, a raw control character, a bad escape).
 */
function scanToken(text: string, at: number): number {
  if (text.charCodeAt(at) !== QUOTE) return -1;
  let h = FNV_OFFSET;
  for (let i = at + 1; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c === QUOTE) {
      tok.src = text;
      tok.start = at + 1;
      tok.end = i;
      tok.hash = h;
      return i + 1;
    }
    if (c === BACKSLASH) {
      const end = stringEnd(text, at);
      const s = end < 0 ? null : readString(text, at, end);
      if (s === null) return -1;
      tok.src = s;
      tok.start = 0;
      tok.end = s.length;
      tok.hash = hashRange(FNV_OFFSET, s, 0, s.length);
      return end;
    }
    if (c < 0x20) return -1;
    h = Math.imul(h ^ c, FNV_PRIME);
  }
  return -1;
}

// scanToken, then whitespace and the character `then`: the index after that, or -1.
function scanTokenThen(text: string, at: number, then: number): number {
  const end = scanToken(text, at);
  if (end < 0) return -1;
  const i = skipWs(text, end);
  return text.charCodeAt(i) === then ? i + 1 : -1;
}

/**
 * Reads the vocabulary object at `at` into `table`; returns where it ends, or -1 when it is not all string keys
 * and integer ids that fit the table's Int32Array (no sign, fraction or exponent; at most 9 digits).
 */
function scanVocab(text: string, at: number, table: VocabTable): number {
  if (text.charCodeAt(at) !== 0x7b) return -1;
  let i = skipWs(text, at + 1);
  if (text.charCodeAt(i) === 0x7d) return i + 1;
  for (;;) {
    let j = scanToken(text, i);
    if (j < 0) return -1;
    j = skipWs(text, j);
    if (text.charCodeAt(j) !== 0x3a) return -1;
    const v = (j = skipWs(text, j + 1));
    let id = 0;
    if (text.charCodeAt(j) === 0x30) j++;
    else for (let d = text.charCodeAt(j) - 0x30; d >= 0 && d <= 9 && j - v < 9; d = text.charCodeAt(++j) - 0x30) id = id * 10 + d;
    if (j === v) return -1;
    table.set(tok.hash, tok.src, tok.start, tok.end, id);
    i = skipWs(text, j);
    const c = text.charCodeAt(i);
    if (c === 0x7d) return i + 1;
    if (c !== 0x2c) return -1;
    i = skipWs(text, i + 1);
  }
}

/** Merges read: per merge its parts' and result's ids and its parts' entries; "a b" strings or [a, b] pairs; where the array ends. */
type ScannedMerges = { ids: Int32Array; entries: Int32Array; strings: boolean; end: number };

/**
 * The merges array at `at` looked up in `table`: per merge the ids of its parts and result and the entries of its
 * parts, whether they were "a b" strings (else [a, b] pairs), and where the array ends. Null when they are neither
 * all one nor all the other, a string has no space to split at, or a part or result is not in the vocabulary.
 */
function scanMerges(text: string, at: number, table: VocabTable): ScannedMerges | null {
  let ids = new Int32Array(table.count * 3);
  let entries = new Int32Array(table.count * 2);
  let n = 0;
  let strings: boolean | null = null;
  const done = (i: number) => ({ ids: ids.slice(0, 3 * n), entries: entries.slice(0, 2 * n), strings: strings ?? true, end: i + 1 });
  if (text.charCodeAt(at) !== 0x5b) return null;
  let i = skipWs(text, at + 1);
  if (text.charCodeAt(i) === 0x5d) return done(i);
  for (;;) {
    const c = text.charCodeAt(i);
    let aSrc: string, aStart: number, aEnd: number, aHash: number, bSrc: string, bStart: number, bEnd: number, bHash: number;
    if (c === QUOTE && strings !== false) {
      strings = true;
      i = scanToken(text, i);
      if (i < 0) return null;
      // Hugging Face splits at the first space after the first character.
      const space = tok.src.indexOf(" ", tok.start + 1);
      if (space < 0 || space >= tok.end) return null;
      aSrc = bSrc = tok.src;
      aStart = tok.start;
      aEnd = space;
      bStart = space + 1;
      bEnd = tok.end;
      aHash = hashRange(FNV_OFFSET, aSrc, aStart, aEnd);
      bHash = hashRange(FNV_OFFSET, bSrc, bStart, bEnd);
    } else if (c === 0x5b && strings !== true) {
      strings = false;
      i = scanTokenThen(text, skipWs(text, i + 1), 0x2c);
      if (i < 0) return null;
      ({ src: aSrc, start: aStart, end: aEnd, hash: aHash } = tok);
      i = scanTokenThen(text, skipWs(text, i), 0x5d);
      if (i < 0) return null;
      ({ src: bSrc, start: bStart, end: bEnd, hash: bHash } = tok);
    } else return null;
    const left = table.find(aHash, aSrc, aStart, aEnd, aSrc, aEnd, aEnd);
    const right = table.find(bHash, bSrc, bStart, bEnd, bSrc, bEnd, bEnd);
    const merged = table.find(hashRange(aHash, bSrc, bStart, bEnd), aSrc, aStart, aEnd, bSrc, bStart, bEnd);
    if (left < 0 || right < 0 || merged < 0) return null;
    if (3 * n === ids.length) [ids, entries] = [grown(ids, 3 * n + 3), grown(entries, 2 * n + 2)];
    ids[3 * n] = table.id(left);
    ids[3 * n + 1] = table.id(right);
    ids[3 * n + 2] = table.id(merged);
    entries[2 * n] = left;
    entries[2 * n + 1] = right;
    n++;
    i = skipWs(text, i);
    const d = text.charCodeAt(i);
    if (d === 0x5d) return done(i);
    if (d !== 0x2c) return null;
    i = skipWs(text, i + 1);
  }
}
