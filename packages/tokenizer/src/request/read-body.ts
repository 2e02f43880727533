// A request body as received -> what a routing decision needs from it: its few fields, what to tokenize,
// and the body to forward. One function for both places a body is read: a tokenizer pool member (the
// default: the thread that decides never does work that grows with the body) and, without a pool, the
// event loop itself.
import type { TokenizeJob } from "../job";
import { BadRequest } from "./bad-request";
import { rewriteBodyModel } from "./body-model";
import { parseBodyBytes, parseTokenIdsBody, TooDeep, type ParsedBody, type RoutedInput } from "./openai-body";
import { routingJob } from "./routing-job";

export type BodyRequest = {
  /** The whole body (BUFFERED_PARTIAL: maybe its start). */
  body: Uint8Array;
  /** The request's :path, when known: it tells a /v1/responses body from an embeddings one. */
  path?: string;
  /**
   * x-gateway-model-name-rewrite, given when the body is forwarded by the reader's caller: a body naming
   * another model comes back rewritten to name this one (rewriteBodyModel).
   */
  rewriteModel?: string;
  /** The body may be a prefix (BUFFERED_PARTIAL, cut at Envoy's buffer limit): one that does not parse is routed by load. */
  maybeCut?: boolean;
};

/** What a decision reads of a body: small, so that it crosses threads for nothing. */
export type BodyFields = Pick<ParsedBody, "model" | "cacheSalt" | "batchedPrompts"> & {
  kind: RoutedInput["kind"];
  /** A maybe-cut body that did not parse (why): routed by load. */
  cut?: string;
};

export type BodyRead = {
  fields: BodyFields;
  /** What to tokenize for routing, or the ids already known. */
  job: TokenizeJob | Uint32Array;
  /** The body naming `rewriteModel`, when it named another model. */
  rewritten?: Uint8Array;
};

/** Throws BadRequest (TooDeep for nesting past MAX_JSON_DEPTH) for a body vLLM would refuse. */
export function readBody(req: BodyRequest): BodyRead {
  let parsed: ParsedBody;
  try {
    parsed = parseBodyBytes(req.body, req.path);
  } catch (err) {
    if (!req.maybeCut || !(err instanceof BadRequest) || err instanceof TooDeep) throw err;
    return { fields: { kind: "none", cut: err.message }, job: new Uint32Array(0) };
  }
  return bodyRead(req, parsed);
}

/**
 * Bodies up to this size carrying token ids are read by readTokenIds (~70 µs for 8k ids, ~1.4 ns a byte, at most
 * ~1.5 ms): what a pool member would cost its caller anyway, in copying the body and taking its answer.
 */
export const READ_IDS_MAX_BYTES = 1 << 20;

/**
 * readBody of a body that carries token ids (a `prompt` or `token_ids` array of numbers, read in WebAssembly);
 * undefined, with next to nothing read, for any other body or one over READ_IDS_MAX_BYTES. No tokenizer is
 * involved, so the thread that decides can read such a body itself rather than hand it to a pool member.
 */
export function readTokenIds(req: BodyRequest): (BodyRead & { job: Uint32Array }) | undefined {
  if (req.body.length > READ_IDS_MAX_BYTES) return undefined;
  const parsed = parseTokenIdsBody(req.body);
  if (parsed?.input.kind !== "tokens") return undefined;
  return { ...bodyRead(req, parsed), job: parsed.input.tokens };
}

function bodyRead(req: BodyRequest, { model, cacheSalt, batchedPrompts, input }: ParsedBody): BodyRead {
  const fields: BodyFields = { model, cacheSalt, batchedPrompts, kind: input.kind };
  const rewrite = req.rewriteModel !== undefined && req.rewriteModel !== model && req.body.length > 0;
  return { fields, job: routingJob(input), ...(rewrite ? { rewritten: rewriteBodyModel(req.body, req.rewriteModel!) } : {}) };
}
