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
