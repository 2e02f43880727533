// Request input -> token ids, the way the model server will see them (so block hashes line up with
// the KV events it publishes). Text goes through the shared preprocessor (HF tokenizer + chat
// template, or the byte-level fallback shared with the mock worker).
import { ChatTemplateError, firstMediaPosition, type ChatMessage, type Preprocessor, type TokenizeJob, type TokenizerPool } from "@kv-epp/tokenizer";
import { BadRequest, type RoutedInput } from "./extproc/openai-body.ts";

/** In-process (synchronous), or through the tokenizer pool (a promise; `signal` cancels it). */
export type Tokenize = (input: RoutedInput, signal?: AbortSignal) => Uint32Array | Promise<Uint32Array>;

const NONE = new Uint32Array(0);

/**
 * Text tokenized for routing, at most (UTF-16 units): a prefix this long decides the route as well as
 * the whole (about 32k tokens, a usual context length), while tokenizing runs on the event loop at
 * ~6 µs a character (CJK text, measured): a 32 MiB body would hold every stream for tens of seconds.
 */
export const ROUTING_TEXT_CHARS = 128 * 1024;

export function createTokenize(pre: Preprocessor): (input: RoutedInput) => Uint32Array {
  return (input) => {
    try {
      switch (input.kind) {
        case "tokens":
          return input.tokens;
        case "prompt":
          return pre.encodeCompletion(routingPrefix(input.text, ROUTING_TEXT_CHARS));
        case "chat": {
          const messages = routingMessages(input.messages as ChatMessage[]);
          const opts = {
            tools: input.tools,
            templateKwargs: input.templateKwargs,
            addGenerationPrompt: input.addGenerationPrompt,
            continueFinalMessage: input.continueFinalMessage,
          };
          const tokens = pre.encodeChat(messages, opts);
          // vLLM's blocks from an image or audio part on carry the item's identifier, which a router
          // cannot compute: the route is decided by the tokens before the first such part.
          const media = firstMediaPosition(pre, messages, opts);
          return media === undefined ? tokens : tokens.subarray(0, media);
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

/**
 * The same, off the decision thread: the pool renders and tokenizes. A pick whose tokenization would exceed
 * the pool's budget gets the prefix the pool already knew (counted there as a fallback).
 */
export function createPoolTokenize(pool: TokenizerPool): Tokenize {
  const viaPool = async (job: TokenizeJob, signal?: AbortSignal) => {
    try {
      return (await pool.tokenize(job, { signal })).tokens;
    } catch (err) {
      if (err instanceof ChatTemplateError) throw new BadRequest(err.message);
      throw err;
    }
  };
  return (input, signal) => {
    switch (input.kind) {
      case "tokens":
        return input.tokens;
      case "none":
        return NONE;
      case "prompt":
        return viaPool({ kind: "prompt", text: routingPrefix(input.text, ROUTING_TEXT_CHARS) }, signal);
      case "chat":
        return viaPool(chatJob(input), signal);
    }
  };
}

/** After a chat's response: the pool tokenizes the next turn's shape in the background (see warmReply). */
export function createPoolWarm(pool: TokenizerPool): (input: RoutedInput, reply: ChatMessage) => void {
  return (input, reply) => {
    if (input.kind === "chat") pool.warmReply(chatJob(input), reply);
  };
}

function chatJob(input: Extract<RoutedInput, { kind: "chat" }>): Extract<TokenizeJob, { kind: "chat" }> {
  const opts = {
    tools: input.tools,
    templateKwargs: input.templateKwargs,
    addGenerationPrompt: input.addGenerationPrompt,
    continueFinalMessage: input.continueFinalMessage,
  };
  return { kind: "chat", messages: routingMessages(input.messages as ChatMessage[]), opts, cutAtMedia: true };
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
