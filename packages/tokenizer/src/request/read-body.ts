// A request body as received -> what a routing decision needs from it: its few fields, what to tokenize,
// and the body to forward. One function for both places a body is read: a tokenizer pool member (the
// default: the thread that decides does no tokenizing) and, without a pool, the event loop itself. A body of
// token ids has nothing to tokenize: readTokenIds reads one where it is (the EPP's event loop).
import type { ChatRules } from "../chat-rules";
import type { TokenizeJob, Unrendered } from "../job";
import { BadRequest } from "./bad-request";
import { rewriteBodyModel } from "./body-model";
import { parseBodyBytes, parseTokenIdsBody, TooDeep, type ParsedBody, type RoutedInput } from "./openai-body";
import { ruleTarget, type RewriteRules } from "./rewrite-rules";
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
  /**
   * The pool's InferenceModelRewrite rules, given likewise: a rule for the body's model wins over `rewriteModel`
   * (llm-d applies it after the header), and the body comes back naming its target.
   */
  rewriteRules?: RewriteRules;
  /** The body may be a prefix (BUFFERED_PARTIAL, cut at Envoy's buffer limit): one that does not parse is routed by load. */
  maybeCut?: boolean;
};

/** What a decision reads of a body: small, so that it crosses threads for nothing. */
export type BodyFields = Pick<ParsedBody, "model" | "cacheSalt" | "batchedPrompts" | "responses"> & {
  kind: RoutedInput["kind"];
  /** A maybe-cut body that did not parse (why): routed by load. */
  cut?: string;
  /**
   * The model the request is sent as, when a rule or `rewriteModel` names one: the one to score, and the one the
   * forwarded body names. "": the rule that applies has no targets (refused, as llm-d does, with nothing tokenized).
   */
  target?: string;
  /** The InferenceModelRewrite whose rule chose `target` (absent: the header's rewrite, or none). */
  rule?: string;
  /** A prompt not rendered here though vLLM may serve it (why; set by the parse or by the chat's encode): routed by load. */
  unrendered?: Unrendered;
  /**
   * A chat cut at the routing bound, or routed by load for being past it: its next turn is cut (or routed) the same
   * way, none to warm.
   */
  boundCut?: true;
};

export type BodyRead = {
  fields: BodyFields;
  /** What to tokenize for routing, or the ids already known. */
  job: TokenizeJob | Uint32Array;
  /** The body naming `fields.target`, when it named another model. */
  rewritten?: Uint8Array;
};

/**
 * Throws BadRequest (TooDeep for nesting past MAX_JSON_DEPTH) for a body the workers would refuse. `rules`: the
 * workers' engine's (its preprocessor's; vLLM's when absent). `random`: the draw a rule's weighted target is picked with.
 */
export function readBody(req: BodyRequest, rules?: ChatRules, random: () => number = Math.random): BodyRead {
  let parsed: ParsedBody;
  try {
    parsed = parseBodyBytes(req.body, req.path, rules);
  } catch (err) {
    if (!req.maybeCut || !(err instanceof BadRequest) || err instanceof TooDeep) throw err;
    return { fields: { kind: "none", cut: err.message }, job: new Uint32Array(0) };
  }
  return bodyRead(req, parsed, rules, random);
}

/**
 * The largest body the decision thread reads itself. Reading a chat costs ~7 ms per MiB: up to 1 MiB it reads one
 * no pool member has read by the budget (~7 ms at most, once per such pick) rather than wait; a larger body would
 * hold every other stream's answer that long, so it waits for its member instead, and only that pick is late.
 * Token ids cost ~1.5 ms per MiB (readTokenIds).
 */
export const DEFAULT_READ_HERE_MAX_BYTES = 1 << 20;

/**
 * readBody of a body that carries token ids (a `prompt` or `token_ids` array of numbers, read in WebAssembly at
 * ~1.4 ns a byte: ~70 µs for 8k ids); undefined, with next to nothing read (a search for the key), for any other
 * body or one over `maxBytes`. No tokenizer is involved, so the thread that decides reads such a body itself
 * rather than hand it to a pool member (the EPP's README has the measurement). A body that passes the
 * search but is not one (a nested `"prompt": [1`) costs one failed scan, at most what a real one would.
 */
export function readTokenIds(req: BodyRequest, maxBytes = DEFAULT_READ_HERE_MAX_BYTES): (BodyRead & { job: Uint32Array }) | undefined {
  if (req.body.length > maxBytes) return undefined;
  const parsed = parseTokenIdsBody(req.body);
  if (parsed?.input.kind !== "tokens") return undefined;
  return { ...bodyRead(req, parsed), job: parsed.input.tokens };
}

function bodyRead(req: BodyRequest, { model, cacheSalt, batchedPrompts, input, unrendered, responses }: ParsedBody, rules?: ChatRules, random: () => number = Math.random): BodyRead {
  const fields: BodyFields = { model, cacheSalt, batchedPrompts, kind: input.kind, ...(unrendered ? { unrendered } : {}), ...(responses ? { responses } : {}) };
  const ruled = req.rewriteRules && ruleTarget(req.rewriteRules, model, random);
  if (ruled?.target === "") return { fields: { ...fields, target: "", rule: ruled.rewrite }, job: new Uint32Array(0) };
  const target = ruled?.target ?? req.rewriteModel;
  if (target !== undefined) fields.target = target;
  if (ruled) fields.rule = ruled.rewrite;
  const job = routingJob(input, rules);
  // A chat the encode cannot render here says so in these fields, which go back with its ids (see RenderVerdict).
  if (!(job instanceof Uint32Array) && job.kind === "chat") {
    job.verdict = fields;
    if (job.cut !== undefined) fields.boundCut = true;
  } else if (input.kind === "chat") fields.boundCut = true; // past the bound whole (tools, documents, a kept tail): by load
  const rewrite = target !== undefined && target !== model && req.body.length > 0;
  return { fields, job, ...(rewrite ? { rewritten: rewriteBodyModel(req.body, target) } : {}) };
}
