// A request's input -> what to tokenize for routing: a bounded prefix of its text decides the route as well
// as the whole, and bounds what one pick costs a tokenizer.
import { textField } from "../conversation";
import type { ChatRules } from "../chat-rules";
import type { TokenizeJob } from "../job";
import { keepsTail } from "../truncation";
import type { ChatMessage, ContentPart } from "../types";
import { vllmTemplateTools } from "../vllm-chat";
import type { RoutedInput } from "./openai-body";

/**
 * Text tokenized for routing, at most (UTF-16 units): a prefix this long decides the route as well as
 * the whole (about 32k tokens, a usual context length), and bounds what one pick costs a tokenizer.
 */
export const ROUTING_TEXT_CHARS = 128 * 1024;

const NONE = new Uint32Array(0);

/**
 * What to tokenize for routing, or the ids already known (given, none, or a route by load). `rules`: the engine's,
 * which say which tools reach the template (the default: vLLM's, without its flags).
 */
export function routingJob(input: RoutedInput, rules?: ChatRules): TokenizeJob | Uint32Array {
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
      // Tools and a RAG request's documents render whole (each one's JSON or text, in an order and place the
      // template picks), so no cut of them keeps the rendering a prefix of the request's: past the bound they are
      // routed by load; within it, the messages get what remains. Only the tools the template gets count.
      const documents = templateDocuments(input, rules);
      const tools = rules === undefined ? vllmTemplateTools(input) : rules.templateTools(input);
      const wholeChars = (tools === undefined ? 0 : JSON.stringify(tools).length) +
        (documents === undefined || documents === null ? 0 : JSON.stringify(documents).length);
      if (wholeChars > ROUTING_TEXT_CHARS) return NONE;
      const messages = routingMessages(input.messages, ROUTING_TEXT_CHARS - wholeChars);
      if (messages !== input.messages && (keepsTail(input) || messages.length === 0)) return NONE;
      const opts = {
        tools: input.tools,
        toolChoice: input.toolChoice,
        chatTemplate: input.chatTemplate,
        templateKwargs: input.templateKwargs,
        addGenerationPrompt: input.addGenerationPrompt,
        continueFinalMessage: input.continueFinalMessage,
        addSpecialTokens: input.addSpecialTokens,
        reasoningEffort: input.reasoningEffort,
        truncatePromptTokens: input.truncatePromptTokens,
        truncationSide: input.truncationSide,
      };
      if (messages === input.messages) return { kind: "chat", messages, opts, cutAtMedia: true, ...(input.echo ? { echo: true as const } : {}) };
      // The cut may fall inside the final message itself, which SGLang's final-turn rule still applies to.
      return { kind: "chat", messages, opts, cutAtMedia: true, cut: messages.length < input.messages.length ? "before-final" : "in-final" };
    }
  }
}

/**
 * The documents the template gets: the request's kwargs', else (unset, null or "auto": vLLM's ChatParams.with_defaults
 * keeps the default then) the server's default kwargs'.
 */
function templateDocuments(input: { templateKwargs?: Record<string, unknown> }, rules: ChatRules | undefined): unknown {
  const own = input.templateKwargs?.documents;
  return own === undefined || own === null || own === "auto" ? rules?.defaultKwargs.documents : own;
}

/** `text`, or its start up to the last whitespace before `max` (tokens before a space do not depend on what follows). */
export function routingPrefix(text: string, max: number): string {
  if (text.length <= max) return text;
  const cut = text.lastIndexOf(" ", max);
  return text.slice(0, cut > max / 2 ? cut : max);
}

/**
 * The messages whose text fits in `budget`, the last one cut; the rest do not change the route. Content parts are
 * kept in order while they fit and the text part crossing the bound is cut, so what the template renders of them
 * (text parts joined, or each in turn; media as placeholders or nothing) is the request's up to the cut.
 */
function routingMessages(messages: ChatMessage[], budget: number): ChatMessage[] {
  let left = budget;
  for (let i = 0; i < messages.length; i++) {
    const m = messages[i]!;
    // What the template renders of a message besides its content (tool calls' arguments, reasoning) cannot be
    // cut: a message whose other fields pass the bound ends the routed messages before it.
    const other = otherFieldsChars(m);
    if (other > left) return messages.slice(0, i);
    left -= other;
    const c = m.content;
    if (typeof c === "string") {
      if (c.length <= left) {
        left -= c.length;
        continue;
      }
      return [...messages.slice(0, i), { ...m, content: routingPrefix(c, left) }];
    }
    if (!Array.isArray(c)) continue;
    const parts = c as RequestPart[];
    for (let p = 0; p < parts.length; p++) {
      const n = partChars(parts[p]!);
      if (n <= left) {
        left -= n;
        continue;
      }
      const cut = cutPart(parts[p]!, left);
      const content = cut === undefined ? parts.slice(0, p) : [...parts.slice(0, p), cut];
      return [...messages.slice(0, i), { ...m, content: content as ContentPart[] }];
    }
  }
  return messages;
}

/**
 * What a message counts against the bound: its content's text (or, for a part of another kind, its JSON) and the
 * JSON of its other fields.
 */
export function messageChars(m: ChatMessage): number {
  const c = m.content;
  let n = otherFieldsChars(m);
  if (typeof c === "string") n += c.length;
  else if (Array.isArray(c)) for (const p of c as RequestPart[]) n += partChars(p);
  return n;
}

/** The JSON length of a message's fields other than its role and content (a few bytes for most messages). */
function otherFieldsChars(m: ChatMessage): number {
  let n = 0;
  for (const [k, v] of Object.entries(m)) if (k !== "role" && k !== "content" && v !== undefined) n += k.length + (JSON.stringify(v)?.length ?? 0);
  return n;
}

// A part in the request may also be a bare string (vLLM reads it as text).
type RequestPart = ContentPart | string;

/** A part's text, or undefined for a part of another kind (media, a tool reference) or without its text. */
function partText(part: RequestPart): string | undefined {
  if (typeof part === "string") return part;
  const field = textField(part);
  const text = field === undefined ? undefined : part[field];
  return typeof text === "string" ? text : undefined;
}

/**
 * What a part counts against the bound: its text and the newline that joins it to the next, or, for any other
 * part, its JSON (a data URL tokenizes to nothing, but may be megabytes the template and the media cut still walk).
 */
function partChars(part: RequestPart): number {
  const text = partText(part);
  return text === undefined ? JSON.stringify(part).length : text.length + 1;
}

/** A text part cut to `max`, or undefined for a part without text (it cannot be cut: dropped). */
function cutPart(part: RequestPart, max: number): RequestPart | undefined {
  const text = partText(part);
  if (text === undefined) return undefined;
  return typeof part === "string" ? routingPrefix(text, max) : { ...part, [textField(part)!]: routingPrefix(text, max) };
}
