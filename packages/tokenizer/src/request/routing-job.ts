// A request's input -> what to tokenize for routing: a bounded prefix of its text decides the route as well
// as the whole, and bounds what one pick costs a tokenizer.
import type { TokenizeJob } from "../job";
import { keepsTail } from "../truncation";
import type { ChatMessage } from "../types";
import type { RoutedInput } from "./openai-body";

/**
 * Text tokenized for routing, at most (UTF-16 units): a prefix this long decides the route as well as
 * the whole (about 32k tokens, a usual context length), and bounds what one pick costs a tokenizer.
 */
export const ROUTING_TEXT_CHARS = 128 * 1024;

const NONE = new Uint32Array(0);

/** What to tokenize for routing, or the ids already known (given, none, or a route by load). */
export function routingJob(input: RoutedInput): TokenizeJob | Uint32Array {
  switch (input.kind) {
    case "tokens":
      return input.tokens;
    case "none":
      return NONE;
    case "prompt": {
      // Truncation keeps the tail, which a prefix of the text cannot give: past the bound, routed by load.
      if (input.text.length > ROUTING_TEXT_CHARS && keepsTail(input)) return NONE;
      const opts = { addSpecialTokens: input.addSpecialTokens, truncatePromptTokens: input.truncatePromptTokens, truncationSide: input.truncationSide };
      return { kind: "prompt", text: routingPrefix(input.text, ROUTING_TEXT_CHARS), opts };
    }
    case "chat": {
      const messages = routingMessages(input.messages);
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
      return { kind: "chat", messages, opts, cutAtMedia: true };
    }
  }
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
