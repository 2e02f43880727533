// A pool member: a worker thread with its own preprocessor and segment cache, tokenizing one job at a time.
import { parentPort, workerData } from "node:worker_threads";
import { encodeJob, newTurnChars, nextTurnJob, type PoolJob, type TokenizeJob } from "../job";
import { isMediaPart } from "../media";
import { adoptMessagesModes, createPreprocessor } from "../preprocessor";
import { adoptTokenizerFiles } from "../tokenizer-files";
import { useSeed } from "../fast/word-cache";
import { EncodeStopped, type EncodeControl, type KnownPrefix } from "../segmenter";
import type { CacheStats, Preprocessor } from "../types";
import { BadRequest } from "../request/bad-request";
import { TooDeep } from "../request/openai-body";
import { readBody } from "../request/read-body";
import { readChatReply } from "../request/chat-reply";
import type { RewriteRules } from "../request/rewrite-rules";
import { warmUp } from "../warm-up";
import { KNOWN_PREFIX_MIN_CHARS, type BodyReading, type FromMember, type MemberInit, type ToMember } from "./protocol";
import { jobChars } from "./placement";
import { setThreadPriority } from "./thread-priority";


type JobMessage = Extract<ToMember, { type: "job" }>;
/** A job as its member runs it: what the messages back name, and whether it is a warm. */
type Run = { id: number; discard: boolean };

const port = parentPort!;
const init = workerData as MemberInit;
const cancel = new Int32Array(init.cancel);
/** Whether the pool asked that job `id` stop (either slot: see MemberInit.cancel). */
const stopAsked = (id: number) => Atomics.load(cancel, 0) === id || Atomics.load(cancel, 1) === id;
/** The running job's start, sent with each of its messages (see FromMember's startedAt). */
let startedAt = 0;
const post = (m: FromMember, transfer: ArrayBuffer[] = []) => port.postMessage(m, transfer);

let pre: Preprocessor;
try {
  useSeed(init.seed);
  // A replacement is lowered (at a nice above 0) at once: its loading and warm-up, seconds of CPU, then take no
  // core from the answers.
  if (init.serving) setThreadPriority(init.nice);
  pre = createPreprocessor(init.preprocessor, init.files && adoptTokenizerFiles(init.files));
  // Ready only once warm: a cold member answers its first requests past the budget.
  const warm = warmUp(pre);
  Bun.gc(true);
  // At the start, lowered only now: the process serves nothing before its members are ready, and meanwhile its main
  // thread (loading and compiling its modules, seconds of CPU) would hold a low-priority warm-up back for as long.
  // The short slice only now in either case: with it, seconds of warm-up would preempt the answers at every wake-up.
  const priority = setThreadPriority(init.nice, init.sliceUs);
  post({ type: "ready", warmUp: warm, priority });
} catch (err) {
  post({ type: "init-failed", message: (err as Error).message });
  process.exit(1);
}

// Microseconds per unknown character, learned from this member's own work (start: ~4 chars a token at
// ~1 µs a token, a slow start on purpose).
let usPerChar = 0.25;
// Characters per token of the text past a job's known prefix, likewise learned (start: English prose), to
// tell a prompt's length before its rest is tokenized; from at least LEARN_MIN_TOKENS tokenized.
let charsPerToken = 4;
const LEARN_MIN_TOKENS = 256;

/** The rewrite rules a body job with `rules` is read with: the pool's last "rules" message. */
let rules: RewriteRules | undefined;

port.on("message", (m: ToMember) => {
  if (m.type === "rules") {
    rules = m.rules;
    return;
  }
  if (m.type === "messages-modes") {
    adoptMessagesModes(pre, m.modes);
    return;
  }
  if (m.type === "reset") {
    pre.resetCache();
    stopped = null;
    return post({ type: "reset", cache: pre.cacheStats() });
  }
  const t0 = performance.now();
  startedAt = performance.timeOrigin + t0;
  const before = pre.cacheStats();
  reading = null;
  const kept = stopped;
  // Kept until the next warm starts (this one, if it is the resume).
  if (m.type === "resume" || m.discard) stopped = null;
  const run: Run = m.type === "resume" ? { id: m.id, discard: true } : m;
  // Whatever a job throws (a bad body, a template's refusal, a bug) is answered as an error: a member
  // never dies of a request.
  try {
    if (m.type === "resume") return resume(run, kept, t0, before);
    const job = jobOf(m);
    if (job === NO_REPLY) done(m, NONE, before, performance.now() - t0, true);
    else if (job instanceof Uint32Array) done(m, job, before, performance.now() - t0);
    else tokenize(m, job, t0, before);
  } catch (err) {
    failed(run, err, t0, before);
  }
});

/**
 * What the last job stopped midway left for its resume: the pool resumes a stopped job as a warm of the same id (a
 * warm preempted by a request, or a request's rest once answered), which goes on from there. Stopped in its walk,
 * its text and where it stopped; stopped once read, before its render, the job it read. Reading its body and
 * rendering it again, then finding each finished piece in the cache, cost about as much as tokenizing it fresh
 * (measured once on a 0.9 MB chat: 14-31 ms, against 26 fresh), and a warm preempted again and again would pay that
 * each time; one stopped after each read, under requests coming faster than it reads, would never get past it.
 * Kept until the next warm starts or another job's stop replaces it (one at most, MAX_KEPT_CHARS), which the pool
 * follows (the "stopped" message's `kept`): it sends a resume only while this is kept. A replacement member starts
 * without it.
 */
let stopped: { id: number; text: string; at: number } | { id: number; job: TokenizeJob } | null = null;
/** The longest stopped text (or read job's text) kept for its resume: 8 MiB as UTF-16 (a 0.9 MB chat renders to ~0.9 M characters). */
const MAX_KEPT_CHARS = 4 << 20;

function resume(run: Run, from: typeof stopped, t0: number, before: CacheStats): void {
  // The pool resumes only what it was told is kept (a bug otherwise: answered as the job's error).
  if (from?.id !== run.id) throw new Error(`job ${run.id} resumed, but its member keeps nothing of it`);
  if ("job" in from) return tokenize(run, from.job, t0, before);
  const control: EncodeControl = { shouldStop: () => stopAsked(run.id), warm: true, from: from.at };
  pre.encodeCompletion(from.text, { addSpecialTokens: false }, control);
  done(run, NONE, before, performance.now() - t0);
}

/** The current request's reading, until the job's first message back carries it (see BodyReading). */
let reading: BodyReading | null = null;

/** The reading to send with a message of the job, once: the message and the buffers it transfers. */
function withReading<T extends object>(msg: T, transfer: ArrayBuffer[] = []): [T & { read?: BodyReading }, ArrayBuffer[]] {
  if (reading === null) return [msg, transfer];
  const read = reading;
  reading = null;
  return [{ ...msg, read }, read.rewritten ? [...transfer, ...transferable(read.rewritten)] : transfer];
}

/**
 * What to tokenize: a body job is read here first (parsed, validated, its model rewritten), and a warm's reply
 * before it: a reply with nothing to warm with spares reading the body (NO_REPLY).
 */
function jobOf(m: JobMessage): TokenizeJob | Uint32Array {
  const job: PoolJob = m.job;
  if (job.kind !== "body") return job;
  const reply = job.reply === undefined ? undefined : readChatReply(job.reply);
  if (job.reply !== undefined && reply === undefined) return NO_REPLY;
  stopIfAsked(m);
  const read = readBody(m.rules && rules ? { ...job.request, rewriteRules: rules } : job.request, pre.rules);
  if (!m.discard) reading = read.rewritten ? { fields: read.fields, rewritten: read.rewritten } : { fields: read.fields };
  const out = !reply ? read.job : read.job instanceof Uint32Array || read.job.kind !== "chat" ? NONE : nextTurnJob(read.job, reply, pre) ?? NONE;
  // Reading is not stopped midway (a large body's takes milliseconds): a request that came meanwhile waits that
  // long, not for the render and the encode's first section too. Ids are done at once: nothing to stop.
  if (!(out instanceof Uint32Array)) stopIfAsked(m, out);
  return out;
}

/** A job stopped before its render: nothing walked; `job`, what it read, if it had (its resume tokenizes that). */
class StoppedUnwalked extends Error {
  constructor(readonly job?: TokenizeJob) {
    super("stopped before its render");
  }
}

function stopIfAsked(m: JobMessage, read?: TokenizeJob): void {
  if (stopAsked(m.id)) throw new StoppedUnwalked(read);
}

function tokenize(m: Run, job: TokenizeJob, t0: number, before: CacheStats): void {
  // The unknown rest at the first miss (-1: none yet), and whether this job tells its known ids as they grow.
  let unknownChars = -1;
  let telling = false;
  let firstKnown = 0;
  const turnChars = newTurnChars(job, pre.rules.responseRole);
  const control: EncodeControl = {
    shouldStop: () => stopAsked(m.id),
    warm: m.discard,
    knownPrefixMinChars: KNOWN_PREFIX_MIN_CHARS,
    knownPrefix: (known: KnownPrefix) => {
      if (unknownChars < 0) {
        unknownChars = known.unknownChars;
        firstKnown = known.tokens;
        // A chat cut at its first media part knows its cut only at the end.
        telling = !m.discard && known.unknownChars >= KNOWN_PREFIX_MIN_CHARS && !hasMedia(job);
      } else if (known.tokens - firstKnown >= LEARN_MIN_TOKENS) {
        // Measured on what it has tokenized so far: a job answered early is stopped before its end.
        charsPerToken = 0.8 * charsPerToken + 0.2 * ((unknownChars - known.unknownChars) / (known.tokens - firstKnown));
      }
      if (!telling) return;
      const added = ownIds(known.added);
      const estimatedTokens = known.tokens + Math.round(known.unknownChars / charsPerToken);
      const newTurnTokens = turnChars === undefined ? undefined : Math.round(turnChars / charsPerToken);
      post(...withReading({ type: "known" as const, id: m.id, startedAt, added, estimatedMs: (known.unknownChars * usPerChar) / 1000, estimatedTokens, newTurnTokens, busyMs: performance.now() - t0 }, [added.buffer as ArrayBuffer]));
    },
  };
  const ids = encodeJob(pre, job, control);
  const busyMs = performance.now() - t0;
  if (unknownChars >= KNOWN_PREFIX_MIN_CHARS) usPerChar = 0.8 * usPerChar + 0.2 * ((busyMs * 1000) / unknownChars);
  done(m, ids, before, busyMs);
}

// The cache's figures go back with every result: the pool sums its members' for the process's metrics.
function done(m: Run, ids: Uint32Array, before: CacheStats, busyMs: number, nothing = false): void {
  const cache = pre.cacheStats();
  const freshTokens = cache.freshTokens - before.freshTokens;
  const warmedTokens = cache.warmedHitTokens - before.warmedHitTokens;
  if (m.discard) post({ type: "done", id: m.id, startedAt, ids: null, freshTokens, warmedTokens, busyMs, cache, ...(nothing ? { nothing } : {}) });
  else {
    const own = ownIds(ids);
    post(...withReading({ type: "done" as const, id: m.id, startedAt, ids: own, freshTokens, warmedTokens, busyMs, cache }, [own.buffer as ArrayBuffer]));
  }
}

/**
 * Ids to transfer: the array itself when it has its buffer to itself (the segmenter's are: KnownPrefix), else a copy,
 * so that a transfer never detaches what something else holds (a cache's entry, a shared constant; an empty array
 * is copied too).
 */
function ownIds(ids: Uint32Array): Uint32Array {
  return ids.length > 0 && ids.byteOffset === 0 && ids.byteLength === ids.buffer.byteLength ? ids : ids.slice();
}

// A job stopped or failed midway tokenized (and cached) what it did before: those tokens count as its member's work.
function failed(m: Run, err: unknown, t0: number, before: CacheStats): void {
  const busyMs = performance.now() - t0;
  const cache = pre.cacheStats();
  const freshTokens = cache.freshTokens - before.freshTokens;
  if (err instanceof EncodeStopped || err instanceof StoppedUnwalked) {
    // Past the bound nothing is kept (the pool reads it again, if it resumes it at all): one kept that the pool never
    // resumes (its stream reset, its warm dropped) stays until the next warm, and must not be a body's worth of
    // megabytes. A stop with nothing to keep leaves the one kept before.
    // A job stopped before its walk began (a request posted behind another, then cancelled) keeps nothing in place of
    // what was kept before: a preempted warm's resume.
    const kept = err instanceof EncodeStopped
      ? err.text.length <= MAX_KEPT_CHARS && err.at > 0 ? { id: m.id, text: err.text, at: err.at } : null
      : err.job !== undefined && jobChars(err.job) <= MAX_KEPT_CHARS ? { id: m.id, job: err.job } : null;
    if (kept !== null) stopped = kept;
    return post({ type: "stopped", id: m.id, startedAt, busyMs, freshTokens, cache, kept: kept !== null });
  }
  const name = err instanceof TooDeep ? "TooDeep" : err instanceof BadRequest ? "BadRequest" : (err as Error)?.name ?? "Error";
  post({ type: "error", id: m.id, startedAt, name, message: (err as Error)?.message ?? String(err), busyMs, freshTokens, cache });
}

/** The buffer to transfer with a rewritten body: only one it has to itself (a view's neighbours stay put). */
function transferable(body: Uint8Array): ArrayBuffer[] {
  return body.byteOffset === 0 && body.byteLength === body.buffer.byteLength && body.buffer instanceof ArrayBuffer ? [body.buffer] : [];
}

const NONE = new Uint32Array(0);
/** A warm whose reply has nothing to warm with: told apart from NONE by identity, to be counted. */
const NO_REPLY = new Uint32Array(0);

function hasMedia(job: TokenizeJob): boolean {
  return job.kind === "chat" && job.cutAtMedia === true && job.messages.some((msg) => Array.isArray(msg.content) && msg.content.some(isMediaPart));
}
