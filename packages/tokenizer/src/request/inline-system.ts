// Where vLLM's Anthropic server puts a Messages body's inline `role: "system"` messages before converting it
// (vllm/entrypoints/anthropic/inline_system.py, normalize_inline_system). Claude Code appends one on almost every
// turn; hoisting it into the leading system prompt, as vLLM once did, rewrote the head of every prompt. vLLM now
// keeps such a message where it is ("preserve") or merges its text into a neighbouring message ("fold"), so that a
// turn's prompt extends the previous turn's. The EPP must place it the same way or its block hashes match nothing.
import { BadRequest } from "./bad-request";

/** How inline system messages are placed: vLLM's AnthropicInlineSystemMode. */
export type InlineSystemMode = "preserve" | "fold";
/** The server's choice of it: a mode, or "auto", which probes the renderer (inline-system-probe.ts). */
export type InlineSystemOption = "auto" | InlineSystemMode;
export const INLINE_SYSTEM_OPTIONS = ["auto", "preserve", "fold"] as const satisfies readonly InlineSystemOption[];
/** vLLM's default. */
export const DEFAULT_INLINE_SYSTEM: InlineSystemOption = "auto";
/** What vLLM's probe answers when it fails: where no probe runs, "auto" means this. */
export const UNPROBED_INLINE_SYSTEM: InlineSystemMode = "fold";

export type Block = Record<string, unknown> & { type: string };
export type AnthropicMessage = { role: "user" | "assistant" | "system"; content: string | Block[] };

// Claude Code's per-request attribution hash: a system text starting with it is left out, or no prefix would repeat.
const BILLING_HEADER = "x-anthropic-billing-header";

/** Texts joined by a blank line, the empty ones skipped. */
const join = (...texts: string[]) => texts.filter((t) => t !== "").join("\n\n");

const isText = (t: unknown): t is string => typeof t === "string" && t !== "";

/** The text blocks' texts run together, those starting with the billing header left out. */
function blocksText(blocks: readonly Block[]): string {
  let out = "";
  for (const b of blocks) if (b.type === "text" && isText(b.text) && !b.text.startsWith(BILLING_HEADER)) out += b.text;
  return out;
}

/** A system message's text: a string whole unless it is the billing header, else its text blocks'. */
export function systemText(m: AnthropicMessage): string {
  if (typeof m.content === "string") return m.content.startsWith(BILLING_HEADER) ? "" : m.content;
  return blocksText(m.content);
}

/** The top-level `system`'s text: a string as given (vLLM strips no header there), blocks as systemText reads them. */
export function systemPromptText(system: string | Block[] | undefined): string {
  return system === undefined || typeof system === "string" ? (system ?? "") : blocksText(system);
}

/**
 * `text` joined to one end of a content (a string, absent, or a list of blocks or tool-result items): merged into a
 * text item at that end when there is one (some templates run text blocks together with nothing between), else
 * added as an item of its own (`item`).
 */
function addText(content: unknown, text: string, atEnd: boolean, item: (t: string) => Block): string | Block[] {
  if (content === undefined || content === null || typeof content === "string") {
    const own = (content as string | null | undefined) ?? "";
    return atEnd ? join(own, text) : join(text, own);
  }
  const items = [...(content as Block[])];
  const end = atEnd ? items.length - 1 : 0;
  const edge = items[end];
  if (edge !== undefined && edge.type === "text") {
    const old = edge.text || "";
    // vLLM joins it as a str: any other text fails there.
    if (typeof old !== "string") throw new BadRequest("a text item must have a string text");
    items[end] = { ...edge, text: atEnd ? join(old, text) : join(text, old) };
  } else if (atEnd) items.push(item(text));
  else items.unshift(item(text));
  return items;
}

const textBlock = (text: string): Block => ({ type: "text", text });

/**
 * `text` appended to a user message: to its own text, or, when it holds only tool results, to the last result's
 * content. Its other blocks become the user message that follows the tool messages, so no turn is added either way.
 */
function appendToUser(m: AnthropicMessage, text: string): AnthropicMessage {
  const blocks = m.content;
  if (typeof blocks === "string") return { ...m, content: addText(blocks, text, true, textBlock) };
  if (blocks.length > 0 && blocks.every((b) => b.type === "tool_result")) {
    const last = blocks.at(-1)!;
    return { ...m, content: [...blocks.slice(0, -1), { ...last, content: addText(last.content, text, true, textBlock) }] };
  }
  const own = addText(blocks.filter((b) => b.type !== "tool_result"), text, true, textBlock) as Block[];
  return { ...m, content: [...blocks.filter((b) => b.type === "tool_result"), ...own] };
}

/** System messages between an assistant's tool_use and the user message with its results moved after that message. */
function moveOutOfToolRuns(messages: readonly AnthropicMessage[]): AnthropicMessage[] {
  const out: AnthropicMessage[] = [];
  let held: AnthropicMessage[] = [];
  let awaitingResults = false;
  for (const m of messages) {
    if (m.role === "system") {
      (awaitingResults ? held : out).push(m);
      continue;
    }
    if (m.role === "assistant") out.push(...held.splice(0));
    out.push(m);
    if (m.role === "user") out.push(...held.splice(0));
    awaitingResults = m.role === "assistant" && Array.isArray(m.content) && m.content.some((b) => b.type === "tool_use");
  }
  out.push(...held);
  return out;
}

/**
 * The inline system messages placed as `mode` places them, changing only the conversation's end: `leading`, the text
 * of the system messages that open `messages` (joined by blank lines, for after the system prompt), and the rest.
 * "preserve" keeps the others as system messages, but folds as "fold" does when the request has no system prompt at
 * all (neither `system` nor a leading message): a renderer may put request tools at the first system message.
 * "fold" merges each into the user message before it (when no assistant came between) or else into the next
 * user message, and makes a user message of it only when there is none to merge into.
 */
export function normalizeInlineSystem(
  system: string | Block[] | undefined,
  messages: readonly AnthropicMessage[],
  mode: InlineSystemMode,
): { leading: string; messages: readonly AnthropicMessage[] } {
  if (!messages.some((m) => m.role === "system")) return { leading: "", messages };
  let first = 0;
  while (first < messages.length && messages[first]!.role === "system") first++;
  const leading = join(...messages.slice(0, first).map(systemText));
  const rest = moveOutOfToolRuns(messages.slice(first));
  if (mode === "preserve" && (systemPromptText(system) !== "" || leading !== "")) return { leading, messages: rest };

  const out: AnthropicMessage[] = [];
  // System text that came after an assistant message, for the next user message.
  const pending: string[] = [];
  for (let m of rest) {
    if (m.role === "system") {
      const text = systemText(m);
      if (text === "") continue;
      if (out.at(-1)?.role === "user" && pending.length === 0) out[out.length - 1] = appendToUser(out.at(-1)!, text);
      else pending.push(text);
      continue;
    }
    if (pending.length > 0) {
      const text = join(...pending.splice(0));
      if (m.role === "user") m = { ...m, content: addText(m.content, text, false, textBlock) };
      else out.push({ role: "user", content: text });
    }
    out.push(m);
  }
  if (pending.length > 0) out.push({ role: "user", content: join(...pending) });
  return { leading, messages: out };
}
