import type { ChatMessage, ChatOptions, PreprocessorOptions } from "../types";

/** What the pool tokenizes: a completion's text or a chat (rendered with the model's template). */
export type TokenizeJob =
  | { kind: "prompt"; text: string }
  /** `cutAtMedia`: the ids stop before the first media part (what a router can match; see media.ts). */
  | { kind: "chat"; messages: ChatMessage[]; opts: ChatOptions; cutAtMedia?: boolean };

/** How each pool member is built (posted as workerData). */
export type MemberInit = {
  preprocessor: Omit<PreprocessorOptions, "registry">;
  /** Int32Array[0]: the id of the job the member must stop (set by the pool on cancel). */
  cancel: SharedArrayBuffer;
};

export type ToMember = { type: "job"; id: number; job: TokenizeJob; discard: boolean };

export type FromMember =
  | { type: "ready" }
  | { type: "init-failed"; message: string }
  /** What the cache already knew, posted before tokenizing a large unknown rest; estimatedMs is that rest's cost. */
  | { type: "known"; id: number; ids: Uint32Array; estimatedMs: number }
  | { type: "done"; id: number; ids: Uint32Array | null; freshTokens: number; busyMs: number }
  | { type: "stopped"; id: number; busyMs: number }
  | { type: "error"; id: number; name: string; message: string; busyMs: number };
