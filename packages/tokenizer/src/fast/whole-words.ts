import { TextTable } from "./word-cache";

type Json = Record<string, any>;

// GPT-2's byte-to-unicode table: printable bytes stand for themselves, the others map to U+0100 onwards.
export const BYTE_TO_CHAR: string[] = (() => {
  const printable = (b: number) => (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
  let next = 256;
  return Array.from({ length: 256 }, (_, b) => String.fromCharCode(printable(b) ? b : next++));
})();

/**
 * The whole-word table of an `ignore_merges` model: a word that is itself in the vocabulary is one token, keyed by
 * the word's raw text (a byte-level token decoded from its byte symbols; one that is not whole UTF-8 left out).
 */
export function wholeWordTable(vocab: Iterable<[string, number]>, byteLevel: boolean): TextTable {
  return TextTable.of(byteLevel ? decodedWords(vocab) : new Map(vocab));
}

/** Whether a tokenizer.json's pre-tokenizer is byte-level: which whole-word table its tokenizer looks words up in. */
export function isByteLevel(preTokenizer: Json | null | undefined): boolean {
  const steps = preTokenizer?.type === "Sequence" ? (preTokenizer.pretokenizers as Json[]) : [preTokenizer];
  return steps.some((s) => s?.type === "ByteLevel");
}

function decodedWords(vocab: Iterable<[string, number]>): Map<string, number> {
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
