// Request input -> token ids, the way the model server will see them (so block hashes line up with
// the KV events it publishes). Text goes through the shared preprocessor (HF tokenizer + chat
// template, or the byte-level fallback shared with the mock worker). A request body (ext_proc's, /select's,
// /score's) is read where it is tokenized: in a tokenizer pool member by default (on a copy, or on the bytes a body
// sent in chunks was joined into, shared), so the event loop receives it, copies it once and picks; it reads one
// itself only when no member has by the budget, or when the body carries token ids (nothing to tokenize: reading
// them costs what handing the body to a member would).
import {
  BadRequest, ChatTemplateError, encodeJob, glanceBody, readBody, readTokenIds,
  type BodyFields, type BodyRead, type BodyRequest, type FallbackCause, type Preprocessor, type TokenizeJob, type TokenizeOutcome,
  type TokenizerPool,
} from "@kv-epp/tokenizer";

/** A request body read for routing. */
export type RoutedBody = {
  fields: BodyFields;
  tokens: Uint32Array;
  /**
   * When `tokens` is only the known prefix of a text over the tokenization budget: the whole prompt's length,
   * estimated (routing charges the request for its size, and matches the prefix).
   */
  promptTokens?: number;
  /** With `promptTokens`, of a chat: its last turn's length, estimated (PickRequest.newTurnTokens). */
  newTurnTokens?: number;
  /** The body to forward: as received, or naming the request's rewrite model (`rewritten`). */
  body: Uint8Array;
  rewritten: boolean;
  /** How it was read and tokenized, and how long that took (the slow-pick log's breakdown); absent when unread. */
  trace?: ReadTrace;
};

/**
 * Where a body's reading and tokenization went. `outcome`: all its tokens known (`complete`), routed on a known
 * prefix that settled the pick (`settled`), or on the prefix known when its member could not be done in budget
 * (`budget`: the budget ran out, its member predicted it would, or its member was lost; `queue`: no member had
 * taken it by the budget).
 */
export type ReadTrace = {
  thread: ReadThread;
  outcome: "complete" | "settled" | "budget" | "queue";
  /** From handing the body over to its tokens: reading and tokenizing, with any wait. */
  ms: number;
  /** In the pool: queued before a member took it. */
  waitMs?: number;
  /**
   * In the pool, complete or settled: the member's time on it (wall time on its thread, so a preemption counts), to
   * its last tokens or to the prefix that settled it; the rest of `ms` is the wait and the way there and back.
   */
  busyMs?: number;
  /** Tokens the segment cache did not hold (unknown on a fallback). */
  freshTokens?: number;
};

/**
 * The thread that read a body: the event loop without a pool, for a body of token ids, or when no member had read
 * it by the budget. `unread`: a body over the pool's readHereMaxBytes that no member read (none was live: starting,
 * or being replaced), which no thread reads: routed by load on its `model` alone (glanceBody).
 */
export type ReadThread = "tokenizer_pool" | "event_loop" | "unread";

/** Told of every body read (refused ones too), and where; for an `unread` one, the pool's fallback that left it so. */
export type OnRead = (thread: ReadThread, unread?: FallbackCause) => void;

/**
 * Reads a request body (readBody: parse, validate, rewrite the model) and tokenizes it. Throws or rejects
 * with BadRequest (TooDeep for nesting) for a body the model server would refuse. The returned `body` is the
 * one to forward (`req.body`, or a copy naming the rewrite model).
 */
export type TokenizeBody = (req: BodyRequest, signal?: AbortSignal, settles?: Settles) => RoutedBody | Promise<RoutedBody>;

/**
 * Whether a known prefix of the body's tokens settles the pick already (the picker's `settles`, in the identity
 * the body's fields name, charged as the whole prompt's estimated length): then the pool answers with that
 * prefix and its member stops there.
 */
export type Settles = (fields: BodyFields, known: Uint32Array, promptTokens: number | undefined) => boolean;

/**
 * On the calling thread: the same functions a pool member runs (readBody, routingJob, encodeJob). `onRead`:
 * told of every body read, refused ones too, and on which thread.
 */
export function createTokenizeBody(pre: Preprocessor, onRead: OnRead = () => {}): (req: BodyRequest) => RoutedBody {
  return (req) => {
    const t0 = performance.now();
    onRead("event_loop");
    const read = readBody(req, pre.rules);
    const tokens = encodeRouting(pre, read.job);
    return { ...forwarded(req, read), fields: read.fields, tokens, trace: readHere(t0) };
  };
}

/**
 * The body goes to a pool member (a copy, or its bytes themselves in shared memory: joinBody), which reads and
 * tokenizes it. A body no member had read by the budget (queued, or still being read) is read here, to route it on
 * the ids it carries or by load; never one over the pool's readHereMaxBytes (~7 ms of reading a MiB, every stream
 * waiting), which the pool leaves unread only when no member is live: glanceBody finds its model without parsing
 * it, and it is routed by load. A body of token ids (up to the pool's readHereMaxBytes) is read here at once:
 * handing it to a member cost the event loop
 * about what reading it does, and its pick waited for the member (the README's ext_proc section, "Bodies and tokenization off the decision thread").
 */
export function createPoolTokenizeBody(pool: TokenizerPool, onRead: OnRead = () => {}): TokenizeBody {
  return (req, signal, settles) => {
    const t0 = performance.now();
    const ids = readTokenIds(req, pool.readHereMaxBytes);
    if (ids) {
      onRead("event_loop");
      return { ...forwarded(req, ids), fields: ids.fields, tokens: ids.job, trace: readHere(t0) };
    }
    return pool.tokenize({ kind: "body", request: req }, {
      signal,
      decides: settles && ((known, read, estimated) => read !== undefined && settles(read.fields, known, estimated)),
    }).then(
      (o): RoutedBody => {
        if (o.read) {
          onRead("tokenizer_pool");
          const rewritten = o.read.rewritten;
          const trace = traceOf(o, "tokenizer_pool", t0);
          return { fields: o.read.fields, tokens: o.tokens, body: rewritten ?? req.body, rewritten: rewritten !== undefined, trace, ...estimated(o) };
        }
        if (req.body.length > pool.readHereMaxBytes) {
          // Answered unread though too large to read here (no member was live to read it): routed by load on its
          // model, which a walk finds without parsing the body, and forwarded naming its rewrite target.
          onRead("unread", o.fallback);
          const glanced = glanceBody(req);
          return { ...forwarded(req, glanced), fields: glanced.fields, tokens: o.tokens, trace: traceOf(o, "unread", t0), ...estimated(o) };
        }
        onRead("event_loop");
        const read = readBody(req, pool.rules);
        const trace = traceOf(o, "event_loop", t0);
        // Ids the body carries are known now; text is routed on what the pool knew (nothing: by load).
        if (read.job instanceof Uint32Array) return { ...forwarded(req, read), fields: read.fields, tokens: read.job, trace };
        return { ...forwarded(req, read), fields: read.fields, tokens: o.tokens, trace, ...estimated(o) };
      },
      (err) => {
        // Refused by the member that read it.
        if (err instanceof BadRequest || err instanceof ChatTemplateError) onRead("tokenizer_pool");
        return Promise.reject(asBadRequest(err));
      },
    );
  };
}

/**
 * After a chat completion's response: a pool member reads the reply from the response body, reads the request body
 * again and tokenizes the next turn's shape in the background. `maxBodyBytes`: the largest request body the pool
 * warms (TokenizerPool.warm): a larger one is not worth keeping until its response ends.
 */
export type ReplyWarm = { maxBodyBytes: number; warm: (request: BodyRequest, responseBody: Uint8Array) => void };

export function createPoolWarm(pool: TokenizerPool): ReplyWarm {
  return { maxBodyBytes: pool.readHereMaxBytes, warm: (request, reply) => pool.warm({ kind: "body", request, reply }) };
}

/** A body read and tokenized (or carrying its ids) on the event loop, whole. */
const readHere = (t0: number): ReadTrace => ({ thread: "event_loop", outcome: "complete", ms: performance.now() - t0 });

function traceOf(o: TokenizeOutcome, thread: ReadThread, t0: number): ReadTrace {
  const outcome = o.complete ? "complete" : o.decided ? "settled" : o.fallback!;
  return {
    thread, outcome, ms: performance.now() - t0, waitMs: o.waitMs,
    ...(o.busyMs !== undefined ? { busyMs: o.busyMs } : {}),
    ...(o.complete ? { freshTokens: o.freshTokens } : {}),
  };
}

const estimated = (o: TokenizeOutcome): Pick<RoutedBody, "promptTokens" | "newTurnTokens"> =>
  o.complete ? {} : { promptTokens: o.promptTokens, newTurnTokens: o.newTurnTokens };

function forwarded(req: BodyRequest, read: BodyRead): Pick<RoutedBody, "body" | "rewritten"> {
  return { body: read.rewritten ?? req.body, rewritten: read.rewritten !== undefined };
}

function encodeRouting(pre: Preprocessor, job: TokenizeJob | Uint32Array): Uint32Array {
  if (job instanceof Uint32Array) return job;
  try {
    return encodeJob(pre, job);
  } catch (err) {
    throw asBadRequest(err);
  }
}

/** The conversation cannot be rendered as the model server would (it answers 400 too). */
function asBadRequest(err: unknown): unknown {
  return err instanceof ChatTemplateError ? new BadRequest(err.message) : err;
}
