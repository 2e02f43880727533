// Token ids back to text as a byte-level BPE tokenizer decodes them (tokenizers' ByteLevel decoder, special tokens
// kept), from the vocabulary the fast BPE already holds: the @huggingface/tokenizers decoder costs most of a second
// and its own copy of the model to build, too much for the few short renders the inline system probe decodes.
import { bpeModelOf } from "./fast/bpe-model";
import { BYTE_TO_CHAR } from "./fast/whole-words";
import type { TokenizerJson } from "./tokenizer-files";

/** The decoder of a byte-level BPE tokenizer.json; undefined for any other kind. */
export function byteLevelDecoder(json: TokenizerJson): ((ids: ArrayLike<number>) => string) | undefined {
  const model = json.model as Record<string, unknown> | undefined;
  if ((json.decoder as { type?: unknown } | null | undefined)?.type !== "ByteLevel" || model?.type !== "BPE") return undefined;
  const tokens: string[] = [];
  for (const [token, id] of bpeModelOf(model).entries()) tokens[id] = token;
  for (const t of json.added_tokens) tokens[t.id] = t.content;
  const charToByte = new Map(BYTE_TO_CHAR.map((ch, b) => [ch, b]));
  const utf8 = new TextEncoder();
  // Invalid UTF-8 becomes U+FFFD, as from_utf8_lossy makes it.
  const text = new TextDecoder("utf-8", { ignoreBOM: true });
  return (ids) => {
    const bytes: number[] = [];
    for (const id of Array.from(ids)) {
      // An id of no token is skipped; a token with a char outside the byte table is taken as its UTF-8.
      const token = tokens[id] ?? "";
      const mapped = Array.from(token, (ch) => charToByte.get(ch));
      bytes.push(...(mapped.every((b) => b !== undefined) ? (mapped as number[]) : utf8.encode(token)));
    }
    return text.decode(Uint8Array.from(bytes));
  };
}
