// The messages between the pool and its members.
import type { PoolJob } from "../job";
import type { BodyFields } from "../request/read-body";
import type { CacheStats, PreprocessorOptions } from "../types";
import type { WarmUp } from "../warm-up";

/** How each pool member is built (posted as workerData). */
export type MemberInit = {
  preprocessor: Omit<PreprocessorOptions, "registry">;
  /** Int32Array[0]: the id of the job the member must stop (set by the pool on cancel). */
  cancel: SharedArrayBuffer;
};

/** A body job's `request.body` is transferred (its buffer moves to the member) unless `discard`. */
export type ToMember = { type: "job"; id: number; job: PoolJob; discard: boolean };

export type FromMember =
  /** Loaded and warmed up (see warm-up.ts): what the warm-up tokenized and took. */
  | { type: "ready"; warmUp: WarmUp }
  | { type: "init-failed"; message: string }
  /**
   * A body job read (posted before it is tokenized): its fields, and the body to forward transferred back
   * (`rewritten`: naming the request's rewrite model).
   */
  | { type: "parsed"; id: number; fields: BodyFields; body: Uint8Array; rewritten: boolean }
  /** What the cache already knew, posted before tokenizing a large unknown rest; estimatedMs is that rest's cost. */
  | { type: "known"; id: number; ids: Uint32Array; estimatedMs: number }
  /** warmedTokens: of the job's cached tokens, those only a background warm had cached. */
  | { type: "done"; id: number; ids: Uint32Array | null; freshTokens: number; warmedTokens: number; busyMs: number; cache: CacheStats }
  | { type: "stopped"; id: number; busyMs: number; cache: CacheStats }
  /** `name`: the error's class, for the ones the caller tells apart (BadRequest, TooDeep, ChatTemplateError). */
  | { type: "error"; id: number; name: string; message: string; busyMs: number; cache: CacheStats };
