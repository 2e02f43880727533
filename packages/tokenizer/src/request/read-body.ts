// A request body as received -> what a routing decision needs from it: its few fields, what to tokenize,
// and the body to forward. One function for both places a body is read: a tokenizer pool member (the
// default: the thread that decides does no tokenizing) and, without a pool, the event loop itself. A body of
// token ids has nothing to tokenize: readTokenIds reads one where it is (the EPP's event loop).
import type { ChatRules } from "../chat-rules";
import type { TokenizeJob, Unrendered } from "../job";
import { BadRequest } from "./bad-request";
import { rewriteBodyModel } from "./body-model";
import { modelMembers, type Span } from "./model-members";
import { jsonString, parseBodyBytes, parseTokenIdsBody, TooDeep, type ParsedBody, type RoutedInput } from "./openai-body";
import { ruleTarget, type RewriteRules } from "./rewrite-rules";
import { routingJob } from "./routing-job";

export type BodyRequest = {
  /** The whole body (BUFFERED_PARTIAL: maybe its start). */
  body: Uint8Array;
  /** The request's :path, when known: it tells a /v1/responses body from an embeddings one, a /v1/messages body from a chat's. */
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
export type BodyFields = Pick<ParsedBody, "model" | "cacheSalt" | "loraPath" | "namespaced" | "batchedPrompts" | "responses" | "stream"> & {
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

/**
 * A body too large for the caller's thread to read (over the pool's readHereMaxBytes) that no pool member read: what
 * routing by load needs of it, without parsing it. Its top-level `model` (the last one, as Python's json reads a key
 * given twice) is found by modelMembers, linear at a byte search's pace (~0.2-2 ns a byte), then the rewrite rules
 * and header apply as readBody applies them, and the forwarded body names the target (spliced, never re-serialised).
 * Its other fields (`cache_salt`, the batch, SGLang's `lora_path` and `extra_key`) are not read: with no tokens there
 * is no prefix to match. A maybe-cut body the walk rejects is `cut`; any other it rejects is refused, as a member
 * reading it would refuse it. A body the walk accepts is not validated: the model server refuses it if it is not JSON.
 */
export function glanceBody(req: BodyRequest, random: () => number = Math.random): BodyRead {
  const found = modelMembers(req.body);
  if (!found) {
    if (req.maybeCut) return { fields: { kind: "none", cut: "the body is not a whole JSON object" }, job: new Uint32Array(0) };
    throw new BadRequest("request body must be a JSON object");
  }
  const model = lastModel(req.body, found.values);
  const { fields, target } = targeted(req, { model, kind: "none" }, random);
  return { fields, job: new Uint32Array(0), ...rewritten(req, model, target, found) };
}

/** The value of the last `model` member (Python's json keeps the last of a key given twice). */
function lastModel(body: Uint8Array, values: readonly Span[]): string | undefined {
  const last = values.at(-1);
  if (last === undefined) return undefined;
  if (body[last.start] !== 0x22) throw new BadRequest("model must be a string");
  try {
    return jsonString(body, last.start, last.end);
  } catch (err) {
    throw new BadRequest(`request body is not JSON: ${(err as Error).message}`);
  }
}

function bodyRead(req: BodyRequest, { model, cacheSalt, batchedPrompts, input, unrendered, responses, stream, loraPath, namespaced }: ParsedBody, rules?: ChatRules, random: () => number = Math.random): BodyRead {
  const optional = {
    ...(unrendered ? { unrendered } : {}), ...(responses ? { responses } : {}), ...(stream ? { stream } : {}),
    ...(loraPath ? { loraPath } : {}), ...(namespaced ? { namespaced } : {}),
  };
  const { fields, target } = targeted(req, { model, cacheSalt, batchedPrompts, kind: input.kind, ...optional }, random);
  if (fields.target === "") return { fields, job: new Uint32Array(0) };
  const job = routingJob(input, rules);
  // A chat the encode cannot render here says so in these fields, which go back with its ids (see RenderVerdict).
  if (!(job instanceof Uint32Array) && job.kind === "chat") {
    job.verdict = fields;
    if (job.cut !== undefined) fields.boundCut = true;
  } else if (input.kind === "chat") fields.boundCut = true; // past the bound whole (tools, documents, a kept tail): by load
  return { fields, job, ...rewritten(req, model, target) };
}

/** The model the request is sent as: a rule for the body's model wins over the header (`target` "": a rule without targets). */
function targeted(req: BodyRequest, fields: BodyFields, random: () => number): { fields: BodyFields; target?: string } {
  const ruled = req.rewriteRules && ruleTarget(req.rewriteRules, fields.model, random);
  if (ruled?.target === "") return { fields: { ...fields, target: "", rule: ruled.rewrite } };
  const target = ruled?.target ?? req.rewriteModel;
  if (target !== undefined) fields.target = target;
  if (ruled) fields.rule = ruled.rewrite;
  return { fields, target };
}

function rewritten(req: BodyRequest, model: string | undefined, target: string | undefined, found?: ReturnType<typeof modelMembers>): Pick<BodyRead, "rewritten"> {
  const rewrite = target !== undefined && target !== model && req.body.length > 0;
  return rewrite ? { rewritten: rewriteBodyModel(req.body, target, found) } : {};
}
