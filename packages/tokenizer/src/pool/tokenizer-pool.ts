import { Worker } from "node:worker_threads";
import { chatRules, type ChatRules } from "../chat-rules";
import { messagesModes, settledMessagesOptions, unprobedMessagesOptions } from "../preprocessor";
import { ChatTemplateError } from "../messages";
import { DEFAULT_CACHE_MAX_BYTES } from "../segment-cache";
import { hashSeed } from "../fast/word-cache";
import { loadTokenizerFiles, shareTokenizerFiles, type SharedTokenizerFiles, type TokenizerFiles } from "../tokenizer-files";
import { NO_CACHE_STATS, type CacheStats, type PreprocessorOptions } from "../types";
import { defaultPoolSize } from "./cpu-limit";
import type { PoolJob } from "../job";
import { BadRequest } from "../request/bad-request";
import { TooDeep } from "../request/openai-body";
import { DEFAULT_READ_HERE_MAX_BYTES } from "../request/read-body";
import type { RewriteRules } from "../request/rewrite-rules";
import { affinityKey } from "./affinity";
import { appendIds } from "./known-ids";
import { jobChars, jobWork, Placement, type PlacementKind } from "./placement";
import type { BodyReading, FromMember, MemberInit, ToMember } from "./protocol";
import { dueAt, nextDue } from "./queue-order";
import { isShared } from "./shared-body";
import type { ThreadPriority } from "./thread-priority";
import type { WarmUp } from "../warm-up";

export type PoolOptions = {
  /** The preprocessor every member builds (its `cache.maxBytes` is the bound for the whole pool). */
  preprocessor: Omit<PreprocessorOptions, "registry" | "log">;
  /**
   * Members (worker threads); default: under a cgroup CPU quota its CPUs less one for the decision thread (a busy
   * pool must not get the whole cgroup throttled), else the process's CPUs; at most 8 (see defaultPoolSize).
   */
  size?: number;
  /** Answer by this many ms after submission whatever is left to tokenize (default 50; Envoy's message_timeout is 200). */
  budgetMs?: number;
  /**
   * A body no member has read by the budget is answered unread, for its caller to read, up to this size (default
   * DEFAULT_READ_HERE_MAX_BYTES); a larger one waits for its member's reading (see outOfBudget), unless no member is
   * live to read it: then it too is answered unread, and its caller must not read it (glanceBody routes it by load).
   */
  readHereMaxBytes?: number;
  /**
   * Nice value of the members' threads (default DEFAULT_MEMBER_NICE: the caller's priority; above 0 a busy machine
   * runs the decision thread first, see thread-priority.ts).
   */
  nice?: number;
  /**
   * Time slice the members' threads ask the kernel for once warmed up, µs (requestThreadSlice in thread-priority.ts;
   * default 0: the kernel's own): woken with a job, a member then preempts a thread that has run longer.
   */
  sliceUs?: number;
  /** Queued low-priority warm jobs per member, at most; the oldest is dropped past it. */
  maxWarmQueued?: number;
  /** Told as things happen, for metrics (see pool-metrics.ts). */
  observe?: PoolObserver;
  /** Told once per fallback cause (then only counted), and of a member that failed (and was replaced). */
  log?: { warn(obj: object, msg: string): void };
  /**
   * Delay before replacing a member that failed again before it was ready (doubling from this, at most 30 s;
   * default 1000 ms). A member lost after it was ready is replaced at once.
   */
  restartBackoffMs?: number;
};

export type FallbackCause = "budget" | "queue";

/**
 * Asked, with each exact prefix a member tells of a long job (and the body's reading, for a body job, and the
 * whole prompt's length as its member estimates it), whether that prefix settles the answer already, so the rest
 * need not be waited for (the EPP: Picker.settles). The job is then stopped at its member's next piece.
 */
export type Decides = (known: Uint32Array, read: BodyReading | undefined, estimatedTokens: number | undefined) => boolean;

export type PoolObserver = {
  /** A job's wait in its member's queue. */
  wait?(ms: number): void;
  /** Fresh (uncached) tokens of an answered job, and of its cached ones those only a background warm had cached. */
  fresh?(tokens: number, warmedTokens: number): void;
  fallback?(cause: FallbackCause): void;
  /** A request answered on a prefix its caller's `decides` accepted, before its tokenization finished. */
  decided?(): void;
  /**
   * A warm job stopped for a request (it resumes later), dropped from a full warm queue, a body too large to warm,
   * one that had nothing to warm (a reply with none to warm with, read before the body: see BodyJob.reply), or one
   * lost with its member's thread, which held all it could resume from.
   */
  warm?(outcome: "preempted" | "dropped" | "too_large" | "nothing" | "lost"): void;
  /** Everything told so far is forgotten (forgetWork): it was not traffic. */
  reset?(): void;
  /** A member finished a job (warm jobs too): its busy time and the fresh tokens it tokenized. */
  work?(member: number, busyMs: number, freshTokens: number): void;
  /** A request was placed (see placement.ts): on its conversation's member, moved off it, or a new conversation. */
  placed?(kind: PlacementKind): void;
  /** A member's thread was lost (an uncaught error, or it exited) and is being replaced. */
  restarted?(): void;
};

export type TokenizeOutcome = {
  tokens: Uint32Array;
  /**
   * false: answered before the tokenization finished, on the exact prefix known by then (maybe empty): the
   * budget ran out (`fallback`), or the caller's `decides` said that prefix settles the answer (`decided`).
   */
  complete: boolean;
  fallback?: FallbackCause;
  decided?: true;
  /**
   * When not complete: the whole prompt's length in tokens, estimated (the known ids, and the rest at the characters
   * per token its member has measured, or at CHARS_PER_TOKEN when no member said), so that what routing charges
   * for the request is its size, not its known prefix's.
   */
  promptTokens?: number;
  /** When not complete, of a chat: its last turn's length in tokens, estimated likewise (see newTurnChars). */
  newTurnTokens?: number;
  /** Tokens that were not in the segment cache (0 on a fallback: not known yet). */
  freshTokens: number;
  /** Tokens found in the cache only because a background warm (a reply's, see warm) had put them there. */
  warmedTokens: number;
  /** Time queued before a member took the job. */
  waitMs: number;
  /**
   * The member's time on the job (reading and tokenizing), as it measured it: when complete, all of it; when
   * `decided`, until it told the prefix that settled the answer.
   */
  busyMs?: number;
  /**
   * A body job as its member read it; absent when no member had read it by the budget (a "queue" fallback, or a
   * "budget" one whose member was still reading; only bodies up to `readHereMaxBytes`): the caller reads its own
   * bytes, which it kept. Absent too for a larger body when no member was live to read it (starting, or replaced):
   * too large to read on the caller's thread, it is routed by load (glanceBody).
   */
  read?: BodyReading;
};


export type MemberStats = {
  /** `live`: ready and not lost (a member being replaced is not). */
  member: number; live: boolean; queued: number; warmQueued: number; busy: boolean; jobs: number; freshTokens: number; busyMs: number;
  /** The member's segment cache as of its last finished job. */
  cache: CacheStats;
  /** Its warm-up before it reported ready (null until then). */
  warmUp: WarmUp | null;
  /** Its thread's id and nice value (null until ready). */
  priority: ThreadPriority | null;
};
export type PoolStats = {
  size: number; budgetMs: number; members: MemberStats[]; fallbacks: Record<FallbackCause, number>;
  /** Jobs cancelled by their caller, and of those the ones a member stopped midway (not one stopped before it started). */
  cancelled: number; stopped: number; warmDropped: number;
  /** Warms of a body past readHereMaxBytes, not run (see warm), or not resumed (see requeue). */
  warmTooLarge: number;
  /** Warms that had nothing to warm, released as soon as their member read so (see warm). */
  warmNothing: number;
  /** Stopped warms of a body too large to read again, lost with the member that kept what they would resume from (see lost). */
  warmLost: number;
  /**
   * Background jobs (warms, and requests answered already going on for the cache) a request made stop at their
   * next section (each resumes later as a warm, where it stopped: its member keeps the text it walked).
   */
  warmPreempted: number;
  /** Requests answered on a prefix their caller's `decides` accepted (see Decides). */
  decided: number;
  /** The members' segment caches summed (the pool's cache bound is split between them). */
  cache: CacheStats;
  /** Members lost (an uncaught error or exit in the thread) and replaced. */
  restarts: number;
  /** Requests by placement, and the conversations whose member the pool remembers. */
  placement: Record<PlacementKind, number> & { remembered: number };
};

/** Thrown (as the rejection) when the caller's AbortSignal fires. */
export class TokenizeCancelled extends Error {
  override name = "TokenizeCancelled";
}

type Pending = {
  id: number;
  /**
   * null: a body too large to warm, stopped once answered, let go of: it resumes from what its member kept of it,
   * or not at all (see requeue).
   */
  job: PoolJob | null;
  discard: boolean;
  submitted: number;
  /** When its member started it (0: not yet known; a request posted behind another starts when that one ends). */
  dispatched: number;
  /** The member's cancel slot it runs under (see MemberInit.cancel), once posted. */
  slot?: 0 | 1;
  /** Its wait was observed (once per request: when its member started it, or when it was answered before). */
  waitSeen?: true;
  /** Posted behind its member's job and stopped before it started (cancelled, or out of budget): not counted as stopped midway. */
  unstarted?: true;
  /** Its expected cost on its member, in fresh characters (see placement.ts). */
  cost: number;
  settle?: (o: TokenizeOutcome | Error) => void;
  /** The exact prefix its member has told so far (appendIds: a view of a buffer with room after it). */
  known?: Uint32Array;
  /** Its member's time on it when it told `known`. */
  knownBusyMs?: number;
  /** The whole prompt's length as its member estimated it with `known`, and its last turn's. */
  estimatedTokens?: number;
  newTurnTokens?: number;
  decides?: Decides;
  /** Answered, and stopped: nothing waits for its rest (a prefix `decides` accepted, or a budget's answer without a cache). */
  decided?: boolean;
  /** Cancelled by its caller: stopped, it is not resumed. */
  cancelled?: boolean;
  timer?: ReturnType<typeof setTimeout>;
  read?: BodyReading;
  /** A body too large to answer unread, past its budget: answered with its member's first message back. */
  overdue?: boolean;
};

type Member = {
  index: number;
  worker: Worker;
  cancel: Int32Array;
  ready: Promise<void>;
  /** Fails `ready` (a member lost before it was ready; its "init-failed" may not have come). */
  failReady: (e: Error) => void;
  queue: Pending[];
  warm: Pending[];
  current: Pending | null;
  /**
   * A request posted while `current` runs, which its member starts the moment `current` ends: between requests the
   * member does not wait for this thread (busy with other streams for milliseconds at a time under load) to hear
   * that one ended and post the next. One at most: a request that comes later, however urgent, waits behind it.
   * Never a warm: background work is posted only to an idle member.
   */
  next: Pending | null;
  /** The cancel slot the last job posted took (the next takes the other). */
  slot: 0 | 1;
  jobs: number;
  freshTokens: number;
  busyMs: number;
  cache: CacheStats;
  warmUp: WarmUp | null;
  priority: ThreadPriority | null;
  /** Ready (warmed up) and not lost: jobs are dispatched to it, and placement counts it. */
  live: boolean;
  /**
   * forgetWork() waiting for this member's answers, in order; `late`: forgetWork gave up waiting, and the process may
   * have served (and exported its counters) meanwhile.
   */
  resets: { done: () => void; late: boolean }[];
  /** Why it was lost (its thread's uncaught error), told when it exits. */
  failure?: string;
  /** The rewrite rules last sent to it (a "rules" message), by identity: the pool's rules change by replacement. */
  rules: RewriteRules | undefined;
  /** The stopped job whose resume its thread keeps (FromMember "stopped"'s `kept`; one at most, until a warm starts). */
  kept: number | null;
};

const DEFAULT_BUDGET_MS = 50;
/** How far ahead of its due instant a request may be posted behind its member's running job (see postNext). */
const POST_BEHIND_SLACK_MS = 1;
const MAX_RESTART_BACKOFF_MS = 30_000;
/** Job ids stay below 2^31: the member reads a job's cancel flag as an Int32 (see protocol.ts). */
const MAX_JOB_ID = 0x7fffffff;
/**
 * The decision thread's own priority. Members used to run at 19, below it, so that on a saturated node the kernel
 * would run the answers first. Under group scheduling (a pod's cgroup, Linux's autogroup) that backfires: the CPU is
 * shared between groups before nice values count, and a nice-19 member alone on a core carries ~1.5% of its group's
 * weight there (15 against 1024), so it yields that core to any other pod's or session's busy thread even while its
 * own group is owed the CPU, and every pick waiting on it waits that long. `bun run demo` (three EPPs beside the
 * stand-ins on 2 cores, the stand-ins and the client lowered; two runs each): at 19 the replicas' pick p99 read
 * 18.4 / 32.9 / 19.1 and 18.1 / 37.3 / 25.1 ms, at 0 14.4 / 18.3 / 11.2 and 17.2 / 19.5 / 18.2 ms. bench:pick's chats
 * row (one EPP saturating the machine, nothing else in its way; three runs each): p99 13-37 ms at 0, 19-41 ms at 19.
 * The decision thread keeps the CPU it needs without a lower nice beside it: it sleeps between messages, and the
 * scheduler runs a thread that wakes ahead of one that has been running, at once when the waking one asked for a short
 * slice (`sliceUs`, the EPP's --thread-slice-us); where a quota bounds the pod, the default
 * pool leaves it a CPU (defaultPoolSize). `--tokenizer-nice` still lowers the members where a node runs nothing else.
 */
export const DEFAULT_MEMBER_NICE = 0;

/** A prompt's length guessed from its characters (or a body's bytes) when no member has measured its text. */
const CHARS_PER_TOKEN = 4;

/**
 * Tokenization off the event loop: worker threads, each with its own preprocessor and a share of the segment
 * cache bound. A conversation goes to the member that took its earlier turns (so its sections are cached
 * there), busy or not, unless another would finish it sooner tokenizing it all fresh (see placement.ts).
 * A member takes its queued requests earliest due first, so a short pick passes a long text (see queue-order.ts).
 * Every job is answered within the budget: by its ids, or by the prefix the member's cache already knew
 * (counted as a fallback); work past the budget still runs and fills the cache for the next turn, after the
 * requests queued behind it. The exception: a body too large for its caller to read (readHereMaxBytes) is
 * answered once its member has read it, or unread, for its caller to route by load, when no member is live. A job whose AbortSignal fires is dropped from the queue, or stopped at
 * the member's next section. A member whose thread is lost is replaced; its queue waits for the replacement.
 */
export class TokenizerPool {
  private readonly members: Member[];
  private readonly budgetMs: number;
  /** The largest body its caller reads itself (see PoolOptions; the EPP reads token ids up to it too, readTokenIds). */
  readonly readHereMaxBytes: number;
  /** The rules its members read bodies by, for a body its caller reads itself (readBody). */
  readonly rules: ChatRules;
  private readonly maxWarmQueued: number;
  private readonly log: PoolOptions["log"];
  private lastId = 0;
  private fallbacks: Record<FallbackCause, number> = { budget: 0, queue: 0 };
  private readonly logged = new Set<string>();
  private cancelled = 0;
  private warmDropped = 0;
  private warmTooLarge = 0;
  private warmNothing = 0;
  private warmLost = 0;
  private warmPreempted = 0;
  private decided = 0;
  private stopped = 0;
  private readonly observe: PoolObserver;
  private readonly placement: Placement;
  private placements: Record<PlacementKind, number> = { affine: 0, moved: 0, new: 0 };
  private closed = false;
  private restarts = 0;
  /** The cumulative cache figures of members lost (counters only: what a replacement starts from zero). */
  private retired: CacheStats = { ...NO_CACHE_STATS };
  /** Per member slot: failures in a row of replacements that never got ready (sets the backoff). */
  private readonly failedStarts: number[];
  /** Per member slot: whether a member there was ever ready (a pool that never started is not kept trying). */
  private readonly started: boolean[];
  private readonly restartBackoffMs: number;
  private readonly memberOptions: { preprocessor: PoolOptions["preprocessor"]; readonly files: SharedTokenizerFiles | undefined; readonly nice: number; readonly sliceUs: number };

  constructor(opts: PoolOptions) {
    const size = Math.max(1, opts.size ?? defaultPoolSize());
    this.budgetMs = opts.budgetMs ?? DEFAULT_BUDGET_MS;
    this.readHereMaxBytes = opts.readHereMaxBytes ?? DEFAULT_READ_HERE_MAX_BYTES;
    this.maxWarmQueued = opts.maxWarmQueued ?? 4;
    this.log = opts.log;
    this.observe = opts.observe ?? {};
    const cache = opts.preprocessor.cache;
    // Each member's cache a share of the bound, so that the bound holds for the pool: bytes, and entries when bounded.
    const share = cache === false ? false : {
      ...cache,
      maxBytes: Math.floor((cache?.maxBytes ?? DEFAULT_CACHE_MAX_BYTES) / size),
      ...(cache?.maxEntries !== undefined ? { maxEntries: Math.max(1, Math.floor(cache.maxEntries / size)) } : {}),
    };
    const { files, shared } = readOnce(opts.preprocessor.tokenizerDir, opts.log);
    const given: PoolOptions["preprocessor"] = { ...opts.preprocessor, cache: share };
    this.memberOptions = { preprocessor: unprobedMessagesOptions(given), files: shared, nice: opts.nice ?? DEFAULT_MEMBER_NICE, sliceUs: opts.sliceUs ?? 0 };
    this.caches = share !== false && share.maxBytes > 0;
    this.restartBackoffMs = opts.restartBackoffMs ?? 1000;
    this.failedStarts = Array.from({ length: size }, () => 0);
    this.started = Array.from({ length: size }, () => false);
    this.members = Array.from({ length: size }, (_, index) => this.startMember(index));
    this.placement = new Placement(size);
    // Probed once, here, while the members load on their threads: every member, a replacement too, and the pool's own
    // reading share one verdict. The members started by the unprobed modes; each is told the verdict before this
    // constructor returns, so before any job can be posted to it.
    const preprocessor = settledMessagesOptions(given, files, opts.log);
    this.memberOptions.preprocessor = preprocessor;
    this.rules = chatRules(preprocessor.chatRendering, preprocessor);
    const modes = messagesModes(this.rules);
    if (modes !== undefined) for (const m of this.members) m.worker.postMessage({ type: "messages-modes", modes } satisfies ToMember);
  }

  get size(): number {
    return this.members.length;
  }

  /**
   * Whether the members keep what they tokenize (a share of the bound above 0). Without a cache nothing is
   * warmed, and a request answered over its budget stops at its next piece: that work would only fill the cache.
   */
  readonly caches: boolean;

  /** Resolves once every member has loaded its tokenizer and warmed up (warm-up.ts); rejects if one cannot. */
  async ready(): Promise<void> {
    await Promise.all(this.members.map((m) => m.ready));
  }

  /**
   * A body job (`kind: "body"`) is read by the member (parsed, validated, its model rewritten) before it is
   * tokenized, from a copy, or from the caller's own bytes when they are in shared memory (joinBody), which then
   * must stay as they are: the caller keeps its bytes, to forward them and to read them itself when the budget
   * ends before the member has (see TokenizeOutcome.read).
   */
  tokenize(job: PoolJob, opts: { signal?: AbortSignal; decides?: Decides } = {}): Promise<TokenizeOutcome> {
    if (this.closed) return Promise.reject(new Error("tokenizer pool closed"));
    if (opts.signal?.aborted) return Promise.reject(new TokenizeCancelled("cancelled before it started"));
    return new Promise<TokenizeOutcome>((resolve, reject) => {
      const p: Pending = { id: this.newId(), job, discard: false, submitted: performance.now(), dispatched: 0, cost: 0, decides: opts.decides };
      // Its slot's member when the time comes (a lost member's queue goes to its replacement); placed below.
      let slot = -1;
      const member = () => this.members[slot]!;
      const onAbort = () => this.cancel(member(), p);
      p.settle = (o) => {
        p.settle = undefined;
        clearTimeout(p.timer);
        opts.signal?.removeEventListener("abort", onAbort);
        if (o instanceof Error) return reject(o);
        // Answered first: an observer that throws (a metric refusing a value) must not leave the request waiting.
        resolve(o);
        try {
          if (o.complete) this.observe.fresh?.(o.freshTokens, o.warmedTokens);
          else if (o.decided) this.observe.decided?.();
          else this.observe.fallback?.(o.fallback!);
        } catch (err) {
          this.log?.warn({ err: String(err) }, "tokenizer pool observer failed");
        }
      };
      // Every member is being replaced (a lost thread, in backoff): nothing can take it within the budget. Not placed
      // (nor counted as placed): its refill is, as the warm it is.
      if (!this.members.some((m) => m.live)) {
        this.fallBack(p, "queue");
        return this.refill(job);
      }
      slot = this.memberFor(p, job).index;
      opts.signal?.addEventListener("abort", onAbort, { once: true });
      p.timer = setTimeout(() => this.outOfBudget(member(), p), this.budgetMs);
      member().queue.push(p);
      this.preemptWarm(member());
      this.pump(member());
    });
  }

  /**
   * Tokenizes in the background at the lowest priority, only to fill the cache. After a chat's response, a body job
   * with its `reply` (the response body as received) warms the conversation as its next turn will send it
   * (nextTurnJob), so that turn finds everything but its new message cached; its member reads the reply first, and a
   * reply with nothing to warm with releases the warm at once, its body unread (counted). A body past
   * `readHereMaxBytes` is not warmed (counted): its member could not stop reading it for a request that comes
   * meanwhile, and that is the longest read the pool lets a pick wait on; nor, queued, does it hold such a body.
   */
  warm(job: PoolJob): void {
    if (this.closed || !this.caches) return;
    if (this.tooLargeToWarm(job)) {
      this.warmTooLarge++;
      this.observe.warm?.("too_large");
      return;
    }
    const p: Pending = { id: this.newId(), job, discard: true, submitted: performance.now(), dispatched: 0, cost: 0 };
    const member = this.memberFor(p, job, false);
    member.warm.push(p);
    this.trimWarm(member);
    this.pump(member);
  }

  /**
   * A request answered before any member read it, tokenized in the background to fill the cache; not a body past
   * `readHereMaxBytes`, which warm would refuse (and count as a warm too large, which it was not).
   */
  private refill(job: PoolJob): void {
    if (!this.tooLargeToWarm(job)) this.warm(job);
  }

  /** A body past `readHereMaxBytes`: its member could not stop reading it for a request (see warm). */
  private tooLargeToWarm(job: PoolJob): boolean {
    return job.kind === "body" && job.request.body.byteLength > this.readHereMaxBytes;
  }

  stats(): PoolStats {
    return {
      size: this.members.length, budgetMs: this.budgetMs,
      members: this.members.map((m) => ({
        member: m.index, live: m.live, queued: m.queue.length + (m.next !== null && awaited(m.next) ? 1 : 0), warmQueued: m.warm.length, busy: m.current !== null,
        jobs: m.jobs, freshTokens: m.freshTokens, busyMs: m.busyMs, cache: { ...m.cache }, warmUp: m.warmUp, priority: m.priority,
      })),
      fallbacks: { ...this.fallbacks }, cancelled: this.cancelled, stopped: this.stopped, warmDropped: this.warmDropped, warmTooLarge: this.warmTooLarge, warmNothing: this.warmNothing, warmLost: this.warmLost, warmPreempted: this.warmPreempted, decided: this.decided,
      restarts: this.restarts,
      cache: this.cacheStats(), placement: { ...this.placements, remembered: this.placement.remembered },
    };
  }

  /**
   * Forgets the work done so far, for work that was not traffic (the decision thread's warm-up, before the replica
   * serves, so that no scrape saw a counter go back): every member empties its segment cache and zeroes its
   * counters after what it is running, the warms queued are dropped, and the pool's figures, its observer's
   * (PoolObserver.reset) and its placements start over. Resolves once every live member has, or after `timeoutMs`
   * (a member stuck in a long job: what it caches meanwhile stays, and the cache counters keep what it counted).
   */
  async forgetWork(timeoutMs = 5000): Promise<void> {
    const resets = Promise.all(this.members.filter((m) => m.live).map((m) => {
      m.warm = [];
      return new Promise<void>((resolve) => {
        m.resets.push({ done: resolve, late: false });
        m.worker.postMessage({ type: "reset" } satisfies ToMember);
      });
    }));
    let timer: ReturnType<typeof setTimeout> | undefined;
    await Promise.race([resets, new Promise<void>((resolve) => (timer = setTimeout(resolve, timeoutMs)))]);
    clearTimeout(timer);
    for (const m of this.members) for (const reset of m.resets) reset.late = true;
    this.retired = { ...NO_CACHE_STATS };
    for (const m of this.members) Object.assign(m, { jobs: 0, busyMs: 0, freshTokens: 0 });
    this.fallbacks = { budget: 0, queue: 0 };
    this.placements = { affine: 0, moved: 0, new: 0 };
    this.decided = this.stopped = this.cancelled = this.warmDropped = this.warmTooLarge = this.warmNothing = this.warmLost = this.warmPreempted = 0;
    this.logged.clear();
    this.placement.clear();
    this.observe.reset?.();
  }

  /** The members' segment caches summed, as each reported it with its last finished job. */
  cacheStats(): CacheStats {
    // Counters keep what lost members counted (exported as Prometheus counters, which must not go back);
    // the gauges (bytes, entries) are the live members' alone.
    const sum = { ...this.retired, bytes: 0, entries: 0 };
    for (const m of this.members) for (const k of Object.keys(sum) as (keyof CacheStats)[]) sum[k] += m.cache[k];
    return sum;
  }

  /** Keeps the counters of cache figures about to be dropped (a lost member's, a late reset's). */
  private retire(cache: CacheStats): void {
    for (const k of Object.keys(this.retired) as (keyof CacheStats)[]) this.retired[k] += cache[k];
  }

  async close(): Promise<void> {
    this.closed = true;
    for (const m of this.members) this.failAll(m, "tokenizer pool closed");
    await Promise.all(this.members.map((m) => m.worker.terminate()));
  }

  /** Fails what a member runs and has queued, and drops its warms: nothing will run them. */
  private failAll(member: Member, message: string): void {
    for (const p of [...member.queue, ...(member.current ? [member.current] : []), ...(member.next ? [member.next] : [])]) p.settle?.(new Error(message));
    member.queue = [];
    member.warm = [];
    member.current = member.next = null;
  }

  private newId(): number {
    this.lastId = this.lastId >= MAX_JOB_ID ? 1 : this.lastId + 1;
    return this.lastId;
  }

  private startMember(index: number): Member {
    const cancelBuffer = new SharedArrayBuffer(8);
    // A replacement starts while the process serves: its loading and warm-up run at its low priority from the start.
    const { preprocessor, files, nice, sliceUs } = this.memberOptions;
    const init: MemberInit = { preprocessor, files, seed: hashSeed(), cancel: cancelBuffer, nice, sliceUs, serving: this.started[index] === true };
    const worker = new Worker(new URL("./pool-member.ts", import.meta.url), { workerData: init });
    let resolveReady!: () => void;
    let rejectReady!: (e: Error) => void;
    const ready = new Promise<void>((res, rej) => ((resolveReady = res), (rejectReady = rej)));
    ready.catch(() => {}); // observed through ready()
    const member: Member = {
      index, worker, cancel: new Int32Array(cancelBuffer), ready, failReady: rejectReady, queue: [], warm: [], current: null, next: null, slot: 1, jobs: 0, freshTokens: 0, busyMs: 0,
      cache: NO_CACHE_STATS, warmUp: null, priority: null, live: false, resets: [], rules: undefined, kept: null,
    };
    worker.on("message", (m: FromMember) => {
      if (this.members[index] !== member) return; // a lost member's last words
      if (m.type === "ready") {
        member.warmUp = m.warmUp;
        member.priority = m.priority;
        member.live = true;
        this.failedStarts[index] = 0;
        this.started[index] = true;
        resolveReady();
        this.pump(member);
      }
      else if (m.type === "init-failed") {
        member.failure = m.message;
        rejectReady(new Error(`tokenizer pool member ${index}: ${m.message}`));
      }
      else if (m.type === "reset") {
        const reset = member.resets.shift();
        // Too late to be forgotten: what it counted may have been exported, and counters never go back.
        if (reset?.late) this.retire(member.cache);
        member.cache = m.cache;
        member.kept = null;
        // What was queued to it meanwhile (a stopped warm's rest) is of the work forgotten; not after forgetWork gave
        // up waiting: the process may serve by then, and those warms are its traffic's.
        if (!reset?.late) member.warm = [];
        reset?.done();
      }
      else this.onResult(member, m);
    });
    // An uncaught error ends the thread ("exit" follows): whatever the member held is answered or moved, and
    // another member takes its place, so that no job waits for a thread that is gone.
    worker.on("error", (err: Error) => {
      member.failure = err.message;
      rejectReady(err);
    });
    worker.on("exit", (code: number) => this.lost(member, member.failure ?? `its thread exited (code ${code})`));
    worker.unref();
    return member;
  }

  /**
   * A member's thread is gone: the request it was running fails (it may be what killed it), its queue and warms
   * go to its replacement, and placement leaves the slot alone until the replacement is ready. A replacement
   * that fails before it is ready is retried after a doubling delay.
   */
  private lost(member: Member, why: string): void {
    // Its cache went with its thread: a reset it owed is done.
    for (const reset of member.resets.splice(0)) reset.done();
    if (this.closed || this.members[member.index] !== member) return;
    member.live = false;
    if (!this.started[member.index]) {
      // Never ready: ready() fails (if its "init-failed" or "error" did not say so already), and what was asked of it.
      member.failReady(new Error(`tokenizer pool member ${member.index}: ${why}`));
      return this.failAll(member, `tokenizer pool member ${member.index}: ${why}`);
    }
    this.restarts++;
    this.observe.restarted?.();
    this.retire(member.cache);
    member.cache = NO_CACHE_STATS;
    this.placement.forget(member.index);
    const failedStarts = member.warmUp === null ? ++this.failedStarts[member.index]! : 0;
    const delay = failedStarts === 0 ? 0 : Math.min(MAX_RESTART_BACKOFF_MS, this.restartBackoffMs * 2 ** (failedStarts - 1));
    this.log?.warn({ member: member.index, why, restartInMs: delay }, "tokenizer pool member lost: replacing it");
    const running = member.current;
    member.current = null;
    running?.settle?.(new Error(`tokenizer pool member ${member.index} failed: ${why}`));
    // A warm it ran is not run again (it may be what killed the thread): lost, counted.
    if (running?.discard) {
      this.warmLost++;
      this.observe.warm?.("lost");
    }
    // The request posted behind it may not have started: still awaited, it is queued again for the replacement. One
    // answered already (out of budget) only fills the cache, as a warm; one cancelled or decided, not at all.
    const behind = member.next;
    member.next = null;
    if (behind !== null && awaited(behind)) {
      behind.dispatched = 0;
      member.queue.push(behind);
    } else if (behind !== null && behind.job !== null && !behind.cancelled && !behind.decided) this.refill(behind.job);
    // A body too large for its caller to read, past its budget, was waiting for this member's reading: answered
    // unread now (its caller routes it by load) rather than kept waiting for a replacement that may be a backoff away.
    for (const p of member.queue.filter((q) => q.overdue && q.settle !== undefined)) {
      member.queue.splice(member.queue.indexOf(p), 1);
      this.fallBack(p, "budget");
    }
    // A stopped warm of a body too large to read again had only what this thread kept to resume from (requeue).
    const resumable = member.warm.filter((w) => w.job !== null);
    for (let lostWarms = member.warm.length - resumable.length; lostWarms > 0; lostWarms--) {
      this.warmLost++;
      this.observe.warm?.("lost");
    }
    member.warm = resumable;
    const replace = () => {
      if (this.closed || this.members[member.index] !== member) return;
      const next = this.startMember(member.index);
      [next.queue, next.warm] = [member.queue, member.warm];
      member.queue = [];
      member.warm = [];
      this.members[member.index] = next;
      if (next.queue.length > 0 || next.warm.length > 0) next.worker.ref();
    };
    if (delay === 0) replace();
    else setTimeout(replace, delay).unref();
  }

  // A conversation is known by its first messages (its system prompt and first user turn), or a prompt by its
  // start; placement.ts decides, from the members' backlogs, and sets the job's expected cost. A backlog counts
  // every queued request, though a cheap one passes costlier ones (queue-order.ts): for it, an over-estimate.
  // Background work counts for nothing: a warm, or a request answered already, stops at its next piece for a request
  // (preemptWarm). A body its member is still reading is read to its end first, uncounted too: the pool does not
  // know how far that read is (readHereMaxBytes bounds it).
  private memberFor(p: Pending, job: PoolJob, move = true): Member {
    // A member not ready (replacing a lost one) looks endlessly busy: work goes elsewhere while there is elsewhere.
    const backlogs = this.members.map((m) => (m.live ? m.queue.reduce((sum, q) => sum + q.cost, awaitedCost(m.current) + awaitedCost(m.next)) : Infinity));
    const { chars, read } = jobWork(job);
    const placed = this.placement.place(affinityKey(job), chars, backlogs, move, read);
    p.cost = placed.cost;
    if (!p.discard) {
      this.placements[placed.kind]++;
      this.observe.placed?.(placed.kind);
    }
    return this.members[placed.member]!;
  }

  private pump(member: Member): void {
    if (!member.live) return;
    if (member.current !== null) return this.postNext(member);
    let next: Pending | undefined;
    for (;;) {
      // Requests first, the earliest due (queue-order.ts), then background work in its order.
      const due = nextDue(member.queue);
      next = due >= 0 ? member.queue.splice(due, 1)[0] : member.warm.shift();
      // Idle: its thread no longer keeps the process alive (a warm dropped here may have been all it had queued).
      if (next === undefined) return member.worker.unref();
      if (next.job !== null || member.kept === next.id) break;
      // Its member no longer keeps what it would resume from (another job's stop took its place, or a warm started),
      // and its body, too large to read again, was let go of (requeue).
      this.warmTooLarge++;
      this.observe.warm?.("too_large");
    }
    member.current = next;
    next.dispatched = performance.now();
    this.waited(next, next.dispatched);
    this.post(member, next);
  }

  /**
   * While `member` runs a job, the earliest due request queued to it is posted behind it (see Member.next) once it is
   * due within POST_BEHIND_SLACK_MS: a request that comes later is then due no earlier than that, so posting it cannot
   * let it pass one it should not (queue-order.ts). A long text due later stays queued, for a short pick to pass.
   */
  private postNext(member: Member): void {
    if (member.next !== null) return;
    const due = nextDue(member.queue);
    if (due < 0 || dueAt(member.queue[due]!) > performance.now() + POST_BEHIND_SLACK_MS) return;
    const next = member.queue.splice(due, 1)[0]!;
    member.next = next;
    this.post(member, next);
  }

  private post(member: Member, next: Pending): void {
    member.slot = member.slot === 0 ? 1 : 0;
    next.slot = member.slot;
    // Its slot may name a job long done; the other, this one (a warm stopped for a request, resumed now).
    Atomics.store(member.cancel, next.slot, 0);
    if (Atomics.load(member.cancel, 1 - next.slot) === next.id) Atomics.store(member.cancel, 1 - next.slot, 0);
    member.worker.ref();
    const resumed = member.kept === next.id;
    // A warm's start lets go of what the member kept (see pool-member.ts), this one's own once it resumes.
    if (next.discard) member.kept = null;
    // Resumed from what its member kept: nothing of the job is sent (nor copied on this thread) again.
    if (resumed) return member.worker.postMessage({ type: "resume", id: next.id } satisfies ToMember);
    // The caller keeps its body, which it forwards, and reads itself if the budget ends first: a body in shared
    // memory (joinBody) goes by reference, read by both threads and written by neither; any other goes as a copy
    // of its bytes alone (cloning a view would copy the whole buffer under it, a gRPC frame's). One memcpy (~5 µs
    // for a 64 KB chat) buys an answer that never waits for a member still reading.
    const job = next.job!;
    if (job.kind !== "body") {
      member.worker.postMessage({ type: "job", id: next.id, job, discard: next.discard });
      return;
    }
    const { rewriteRules, ...request } = job.request;
    // A job without rules (none set, or a body its caller does not forward) leaves the member's as they are.
    if (rewriteRules !== undefined && rewriteRules !== member.rules) {
      member.worker.postMessage({ type: "rules", rules: rewriteRules });
      member.rules = rewriteRules;
    }
    const body = forMember(request.body);
    const reply = job.reply === undefined ? undefined : forMember(job.reply);
    const message: ToMember = {
      type: "job", id: next.id, job: { ...job, request: { ...request, body }, ...(reply ? { reply } : {}) }, discard: next.discard, rules: rewriteRules !== undefined,
    };
    member.worker.postMessage(message, [body, ...(reply ? [reply] : [])].filter((b) => !isShared(b)).map((b) => b.buffer as ArrayBuffer));
  }

  private onResult(member: Member, m: Exclude<FromMember, { type: "ready" | "init-failed" | "reset" }>): void {
    const p = member.current;
    if (p === null || p.id !== m.id) return;
    if (p.dispatched === 0) {
      // Posted behind another job: it waited at its member until that one ended.
      p.dispatched = Math.max(p.submitted, m.startedAt - performance.timeOrigin);
      this.waited(p, p.dispatched);
    }
    if ((m.type === "known" || m.type === "done") && m.read) p.read = m.read;
    if (m.type === "known") {
      // Once answered, nothing reads what its member goes on telling.
      if (p.settle === undefined) return;
      p.known = appendIds(p.known, m.added);
      p.knownBusyMs = m.busyMs;
      p.estimatedTokens = m.estimatedTokens;
      p.newTurnTokens = m.newTurnTokens;
      if (this.settledBy(p, p.known)) this.answerDecided(member, p);
      // Known now what would not finish in budget (or past it already): answer at once with what is known.
      else if (p.overdue || performance.now() - p.submitted + m.estimatedMs > this.budgetMs) this.fallBack(p, "budget", member);
      return;
    }
    // The request posted behind it has started already.
    member.current = member.next;
    member.next = null;
    if (m.type === "stopped" && m.kept) member.kept = m.id;
    member.cache = m.cache;
    member.busyMs += m.busyMs;
    member.jobs++;
    // Stopped and failed jobs count too: what they tokenized before is cached, and it took the member's time.
    member.freshTokens += m.freshTokens;
    this.observe.work?.(member.index, m.busyMs, m.freshTokens);
    if (m.type === "done") {
      if (m.nothing) {
        this.warmNothing++;
        this.observe.warm?.("nothing");
      }
      p.settle?.({
        tokens: m.ids ?? new Uint32Array(0), complete: true, freshTokens: m.freshTokens, warmedTokens: m.warmedTokens, waitMs: p.dispatched - p.submitted,
        busyMs: m.busyMs,
        ...(p.read ? { read: p.read } : {}),
      });
    } else if (m.type === "error") {
      p.settle?.(memberError(m.name, m.message));
    } else if (p.decided) {
      // Stopped once answered (answerDecided): nothing waits for its rest.
    } else if (p.discard || (p.settle === undefined && !p.cancelled)) {
      // A warm stopped for a request (preemptWarm), or a request answered over budget stopped for another: it goes
      // on later, first of the warms, as a warm of the same id, which its member resumes where it stopped.
      // Not while its cache is being emptied: its rest is of the work forgotten (forgetWork).
      if (member.resets.length === 0) this.requeue(member, p, m.kept);
    } else {
      if (!p.unstarted) this.stopped++;
      p.settle?.(new TokenizeCancelled("stopped"));
    }
    this.pump(member);
  }

  /** A request's wait, observed once: until its member started it, or until it was answered without (`at`). */
  private waited(p: Pending, at: number): void {
    if (p.discard || p.waitSeen) return;
    p.waitSeen = true;
    this.observe.wait?.(at - p.submitted);
  }

  /**
   * A stopped job put back, first of the warms (but behind another job's resume that its member keeps). Answered
   * already, it no longer holds what only its answer needed (its reading, a rewritten copy of its body; its known
   * prefix). A body too large to warm (tooLargeToWarm) is let go of too: it resumes from what its member keeps of it
   * (its walk, or its reading), or, if its member keeps nothing of it (or no longer does when its turn comes), it is
   * not run at all, as warm() would not run it; reading it again is a read its member could not stop for a request, of
   * bytes its caller no longer counts against its budget. A smaller one whose member no longer keeps its resume is
   * read again, as any warm is.
   */
  private requeue(member: Member, p: Pending, kept: boolean): void {
    p.discard = true;
    p.read = p.known = undefined;
    if (p.job === null || this.tooLargeToWarm(p.job)) {
      if (!kept) {
        this.warmTooLarge++;
        this.observe.warm?.("too_large");
        return;
      }
      p.job = null;
    }
    // One whose member kept nothing of it (a request posted behind and stopped before it started, out of budget) goes
    // behind the job whose resume its member keeps, queued first: started ahead, it would make its member let go of
    // that resume (a warm's start does), and that job would walk every piece it had finished again.
    const resume = !kept && member.kept !== null && member.warm[0]?.id === member.kept;
    const at = resume ? 1 : 0;
    member.warm.splice(at, 0, p);
    this.trimWarm(member, at + 1);
  }

  /** The caller's `decides`, which must not throw into a worker's message listener (a throw counts as no). */
  private settledBy(p: Pending, known: Uint32Array): boolean {
    try {
      return p.decides?.(known, p.read, p.estimatedTokens) === true;
    } catch (err) {
      this.log?.warn({ err: (err as Error).message }, "tokenizer pool: the caller's decides threw (taken as not settled)");
      return false;
    }
  }

  private outOfBudget(member: Member, p: Pending): void {
    // (A job is let go of only once answered.)
    if (!p.settle || p.job === null) return;
    // A body too large to read on the caller's thread waits for its member's reading, queued or being read
    // (not for a slot whose member is lost: its replacement may be a backoff away).
    if (p.job.kind === "body" && !p.read && p.job.request.body.byteLength > this.readHereMaxBytes && member.live) {
      p.overdue = true;
      return;
    }
    const queued = member.queue.indexOf(p);
    if (queued >= 0) {
      // Still waiting for its member: answered with nothing known, and tokenized later at low priority (refill) so
      // that the conversation's next turn finds it cached.
      member.queue.splice(queued, 1);
      // Its wait counts as the longest a request waited (it never reached its member).
      this.waited(p, performance.now());
      this.fallBack(p, "queue");
      // The warm holds the caller's body until it runs (at most maxWarmQueued of them a member).
      this.refill(p.job);
      return;
    }
    // Posted behind its member's job and not heard of since: it may not have started (its member tells its start
    // with its first message), and has waited until now at least.
    if (p.dispatched === 0) this.waited(p, performance.now());
    // Still behind the job its member runs: as if still queued (fallBack stops it at its member's first check, before
    // its body is read; its rest goes on as a warm).
    if (member.next === p) return this.fallBack(p, "queue", member);
    // Answered on what is known by now; a body its member is still reading goes back unread (its caller reads its own copy).
    this.fallBack(p, "budget", member);
  }

  /** `running`: the member running the request, whose rest then only fills the cache: requests queued behind it go first. */
  private fallBack(p: Pending, cause: FallbackCause, running?: Member): void {
    this.fallbacks[cause]++;
    if (!this.logged.has(cause)) {
      this.logged.add(cause);
      this.log?.warn({ cause, budgetMs: this.budgetMs, knownTokens: p.known?.length ?? 0 },
        "tokenization over budget: routed on the known prefix (logged once per cause, then counted)");
    }
    p.settle?.({
      tokens: p.known ?? new Uint32Array(0), complete: false, fallback: cause, freshTokens: 0, warmedTokens: 0, waitMs: (p.dispatched || performance.now()) - p.submitted,
      promptTokens: p.estimatedTokens ?? Math.ceil((p.job === null ? 0 : jobChars(p.job)) / CHARS_PER_TOKEN),
      newTurnTokens: p.newTurnTokens,
      ...(p.read ? { read: p.read } : {}),
    });
    if (running === undefined) return;
    // Posted behind the job its member runs: stopped at its member's first check (before its body is read), its rest
    // goes on as a warm.
    if (running.next === p) {
      p.unstarted = true;
      return this.caches ? stop(running, p) : this.stopAnswered(running, p);
    }
    if (running.current !== p) return;
    if (!this.caches) this.stopAnswered(running, p);
    else if (running.queue.length > 0 || running.next !== null) this.preemptWarm(running);
  }

  /**
   * Answers on the prefix the caller says settles it, and stops the member there: the rest cannot change the
   * answer, and what it would cache for the next turn is what a warm from the reply tokenizes anyway (in the
   * background, when a reply comes).
   */
  private answerDecided(member: Member, p: Pending): void {
    this.decided++;
    this.stopAnswered(member, p);
    p.settle?.({
      tokens: p.known!, complete: false, decided: true, freshTokens: 0, warmedTokens: 0, waitMs: p.dispatched - p.submitted, busyMs: p.knownBusyMs,
      promptTokens: p.estimatedTokens,
      newTurnTokens: p.newTurnTokens,
      ...(p.read ? { read: p.read } : {}),
    });
  }

  /** Tells `member` to stop the answered request it runs at its next piece; nothing waits for (or resumes) its rest. */
  private stopAnswered(member: Member, p: Pending): void {
    p.decided = true;
    stop(member, p);
  }

  /**
   * A request waits for nothing in the background: a member running a warm job, or a request answered already
   * (its rest only fills the cache), is told to stop it at its next section.
   */
  private preemptWarm(member: Member): void {
    const running = member.current;
    if (running === null || awaited(running) || stopping(member, running)) return;
    this.warmPreempted++;
    this.observe.warm?.("preempted");
    stop(member, running);
  }

  /**
   * Past `maxWarmQueued`, the oldest warm jobs (the queue's front) are dropped, but not the first `keep`: a stopped
   * job just put back to go on first, and the resume its member keeps ahead of it (requeue), unless nothing else is left.
   */
  private trimWarm(member: Member, keep = 0): void {
    while (member.warm.length > this.maxWarmQueued) {
      member.warm.splice(Math.min(keep, member.warm.length - 1), 1);
      this.warmDropped++;
      this.observe.warm?.("dropped");
    }
  }

  private cancel(member: Member, p: Pending): void {
    if (!p.settle) return;
    this.cancelled++;
    p.cancelled = true;
    const queued = member.queue.indexOf(p);
    if (queued >= 0) member.queue.splice(queued, 1);
    else if (member.current === p) stop(member, p);
    else if (member.next === p) {
      p.unstarted = true;
      stop(member, p);
    }
    p.settle(new TokenizeCancelled("the request was cancelled"));
  }

}

/** Tells `member` to stop `p` (running, or posted behind what runs) at its next piece. */
function stop(member: Member, p: Pending): void {
  Atomics.store(member.cancel, p.slot!, p.id);
}

function stopping(member: Member, p: Pending): boolean {
  return Atomics.load(member.cancel, p.slot!) === p.id;
}

/** What a member's running or posted job counts in its backlog: its cost while its caller waits on it. */
function awaitedCost(p: Pending | null): number {
  return p !== null && awaited(p) ? p.cost : 0;
}

/** A request its caller still waits on (not a warm, nor one answered already whose rest only fills the cache). */
function awaited(p: Pending): boolean {
  return !p.discard && p.settle !== undefined;
}

/** Bytes as a member is given them: in shared memory, as they are; else a copy of their own to transfer (a Buffer's slice() would be a view). */
function forMember(bytes: Uint8Array): Uint8Array {
  return isShared(bytes) ? bytes : new Uint8Array(bytes);
}

/**
 * The tokenizer directory read once, here: `files` for the pool's probe, `shared` for every member, which adopts the
 * model's tables in shared memory instead of reading and building its own (see the README's pool section for the
 * memory it saves). A directory that fails to read is left to the members, which fail on it with the same message.
 * So is a model with no tables to share (one the scanner does not read: Unigram, WordPiece): posted whole, it would
 * be kept here and copied to every member, a replacement's on this thread while it serves.
 */
function readOnce(dir: string | undefined, log: PoolOptions["log"]): { files?: TokenizerFiles; shared?: SharedTokenizerFiles } {
  if (dir === undefined) return {};
  let files: TokenizerFiles;
  try {
    files = loadTokenizerFiles(dir);
  } catch {
    return {};
  }
  try {
    const shared = shareTokenizerFiles(files);
    return { files, shared: shared.model?.tables ? shared : undefined };
  } catch (err) {
    // Not the members' to fail on: they still read it, each its own copy (that much more memory a member).
    log?.warn({ err: (err as Error).message }, "tokenizer pool: the model could not be shared; each member reads its own");
    return { files };
  }
}

/** A member's error as the caller tells it apart: a bad body (400), a template's refusal, or the pool's. */
function memberError(name: string, message: string): Error {
  if (name === "TooDeep") return new TooDeep(message);
  if (name === "BadRequest") return new BadRequest(message);
  if (name === "ChatTemplateError") return new ChatTemplateError(message);
  return new Error(`tokenizer pool: ${message}`);
}
