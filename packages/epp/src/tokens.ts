// Request input -> token ids, the way the model server will see them (so block hashes line up with
// the KV events it publishes). Text goes through the shared preprocessor (HF tokenizer + chat
// template, or the byte-level fallback shared with the mock worker).
import { ChatTemplateError, encodeJob, keepsTail, type ChatMessage, type Preprocessor, type TokenizeJob, type TokenizerPool } from "@kv-epp/tokenizer";
import { BadRequest, type RoutedInput } from "./extproc/openai-body.ts";

/** In-process (synchronous), or through the tokenizer pool (a promise; `signal` cancels it). */
export type Tokenize = (input: RoutedInput, signal?: AbortSignal) => Uint32Array | Promise<Uint32Array>;

const NONE = new Uint32Array(0);

/**
 * Text tokenized for routing, at most (UTF-16 units): a prefix this long decides the route as well as
 * the whole (about 32k tokens, a usual context length), and bounds what one pick costs a tokenizer.
 */
export const ROUTING_TEXT_CHARS = 128 * 1024;

/** On the calling thread. */
export function createTokenize(pre: Preprocessor): (input: RoutedInput) => Uint32Array {
  return (input) => {
    const job = jobOf(input);
    if (job instanceof Uint32Array) return job;
    try {
      return encodeJob(pre, job);
    } catch (err) {
      throw asBadRequest(err);
    }
  };
}

/**
 * The same, off the decision thread: the pool renders and tokenizes. A pick whose tokenization would exceed
 * the pool's budget gets the prefix the pool already knew (counted there as a fallback).
 */
export function createPoolTokenize(pool: TokenizerPool): Tokenize {
  return (input, signal) => {
    const job = jobOf(input);
    if (job instanceof Uint32Array) return job;
    return pool.tokenize(job, { signal }).then((r) => r.tokens, (err) => Promise.reject(asBadRequest(err)));
  };
}

/** After a chat's response: the pool tokenizes the next turn's shape in the background (see warmReply). */
export function createPoolWarm(pool: TokenizerPool): (input: RoutedInput, reply: ChatMessage) => void {
  return (input, reply) => {
    const job = jobOf(input);
    if (job instanceof Uint32Array || job.kind !== "chat") return;
    pool.warmReply(job, reply);
  };
}

/** What to tokenize for routing, or the ids already known (given, none, or a route by load). */
function jobOf(input: RoutedInput): TokenizeJob | Uint32Array {
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
      return { kind: "chat", messages, opts, cutAtMedia: true };
    }
  }
}

/** The conversation cannot be rendered as the model server would (it answers 400 too). */
function asBadRequest(err: unknown): unknown {
  return err instanceof ChatTemplateError ? new BadRequest(err.message) : err;
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
