// Request input -> token ids, the way the model server will see them (so block hashes line up with
// the KV events it publishes). Text goes through the shared preprocessor (HF tokenizer + chat
// template, or the byte-level fallback shared with the mock worker).
import type { Preprocessor } from "@kv-epp/tokenizer";
import type { RoutedInput } from "./extproc/openai-body.ts";

export type Tokenize = (input: RoutedInput) => Uint32Array;

const NONE = new Uint32Array(0);

export function createTokenize(pre: Preprocessor): Tokenize {
  return (input) => {
    switch (input.kind) {
      case "tokens":
        return input.tokens;
      case "prompt":
        return pre.encodeCompletion(input.text);
      case "chat":
        return pre.encodeChat(input.messages as Parameters<Preprocessor["encodeChat"]>[0], {
          tools: input.tools,
          templateKwargs: input.templateKwargs,
          addGenerationPrompt: input.addGenerationPrompt,
          continueFinalMessage: input.continueFinalMessage,
        });
      case "none":
        return NONE;
    }
  };
}
