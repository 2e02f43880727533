// The messages between the pool and its members.
import type { PoolJob } from "../job";
import type { BodyFields } from "../request/read-body";
import type { RewriteRules } from "../request/rewrite-rules";
import type { SharedTokenizerFiles } from "../tokenizer-files";
import type { CacheStats, PreprocessorOptions } from "../types";
import type { MessagesModes } from "../preprocessor";
import type { ThreadPriority } from "./thread-priority";
import type { WarmUp } from "../warm-up";

/** Below this many unknown characters the whole job takes well under a millisecond: a member tells no known prefix. */
export const KNOWN_PREFIX_MIN_CHARS = 16 * 1024;

/**
 * A body job as its member read it: its fields, and when the member rewrote the body's model (the request's
 * rewrite model), the body to forward instead of the caller's. It rides on the job's first message back, so a
 * short job costs one message.
 */
export type BodyReading = { fields: BodyFields; rewritten?: Uint8Array };

/** How each pool member is built (posted as workerData). */
export type MemberInit = {
  preprocessor: Omit<PreprocessorOptions, "registry">;
  /** `preprocessor.tokenizerDir` as the pool read it, its model's tables shared by every member; absent: read it. */
  files?: SharedTokenizerFiles;
  /** The pool's thread's textHash seed (hashSeed), installed before the member makes any table: it uses `files`'s. */
  seed: number;
  /**
   * Int32Array[2]: ids of jobs the member must stop (set by the pool on cancel). Two slots, one for the job it runs
   * and one for the request posted behind it (the pool's `next`): a stop asked of one never overwrites the other's.
   */
  cancel: SharedArrayBuffer;
  /** The member's thread runs at this nice value (see thread-priority.ts). */
  nice: number;
  /** Once warmed up, the member asks the kernel for this time slice, µs (0: the kernel's default; requestThreadSlice). */
  sliceUs: number;
  /** The process serves already (a replacement member): lowered before it loads and warms up, not after. */
  serving: boolean;
};

/**
 * A body job's `request.body` is a copy the member owns, or the caller's own bytes in shared memory (joinBody),
 * which the member only reads (the caller forwards them, and reads them itself). Its `request.rewriteRules` never
 * rides on it: `rules` says whether it had any, which are then the last "rules" message's. A warm (`discard`)
 * lets go of what its member kept of a stopped job (see pool-member.ts).
 */
export type ToMember =
  | { type: "job"; id: number; job: PoolJob; discard: boolean; rules?: boolean }
  /**
   * A stopped job resumed as a warm from what its member kept of it (its walk, or the job it read), sent only while
   * the member keeps it (the "stopped" message's `kept`): the job itself is not sent, nor read, again.
   */
  | { type: "resume"; id: number }
  /**
   * The rewrite rules the body jobs that follow with `rules` were submitted with, sent when they differ from the
   * last ones sent: a copy of the pool's rules with every job would cost the decision thread in proportion to them.
   */
  | { type: "rules"; rules: RewriteRules }
  /** Empty the segment cache and zero its counters (after the decision thread's warm-up: invented text, not traffic). */
  | { type: "reset" }
  /**
   * The pool's verdict on the Messages modes, posted to each member it started before its probe decided (those start
   * by the unprobed modes) ahead of any job: a member takes its messages in order.
   */
  | { type: "messages-modes"; modes: MessagesModes };

/**
 * When the member started the job a message is of (ms since the epoch: performance.timeOrigin + now, comparable
 * across threads): a request posted behind another waited at its member until then, not until it was posted.
 */
type Started = { startedAt: number };

export type FromMember =
  /** Loaded and warmed up (see warm-up.ts): what the warm-up tokenized and took. */
  | { type: "ready"; warmUp: WarmUp; priority: ThreadPriority }
  | { type: "init-failed"; message: string }
  /** The cache emptied (a "reset"): its figures from now on. */
  | { type: "reset"; cache: CacheStats }
  /**
   * What the cache already knew, posted before tokenizing a large unknown rest, then again as it grows: `added`, the
   * ids after the job's previous "known" (the first: all of them; see KnownPrefix), which the pool appends to the
   * prefix it keeps. A job's "done" carries all its ids, transferred as the encode returned them: its tail alone
   * would cost a copy on each side. estimatedMs is the unknown rest's cost, estimatedTokens the whole prompt's length (the known ids and the rest at the member's characters per token),
   * newTurnTokens a chat's last turn's (newTurnChars) at that rate, busyMs the member's time on the job so far.
   * `read`: a body job's reading, when no message of the job carried it yet.
   */
  | ({ type: "known"; id: number; added: Uint32Array; estimatedMs: number; estimatedTokens: number; newTurnTokens?: number; busyMs: number; read?: BodyReading } & Started)
  /**
   * warmedTokens: of the job's cached tokens, those only a background warm had cached. `read` as on "known".
   * `nothing`: a warm whose reply had nothing to warm with, released without reading its body.
   */
  | ({ type: "done"; id: number; ids: Uint32Array | null; freshTokens: number; warmedTokens: number; busyMs: number; cache: CacheStats; read?: BodyReading; nothing?: true } & Started)
  /** `kept`: the member keeps what this job's resume goes on from, in place of what it kept before (see "resume"). */
  | ({ type: "stopped"; id: number; busyMs: number; freshTokens: number; cache: CacheStats; kept: boolean } & Started)
  /** `name`: the error's class, for the ones the caller tells apart (BadRequest, TooDeep, ChatTemplateError). */
  | ({ type: "error"; id: number; name: string; message: string; busyMs: number; freshTokens: number; cache: CacheStats } & Started);
