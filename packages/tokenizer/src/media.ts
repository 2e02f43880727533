import type { ChatMessage, ChatOptions, ContentPart, Preprocessor } from "./types";

/**
 * Where a chat's images, audio and video sit among its tokens, as far as a text tokenizer can tell.
 * vLLM replaces each such part with placeholder tokens whose blocks carry the item's identifier in
 * their extra keys; a text tokenizer sees nothing there (its "string" content format drops non-text
 * parts). The position of part j is where the text-only rendering stops agreeing with the rendering cut
 * just before that part: every token before it is the same in vLLM's prompt, and tokens from there on
 * may not be. It can come a token early (BPE merging the text before the part with what follows) and
 * never late, so a block wholly before it is one vLLM computed from the same tokens.
 */

/** OpenAI content part types that carry media (vLLM's multimodal inputs). */
const MEDIA_TYPES = new Set(["image_url", "image", "image_pil", "image_embeds", "input_audio", "audio_url", "audio", "video_url", "video"]);

export function isMediaPart(p: ContentPart): boolean {
  return MEDIA_TYPES.has(p.type);
}

export type MediaPosition = { message: number; part: number; at: number };

/**
 * Each media part of the chat (the first `max`), in order, with its token position in `pre.encodeChat(messages,
 * opts)` before truncate_prompt_tokens (the caller shifts them by what truncation drops).
 */
export function mediaPositions(pre: Preprocessor, messages: readonly ChatMessage[], opts: ChatOptions = {}, max = Infinity): MediaPosition[] {
  const out: MediaPosition[] = [];
  let full: Uint32Array | undefined;
  for (let m = 0; m < messages.length; m++) {
    const c = messages[m]!.content;
    if (!Array.isArray(c)) continue;
    for (let p = 0; p < c.length; p++) {
      if (!isMediaPart(c[p]!)) continue;
      if (out.length >= max) return out;
      full ??= pre.encodeChat(messages, { ...opts, truncatePromptTokens: undefined });
      const cut = [...messages.slice(0, m), { ...messages[m]!, content: c.slice(0, p) }];
      let at = 0;
      try {
        const before = pre.encodeChat(cut, { tools: opts.tools, toolChoice: opts.toolChoice, chatTemplate: opts.chatTemplate, templateKwargs: opts.templateKwargs, addGenerationPrompt: false, addSpecialTokens: opts.addSpecialTokens });
        while (at < full.length && at < before.length && full[at] === before[at]) at++;
      } catch {
        // A template that refuses the cut conversation (e.g. it must end with a user turn): position 0
        // claims nothing, which is always safe.
      }
      // Positions never go back: a later part cannot come before an earlier one.
      out.push({ message: m, part: p, at: Math.max(at, out.at(-1)?.at ?? 0) });
    }
  }
  return out;
}

/** Where the first media part sits, or undefined for a text-only chat: one render per part after it would be wasted. */
export function firstMediaPosition(pre: Preprocessor, messages: readonly ChatMessage[], opts: ChatOptions = {}): number | undefined {
  if (!messages.some((m) => Array.isArray(m.content) && m.content.some(isMediaPart))) return undefined;
  return mediaPositions(pre, messages, opts, 1)[0]?.at;
}
