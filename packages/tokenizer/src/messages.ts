import type { ChatMessage } from "./types";

// vLLM's "string" content format: the text parts of a multi-part content joined with "\n"; non-text parts
// (images, audio) contribute nothing to the text a text-only tokenizer sees.
export function messageText(m: ChatMessage): string {
  const c = m.content;
  if (c === undefined || c === null) return "";
  if (typeof c === "string") return c;
  return c.filter((p) => p.type === "text" && typeof p.text === "string").map((p) => p.text as string).join("\n");
}

/** Messages as the chat template sees them: content flattened to a string, other fields untouched. */
export function templateMessages(messages: readonly ChatMessage[]): ChatMessage[] {
  return messages.map((m) => (typeof m.content === "string" ? m : { ...m, content: messageText(m) }));
}

/**
 * continue_final_message as transformers' apply_chat_template does it: find the last occurrence of the
 * final message's text stripped; cut after the text as written when the template kept it (leading
 * whitespace aside), else after the stripped text (the template trimmed trailing whitespace).
 */
export function continueFinalMessage(rendered: string, messages: readonly ChatMessage[]): string {
  const last = messages.at(-1);
  if (last === undefined) return rendered;
  const text = messageText(last);
  const stripped = text.trim();
  const at = rendered.lastIndexOf(stripped);
  if (at < 0) throw new Error("continue_final_message is set but the final message does not appear in the rendered chat");
  const kept = text.trimStart().length;
  return rendered.slice(0, rendered.slice(at, at + kept) === text ? at + kept : at + stripped.length);
}
