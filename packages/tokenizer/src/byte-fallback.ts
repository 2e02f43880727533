import type { ChatMessage, ChatOptions } from "./types";
import { continueFinalMessage, messageText } from "./messages";

// The fallback is used when a model has no tokenizer configured. It must be deterministic and identical in
// the EPP and the mock worker (both import this module), so that block hashes computed on either side agree:
// one id per UTF-8 byte, ids 0..255.
const utf8 = new TextEncoder();
const utf8Decoder = new TextDecoder("utf-8", { fatal: false });

export function byteFallbackEncode(text: string): Uint32Array {
  const bytes = utf8.encode(text);
  const ids = new Uint32Array(bytes.length);
  ids.set(bytes);
  return ids;
}

export function byteFallbackDecode(ids: ArrayLike<number>): string {
  const bytes = new Uint8Array(ids.length);
  for (let i = 0; i < ids.length; i++) bytes[i] = ids[i]! <= 255 ? ids[i]! : 0x3f; // '?' for ids no byte maps to
  return utf8Decoder.decode(bytes);
}

// A fixed ChatML-like rendering, so chats without a tokenizer still produce stable, prefix-extending ids:
// a conversation that grows by a turn keeps every earlier byte, which is what prefix routing needs.
export function byteFallbackRenderChat(messages: readonly ChatMessage[], opts: ChatOptions = {}): string {
  let out = "";
  if (opts.tools !== undefined && opts.tools.length > 0) out += `<|im_start|>tools\n${JSON.stringify(opts.tools)}<|im_end|>\n`;
  for (const m of messages) out += `<|im_start|>${m.role}\n${messageText(m)}<|im_end|>\n`;
  if (opts.continueFinalMessage) return continueFinalMessage(out, messages);
  return opts.addGenerationPrompt === false ? out : out + "<|im_start|>assistant\n";
}
