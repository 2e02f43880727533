// Request input -> token ids, the way the model server will see them (so block hashes line up with
// the KV events it publishes). Text goes through the shared preprocessor (HF tokenizer + chat
// template, or the byte-level fallback shared with the mock worker).
import { ChatTemplateError, firstMediaPosition, type ChatMessage, type Preprocessor, type Truncation } from "@kv-epp/tokenizer";
import { BadRequest, type RoutedInput } from "./extproc/openai-body.ts";

export type Tokenize = (input: RoutedInput) => Uint32Array;

const NONE = new Uint32Array(0);

/**
 * Text tokenized for routing, at most (UTF-16 units): a prefix this long decides the route as well as
 * the whole (about 32k tokens, a usual context length), while tokenizing runs on the event loop at
 * ~6 µs a character (CJK text, measured): a 32 MiB body would hold every stream for tens of seconds.
 */
export const ROUTING_TEXT_CHARS = 128 * 1024;

export function createTokenize(pre: Preprocessor): Tokenize {
  return (input) => {
    try {
      switch (input.kind) {
        case "tokens":
          return input.tokens;
        case "prompt": {
          const opts = { addSpecialTokens: input.addSpecialTokens, truncatePromptTokens: input.truncatePromptTokens, truncationSide: input.truncationSide };
          // Truncation keeps the tail, which a prefix of the text cannot give: past the bound, routed by load.
          if (input.text.length > ROUTING_TEXT_CHARS && keepsTail(input)) return NONE;
          return pre.encodeCompletion(routingPrefix(input.text, ROUTING_TEXT_CHARS), opts);
        }
        case "chat": {
          const messages = routingMessages(input.messages as ChatMessage[]);
          if (messages !== input.messages && keepsTail(input)) return NONE;
          const opts = {
            tools: input.tools,
            templateKwargs: input.templateKwargs,
            addGenerationPrompt: input.addGenerationPrompt,
            continueFinalMessage: input.continueFinalMessage,
            addSpecialTokens: input.addSpecialTokens,
            truncatePromptTokens: input.truncatePromptTokens,
            truncationSide: input.truncationSide,
          };
          const tokens = pre.encodeChat(messages, opts);
          // vLLM's blocks from an image or audio part on carry the item's identifier, which a router
          // cannot compute: the route is decided by the tokens before the first such part.
          const media = firstMediaPosition(pre, messages, opts);
          if (media === undefined) return tokens;
          // The position counts tokens before truncation; keeping the tail drops some in front of it.
          const dropped = keepsTail(input) ? pre.encodeChat(messages, { ...opts, truncatePromptTokens: undefined }).length - tokens.length : 0;
          return tokens.subarray(0, Math.max(0, media - dropped));
        }
        case "none":
          return NONE;
      }
    } catch (err) {
      // The conversation cannot be rendered as the model server would (it answers 400 too).
      if (err instanceof ChatTemplateError) throw new BadRequest(err.message);
      throw err;
    }
  };
}

/** truncate_prompt_tokens that keeps the last tokens (vLLM's default side for generation). */
function keepsTail(t: Truncation): boolean {
  return t.truncatePromptTokens !== undefined && t.truncatePromptTokens >= 0 && t.truncationSide !== "right";
}

/** `text`, or its start up to the last whitespace before `max` (tokens before a space do not depend on what follows). */
export function routingPrefix(text: string, max: number): string {
  if (text.length <= max) return text;
  const cut = text.lastIndexOf(" ", max);
  return text.slice(0, cut > max / 2 ? cut : max);
}

/** The messages whose text fits in ROUTING_TEXT_CHARS, the last one cut; the rest do not change the route. */
function routingMessages(messages: ChatMessage[]): ChatMessage[] {
  let left = ROUTING_TEXT_CHARS;
  for (let i = 0; i < messages.length; i++) {
    const c = messages[i]!.content;
    const n = typeof c === "string" ? c.length : JSON.stringify(c ?? "").length;
    if (n <= left) {
      left -= n;
      continue;
    }
    const cut = typeof c === "string" ? { ...messages[i]!, content: routingPrefix(c, left) } : messages[i]!;
    return [...messages.slice(0, i), cut];
  }
  return messages;
}
