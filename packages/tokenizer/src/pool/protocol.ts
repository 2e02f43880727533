// The messages between the pool and its members.
import type { TokenizeJob } from "../job";
import type { CacheStats, PreprocessorOptions } from "../types";

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
  /** warmedTokens: of the job's cached tokens, those only a background warm had cached. */
  | { type: "done"; id: number; ids: Uint32Array | null; freshTokens: number; warmedTokens: number; busyMs: number; cache: CacheStats }
  | { type: "stopped"; id: number; busyMs: number; cache: CacheStats }
  | { type: "error"; id: number; name: string; message: string; busyMs: number; cache: CacheStats };
