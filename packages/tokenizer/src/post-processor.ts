import type { TokenizerJson } from "./tokenizer-files";

/**
 * The ids a tokenizer.json post-processor puts around a single text (Hugging Face's `add_special_tokens=True`),
 * read from its description, or null for a kind not read here (the caller then probes the library). Reading it
 * spares building the library's tokenizer at all when the fast BPE does the encoding (a second of startup on
 * a 150k vocabulary, per pool member).
 */
export function postProcessorAdditions(json: TokenizerJson): { prefix: number[]; suffix: number[] } | null {
  return read(json.post_processor as Json | null | undefined);
}

type Json = Record<string, any>;

function read(p: Json | null | undefined): { prefix: number[]; suffix: number[] } | null {
  if (p == null || p.type === "ByteLevel") return { prefix: [], suffix: [] };
  switch (p.type) {
    case "TemplateProcessing": {
      const single = p.single as Json[];
      const at = single.findIndex((piece) => piece.Sequence !== undefined);
      if (at < 0 || single.slice(at + 1).some((piece) => piece.Sequence !== undefined)) return null;
      const ids = (pieces: Json[]) => pieces.flatMap((piece) => p.special_tokens[piece.SpecialToken.id].ids as number[]);
      return { prefix: ids(single.slice(0, at)), suffix: ids(single.slice(at + 1)) };
    }
    case "RobertaProcessing":
    case "BertProcessing":
      return { prefix: [p.cls[1]], suffix: [p.sep[1]] };
    case "Sequence": {
      let prefix: number[] = [];
      let suffix: number[] = [];
      for (const inner of p.processors as Json[]) {
        const r = read(inner);
        if (r === null) return null;
        prefix = [...r.prefix, ...prefix];
        suffix = [...suffix, ...r.suffix];
      }
      return { prefix, suffix };
    }
    default:
      return null;
  }
}
