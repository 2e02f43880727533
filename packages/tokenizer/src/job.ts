// One request's tokenization as a value: what the EPP asks for, in process or through the pool, so both
// paths give the same ids.
import { firstMediaPosition } from "./media";
import type { EncodeControl } from "./segmenter";
import { keepsTail } from "./truncation";
import type { ChatMessage, ChatOptions, CompletionOptions, Preprocessor } from "./types";

/** A completion's text, or a chat (rendered with the model's template). */
export type TokenizeJob =
  | { kind: "prompt"; text: string; opts?: CompletionOptions }
  /** `cutAtMedia`: the ids stop before the first media part (what a router can match; see media.ts). */
  | { kind: "chat"; messages: ChatMessage[]; opts: ChatOptions; cutAtMedia?: boolean };

export function encodeJob(pre: Preprocessor, job: TokenizeJob, control?: EncodeControl): Uint32Array {
  if (job.kind === "prompt") return pre.encodeCompletion(job.text, job.opts, control);
  const ids = pre.encodeChat(job.messages, job.opts, control);
  if (!job.cutAtMedia) return ids;
  // vLLM's blocks from an image or audio part on carry the item's identifier, which a router cannot
  // compute: the ids end before the first such part.
  const media = firstMediaPosition(pre, job.messages, job.opts);
  if (media === undefined) return ids;
  // The position counts tokens before truncation; keeping the tail drops some in front of it.
  const dropped = keepsTail(job.opts) ? pre.encodeChat(job.messages, { ...job.opts, truncatePromptTokens: undefined }).length - ids.length : 0;
  return ids.subarray(0, Math.max(0, media - dropped));
}
