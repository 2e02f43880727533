// ext_proc ExternalProcessor.Process: one gRPC stream per HTTP request (a new request_headers on the
// same stream starts a new request). This is the protocol's state machine alone: request headers + body
// -> a RoutedRequest (routing's: the decision, its lease, its response watch); the response's headers,
// body and end, or the stream breaking, drive that RoutedRequest to its end.
import type { Logger } from "pino";
import { throttledWarn } from "../log-throttle.ts";
import type { BodyMode } from "../config.ts";
import type { Metrics, RequestOutcome } from "../metrics.ts";
import { EXPLAIN_REQUEST_HEADER, EXPLANATION_HEADER, RoutedRequest, type Routing, type RoutingContext } from "@kv-epp/routing";
import type { ReplyWarm, RoutedBody, Settles, TokenizeBody } from "../tokens.ts";
import type { BodyBudget } from "./body-budget.ts";
import { BoundedLabels, DEFAULT_FAIRNESS_ID, hasCriticalObjective, requestClass, shedReason, type RequestClass } from "./gaie-headers.ts";
import { RequestFigures, type ClientLabels } from "./request-figures.ts";
import { GrpcStatus, type BidiCall, type StatusCode } from "./grpc-h2.ts";
import { BadRequest, joinBody, MAX_BODY_BYTES, TooDeep, type BodyFields, type BodyRequest, type RewriteRules } from "@kv-epp/tokenizer";
import { apiOfPath, PREFILL_RANK_HEADER, PREFILLER_HOST_PORT_HEADER, splitPath } from "@kv-epp/protocol";
import { echo, steering } from "./conformance.ts";
import { modelRewrite, type ResponseModelName, type RewriteOutcome } from "./model-rewrite.ts";
import { ReplyCapture } from "./reply-capture.ts";
import { streamModes, type StreamModes } from "./assumed-modes.ts";
import {
  type BodySendMode,
  continueResponse,
  findHeader,
  replacedBody,
  immediate,
  continueRequestHeaders,
  routedBody,
  routedTrailers,
  responseHeadersWith,
  routedHeaders,
  streamedBody,
  servedEndpoint,
  SERVED_KEY,
  subsetHint,
  type ImmediateStatus,
  type ProcessingRequest,
  type ProcessingResponse,
  type Route,
} from "./messages.ts";
import { scoredAs, unmatched } from "../indexers/sglang-adapter.ts";

export type ExtProcDeps = {
  /** The decision, its load and its calibration: each request is one RoutedRequest of it. */
  routing: RoutingContext;
  /** Reads and tokenizes a request body: in the tokenizer pool, or on this thread without one (tokens.ts). */
  tokenizeBody: TokenizeBody;
  /**
   * Answer a long text as soon as its known prefix settles the pick (its member stops there). A body in an SGLang
   * cache namespace (`sglangBodies`, an `extra_key`) is answered once its fields are read, whatever this says.
   */
  routeOnSettledPrefix?: boolean;
  metrics: Metrics;
  log: Logger;
  /** The filter's body modes for streams without protocol_config (--body-mode, --response-body-mode; default auto). */
  bodyMode: BodyMode;
  responseBodyMode?: BodyMode;
  /** Shed (429) when this many requests are in flight (0: never). */
  maxInflight: number;
  maxBodyBytes?: number;
  /**
   * Request-body bytes all streams together may hold (--ext-proc-buffer-max-bytes): bodies waiting for their
   * route, and within a share of it, chats' bodies and replies kept for reply warming.
   */
  bodyBudget: BodyBudget;
  /** Explain every decision, not only those asking with x-kv-epp-explain: 1. */
  explainAll?: boolean;
  /** InferenceObjective name -> priority (x-gateway-inference-objective), as it is now: watched objectives change it. */
  priorities?: () => ReadonlyMap<string, number>;
  /** The pool's InferenceModelRewrite rules (undefined: none), read per request: the watch replaces them. */
  rewriteRules?: () => RewriteRules | undefined;
  /** The model names those rules match and rewrite to (the same array until they change): never "other" as labels. */
  rewriteModelNames?: () => readonly string[];
  /** The served model and its LoRA adapters: never "other" as labels. */
  servedModels?: readonly string[];
  /** Model names labelled as themselves before the rest are "other" (default MODEL_LABELS_MAX). */
  modelLabelsMax?: number;
  /** Every worker is over --queue-threshold (saturated: sheddable requests get 429). */
  queuesFull?: () => boolean;
  /** Next-best distinct endpoints sent after the pick, for the gateway's retries (0: none). */
  fallbacks?: number;
  /** Each scored endpoint's score in the route's metadata (llm-d's --emit-endpoint-scores). */
  emitEndpointScores?: boolean;
  /** GAIE conformance-suite hooks (conformance.ts): steering header and served/selected echo. */
  conformanceHooks?: boolean;
  /** A chat completion's response ended: warm the conversation's next turn from its request and response bodies (the tokenizer pool). */
  warmReply?: ReplyWarm;
  /** The workers are SGLang's: a body's `lora_path` and `extra_key` (BodyFields `loraPath`, `namespaced`) count as SGLang counts them. */
  sglangBodies?: boolean;
  /** A pick taking this long (complete body -> decision) is logged with where its time went (0: never). */
  slowPickMs?: number;
};

/** What one ext_proc server's streams share. */
type Shared = {
  warned: Set<string>;
  labels: ClientLabels;
  /** The rewrite rules' model names last pinned in labels.models. */
  pinnedRewriteNames?: readonly string[];
  /** Rejected streams, logged at most once per reason per interval (a client may send them in a loop). */
  warnRejected: (reason: string, fields?: Record<string, unknown>) => void;
  /** Bodies routed by load because the body budget was spent: logged at most once per interval (it comes in bursts). */
  warnOverflow: (reason: string, fields?: Record<string, unknown>) => void;
  /** Picks over slowPickMs: at most one line per outcome per interval, with where the time went. */
  warnSlowPick: (outcome: string, fields?: Record<string, unknown>) => void;
  /** Chats the template engine here fails on or stops at its bound (every one of a kind does): one line per cause per interval. */
  warnUnrenderable: (reason: string, fields?: Record<string, unknown>) => void;
};

type Duplex = BidiCall<ProcessingRequest, ProcessingResponse>;

/** Per-HTTP-request state on a stream. */
type RequestState = {
  /** The request's :path, when Envoy sends it. */
  path?: string;
  subset: Set<string> | undefined;
  /** Steered by the conformance selection header, which wins over later subset hints. */
  steered?: boolean;
  /** The body's chunks so far, joined once into the body (joinBody: a tokenizer pool member reads it as it is). */
  chunks: Uint8Array[];
  bytes: number;
  /** Bytes of its body taken from deps.bodyBudget: given back once, when the body is handed back or dropped. */
  budgeted: number;
  /** Asked why this worker: the decision's explanation goes on the routed request and the response. */
  explain: boolean;
  /** A decision was sent (or an immediate response): later request messages are not expected. */
  decided: boolean;
  /** GAIE headers: model rewrite, priority, fairness id. */
  cls: RequestClass;
  /** Its routing life, once routed. */
  routed?: RoutedRequest;
  figures: RequestFigures;
  /** A response_body message came for it (the gateway sends response bodies). */
  responseBody: boolean;
  /** The request has no body (its headers ended the stream, or trailers came with none): nothing to rewrite. */
  bodyless?: boolean;
  /** Model rewrite: maps the served model's name back to the client's in the response body. */
  responseModel?: ResponseModelName;
  /** The response headers carry a content-length (a replaced BUFFERED body sets the new one). */
  responseLength?: boolean;
  /**
   * Aborts its tokenization in the pool when the request ends first; dropped once the tokenization settles, when
   * there is nothing left to abort (an abort() makes its AbortError, stack and all, for no one).
   */
  tokenizing?: AbortController;
  /** A routed chat: its body and its reply as it streams back, to warm the next turn. */
  reply?: { request: BodyRequest; capture: ReplyCapture };
  /** Bytes of `reply` (body and reply so far) kept in deps.bodyBudget: given back once, when the request ends. */
  kept: number;
};

/**
 * Streamed body chunks handed back: Envoy asks for chunks "no greater than 64K" and some data planes
 * cap a chunk at 64 KiB on the wire (64 KiB of body is 65,558 B there), so GAIE's 62,000 B
 * (pkg/common/envoy/chunking.go) is used too.
 */
export const STREAM_CHUNK = 62_000;

/** A warning that would otherwise come with every stream: warn the first time, debug after. */
function warnOnce(warned: Set<string>, log: Logger, key: string, fields: object, msg: string): void {
  if (warned.has(key)) return log.debug(fields, msg);
  warned.add(key);
  log.warn(fields, msg);
}

/** Model names are client input too: bounded at 1000 values, as llm-d bounds them. */
const MODEL_LABELS_MAX = 1000;

export function createProcessHandler(deps: ExtProcDeps): (call: Duplex) => void {
  // per server: per process as deployed
  const labels = { fairness: new BoundedLabels(), models: new BoundedLabels(deps.modelLabelsMax ?? MODEL_LABELS_MAX, 256) };
  labels.models.pin(deps.servedModels ?? []);
  const shared: Shared = { warned: new Set(), labels, warnRejected: throttledWarn(deps.log, "ext_proc stream rejected"),
    warnOverflow: throttledWarn(deps.log, "ext_proc body budget spent: bodies routed by load and passed through unbuffered"),
    warnSlowPick: throttledWarn(deps.log, "slow pick (over --slow-pick-ms): where its time went"),
    warnUnrenderable: throttledWarn(deps.log, "chat template not rendered in this process though it did not raise: routed by load, as vLLM may serve it"),
  };
  if (deps.conformanceHooks) deps.log.warn("GAIE conformance test hooks on (--conformance-test-hooks): any client can steer its requests with test-epp-endpoint-selection");
  return (call) => new ProcessStream(call, deps, shared).run();
}

class ProcessStream {
  private req: RequestState | undefined;
  /** The request body mode, from the first message's protocol_config (else --body-mode: assumed-modes.ts). */
  private mode: BodySendMode | undefined;
  private responseStreamed = false;
  /** Response bodies come through this stream (a response_body_mode other than NONE). */
  private responseBodies = true;
  /** Response body chunks come as the upstream sends them (STREAMED, FULL_DUPLEX_STREAMED). */
  private responseChunked = false;
  private observe = false;
  /** The stream is over (ended, reset or failed): nothing more is answered, and nothing it held is routed. */
  private closed = false;
  /** A request_headers has come on this stream. */
  private started = false;
  /** Messages that came while a decision waited for its tokens (null: none waits), with what each costs (heldCost). */
  private held: Held[] | null = null;
  /** What they cost, deferred in the body budget until they are handled. */
  private heldBytes = 0;
  /** The encoded length of the message being handled: what holding it would cost (heldCost). */
  private wireBytes = 0;
  /** The client half-closed while messages were held: ended once they are handled (a half-close is no reset). */
  private endHeld = false;

  private get fullDuplex(): boolean {
    return this.mode === "FULL_DUPLEX_STREAMED";
  }

  constructor(
    private readonly call: Duplex,
    private readonly deps: ExtProcDeps,
    private readonly shared: Shared,
  ) {}

  run(): void {
    this.call.on("data", (msg: ProcessingRequest, wireBytes: number) => {
      if (this.held === null) return this.handle(msg, wireBytes);
      this.hold(msg, wireBytes);
    });
    this.call.on("end", () => {
      if (this.held !== null) this.endHeld = true;
      else this.ended();
    });
    // A reset after a half-close: nothing is left to end.
    this.call.on("error", (err) => {
      this.deps.log.debug({ err: String(err) }, "ext_proc stream error");
      this.endHeld = false;
      this.closed = true;
      this.finish();
    });
    this.call.on("cancelled", () => {
      this.endHeld = false;
      this.closed = true;
      this.finish();
    });
  }

  /** The client sent all it will: every answer is out, so the stream ends. */
  private ended(): void {
    this.finish();
    if (!this.closed) {
      this.closed = true;
      this.call.end();
    }
  }

  private handle(msg: ProcessingRequest, wireBytes: number): void {
    this.wireBytes = wireBytes;
    try {
      this.onMessage(msg);
    } catch (err) {
      this.failed(err);
    }
  }

  /** Nothing in a message may take the stream down: log, count, answer 500 for this request. */
  private failed(err: unknown): void {
    this.deps.metrics.ioErrors.inc({ where: "ext_proc" });
    this.deps.log.error({ err: String(err) }, "ext_proc message failed");
    this.immediate(500, "internal error", "epp_error", "error");
  }

  /**
   * Tokenization in the pool (off this thread): the stream's later messages wait, in order, until the route
   * is answered, since ext_proc answers go in the order of the messages. Other streams go on meanwhile. A
   * stream reset first aborts the tokenization (finish); a half-close waits its turn behind the held messages.
   */
  private awaitTokens(pending: Promise<RoutedBody>, req: RequestState, route: (read: RoutedBody) => void): void {
    this.held = [];
    pending.then(
      (read) => {
        req.tokenizing = undefined;
        if (this.req === req) route(read);
      },
      (err: unknown) => {
        req.tokenizing = undefined;
        if (this.req !== req) return; // the stream ended: the tokenization was cancelled
        if (!this.refused(err)) this.failed(err);
      },
    ).catch((err: unknown) => this.failed(err)).finally(() => {
      // A stream reset or failed meanwhile: what it held would take load on a call nothing ends.
      const held = this.closed ? [] : (this.held ?? []);
      this.held = null;
      if (this.closed) this.giveHeldBytes();
      // Each message's cost is given back as it is handled: those held again below stay counted.
      for (let i = 0; i < held.length && !this.closed; i++) {
        const { msg, wireBytes, cost } = held[i]!;
        this.heldBytes -= cost;
        this.deps.bodyBudget.undefer(cost);
        this.handle(msg, wireBytes);
        const waiting = this.held as Held[] | null; // set again by a decision that now waits
        if (waiting !== null) {
          waiting.push(...held.slice(i + 1));
          break;
        }
      }
      if (this.held === null && this.endHeld) {
        this.endHeld = false;
        this.ended();
      }
    });
  }

  /**
   * Keeps a message that came while the route is pending, to answer in order once it is known. Envoy sends at
   * most the trailers then (or, in observability mode, a response's first chunks): a stream that keeps sending
   * would have this process hold all of it, so what is held is bounded in messages and, each one's cost
   * (heldCost) deferred in the body budget, in bytes.
   */
  private hold(msg: ProcessingRequest, wireBytes: number): void {
    const held = this.held!;
    if (held.length >= MAX_HELD) return this.reject("held_overflow", `more than ${MAX_HELD} messages while the route is pending`, GrpcStatus.RESOURCE_EXHAUSTED);
    const cost = heldCost(msg, wireBytes);
    if (!this.deps.bodyBudget.defer(cost))
      return this.reject("held_overflow", `a message of ${wireBytes} bytes sent while the route is pending: the body budget for such messages is spent`, GrpcStatus.RESOURCE_EXHAUSTED);
    this.heldBytes += cost;
    held.push({ msg, wireBytes, cost });
  }

  private giveHeldBytes(): void {
    this.deps.bodyBudget.undefer(this.heldBytes);
    this.heldBytes = 0;
  }

  /** Ends the stream with INVALID_ARGUMENT unless told (its request's load released), counted by reason. */
  private reject(reason: "no_request" | "unexpected" | "grpc_body_mode" | "held_overflow", message: string, code: StatusCode = GrpcStatus.INVALID_ARGUMENT): void {
    this.deps.metrics.extProcRejected.inc({ reason });
    if (reason === "grpc_body_mode") warnOnce(this.shared.warned, this.deps.log, reason, { reason, err: message }, "ext_proc stream rejected");
    else this.shared.warnRejected(reason, { err: message });
    this.closed = true;
    this.finish();
    this.call.fail(code, message);
  }

  private send(msg: ProcessingResponse): void {
    if (this.observe || this.closed) return;
    this.call.write(msg);
  }

  private onMessage(msg: ProcessingRequest): void {
    if (this.closed) return; // a held message after one that failed the stream
    // A message with no request case (the empty message, or a field number this proto does not know)
    // says nothing to act on: the stream is broken, not the process.
    if (msg.request === undefined) return this.reject("no_request", "ProcessingRequest without a request case");
    const outOfOrder = this.outOfOrder(msg);
    if (outOfOrder) return this.reject("unexpected", outOfOrder);
    if (this.mode === undefined) {
      const pc = msg.protocol_config;
      const modes = streamModes(pc, this.deps.bodyMode, this.deps.responseBodyMode ?? "auto");
      this.mode = modes.request;
      this.responseStreamed = modes.response === "FULL_DUPLEX_STREAMED";
      this.responseBodies = modes.response !== "NONE";
      // BUFFERED and BUFFERED_PARTIAL send the response body whole, at its end: no first token to time.
      this.responseChunked = this.responseStreamed || modes.response === "STREAMED";
      if (!pc) this.assumed(modes);
      // The body would come as gRPC messages to be answered one by one, not as the HTTP/JSON body
      // routing reads: refused at once, with the reason, instead of answers Envoy calls spurious.
      if (modes.request === "GRPC" || modes.response === "GRPC")
        return this.reject(
          "grpc_body_mode",
          "ext_proc body mode GRPC is not supported by this endpoint picker: set the filter's processing_mode request_body_mode to FULL_DUPLEX_STREAMED (or BUFFERED) and response_body_mode to NONE or FULL_DUPLEX_STREAMED",
          GrpcStatus.UNIMPLEMENTED,
        );
    }
    this.observe = msg.observability_mode === true;

    if (msg.request_headers) return this.onRequestHeaders(msg);
    // The subset hint may come on any request-path message (GAIE reads it with the body's end); the
    // latest one that carries it counts.
    if (this.req && !this.req.decided && !this.req.steered && (msg.request_body || msg.request_trailers)) {
      const hint = subsetHint(msg);
      if (hint) this.req.subset = hint;
    }
    if (msg.request_body) return this.onRequestBody(msg.request_body.body ?? EMPTY, msg.request_body.end_of_stream === true);
    if (msg.request_trailers) return this.onRequestTrailers(msg);
    if (msg.response_headers) {
      const status = findHeader(msg.response_headers.headers, ":status");
      if (status && status !== "200") this.deps.log.debug({ status }, "upstream answered non-200");
      this.req?.figures.responseHeaders(status, findHeader(msg.response_headers.headers, "content-type"));
      // An error's body holds no reply to warm with: told by its status, it keeps nothing and takes no warm's place.
      if (this.req?.reply && status !== undefined && !status.startsWith("2")) this.dropReply(this.req);
      this.req?.routed?.responseHeaders(findHeader(msg.response_headers.headers, "content-type"), this.responseChunked);
      if (this.req) this.req.responseLength = findHeader(msg.response_headers.headers, "content-length") !== undefined; // model rewrite
      this.served(servedEndpoint(msg) ?? findHeader(msg.response_headers.headers, SERVED_KEY));
      const explained = this.req?.routed?.explanation;
      const set: [string, string][] = explained ? [[EXPLANATION_HEADER, explained]] : [];
      if (this.deps.conformanceHooks) set.push(...echo(msg, this.req?.routed?.decision.chosen.candidate.endpoint)); // conformance.ts
      this.send(set.length > 0 ? responseHeadersWith(set) : continueResponse("response_headers"));
      if (msg.response_headers.end_of_stream) this.finish();
      return;
    }
    if (msg.response_body) {
      const body = msg.response_body.body ?? EMPTY;
      const eos = msg.response_body.end_of_stream === true;
      if (this.req) {
        this.req.responseBody = true;
        this.req.figures.responseBody(body.length, eos);
        this.req.routed?.responseBody(body);
      }
      // Model rewrite: the client's name back in the response (model-rewrite.ts). Full duplex may hold
      // a split field's start back for the next chunk; other modes answer each message with its own bytes.
      const out = this.req?.responseModel?.map(body, eos || !this.responseStreamed) ?? body;
      if (this.req?.reply) this.captureReply(this.req, this.req.reply, body);
      if (this.responseStreamed) this.send(streamedBody("response_body", out, eos));
      else this.send(out === body ? continueResponse("response_body") : replacedBody("response_body", out, !this.responseChunked && this.req?.responseLength ? out.length : undefined));
      if (eos) this.responseEnded();
      return;
    }
    if (msg.response_trailers) {
      const held = this.responseStreamed ? this.req?.responseModel?.release() : undefined; // model rewrite
      if (held && held.length > 0) this.send(streamedBody("response_body", held, false));
      this.send(continueResponse("response_trailers"));
      // An HTTP/2 upstream's response with trailers ends here, its body never marked as ended.
      this.responseEnded();
    }
  }

  /** Modes taken from the flags: said once, with the flags that name the filter's, while either is left to auto. */
  private assumed(modes: StreamModes): void {
    const { bodyMode, responseBodyMode = "auto" } = this.deps;
    const fields = { request: modes.request, response: modes.response, bodyMode, responseBodyMode };
    if (bodyMode !== "auto" && responseBodyMode !== "auto") return this.deps.log.debug(fields, "ext_proc stream without protocol_config: body modes from the flags");
    warnOnce(this.shared.warned, this.deps.log, "no_protocol_config", fields,
      `ext_proc streams carry no protocol_config (Envoy before 1.34, its observability mode, or another data plane): assuming request body mode ${modes.request} and response body mode ${modes.response} (--body-mode ${bodyMode}, --response-body-mode ${responseBodyMode}); unless the filter's processing_mode has these, set --body-mode and --response-body-mode to its request_body_mode and response_body_mode (none|streamed|buffered|buffered-partial|full-duplex)`);
  }

  /** The response is whole (its body's end, or its trailers): its reply is warmed, then the request ends. */
  private responseEnded(): void {
    const reply = this.req?.reply;
    // The member that warms reads the reply: the decision thread only joins its bytes.
    const responseBody = reply?.capture.body();
    if (reply && responseBody) this.deps.warmReply?.warm(reply.request, responseBody);
    // A count_tokens answer's input_tokens counts a prompt that ran nowhere: llm-d skips those responses too.
    const req = this.req;
    req?.figures.responseEnded(apiOfPath(req.path) === "/v1/messages/count_tokens" ? undefined : req.routed?.usage());
    this.finish();
  }

  /**
   * Why `msg` cannot come next on this stream, else undefined. Envoy sends a request's headers before
   * its body and trailers, and a new request's headers only once the previous request has its answer;
   * anything else would route on the wrong body or silently drop one.
   */
  private outOfOrder(msg: ProcessingRequest): string | undefined {
    if (msg.request_headers && this.req && !this.req.decided) return "request_headers while the previous request's body is awaited";
    if ((msg.request_body || msg.request_trailers) && !this.started) return `${msg.request} before any request_headers`;
    return undefined;
  }

  private onRequestHeaders(msg: ProcessingRequest): void {
    this.finish(); // a previous request on this stream is over
    this.started = true;
    const explain = this.deps.explainAll === true || findHeader(msg.request_headers!.headers, EXPLAIN_REQUEST_HEADER) === "1";
    const cls = requestClass(msg.request_headers!.headers, this.deps.priorities?.() ?? NO_PRIORITIES);
    this.deps.metrics.fairnessRequests.inc({ fairness_id: this.shared.labels.fairness.label(cls.fairnessId) });
    // Conformance hooks: the selection header steers the request instead of the subset hint (conformance.ts).
    const steered = this.deps.conformanceHooks ? steering(msg.request_headers!.headers, this.deps.routing.candidates().map((c) => c.endpoint)) : undefined;
    this.req = {
      subset: steered ? steered.subset : subsetHint(msg), steered: steered !== undefined, chunks: [], bytes: 0, budgeted: 0, kept: 0, decided: false, explain, responseBody: false, cls,
      figures: new RequestFigures(this.deps.metrics, this.shared.labels, cls),
      bodyless: msg.request_headers!.end_of_stream === true,
      // The path tells a /v1/responses body from an embeddings one (both carry `input`), a /v1/messages body from a chat's.
      path: findHeader(msg.request_headers!.headers, ":path"),
    };
    // A gRPC request (vLLM's gRPC API: an InferencePool of appProtocol kubernetes.io/h2c) carries protobuf this EPP
    // does not read, where an OpenAI JSON body would be refused as malformed: by load, on the headers, its body
    // passed through.
    const grpc = findHeader(msg.request_headers!.headers, "content-type")?.startsWith("application/grpc") === true;
    if (grpc) warnOnce(this.shared.warned, this.deps.log, "grpc_request", { path: this.req.path }, "gRPC requests are routed by load (their protobuf bodies are not read)");
    // No body, or none before the route is taken (NONE: not sent; STREAMED: the headers go upstream
    // once answered): the decision is by load alone, on the headers.
    if (msg.request_headers!.end_of_stream || this.mode === "NONE" || this.mode === "STREAMED" || grpc) {
      // A body follows that goes upstream as the client wrote it, whatever the pool's rewrite rules say.
      if (!msg.request_headers!.end_of_stream && this.deps.rewriteRules?.() !== undefined) this.countRewrite("rules_not_applied");
      this.decide(EMPTY, "headers");
      return;
    }
    // Buffered modes wait for the headers answer before sending the body; full duplex does not,
    // and there the headers answer must carry the route, so it waits for the body.
    if (!this.fullDuplex) this.send(continueRequestHeaders());
  }

  private onRequestBody(chunk: Uint8Array, eos: boolean): void {
    const req = this.req;
    if (!req || req.decided) {
      // A body after our answer (STREAMED, or after an immediate response): pass it through untouched.
      this.send(this.fullDuplex ? streamedBody("request_body", chunk, eos) : continueResponse("request_body"));
      return;
    }
    if (req.bytes + chunk.length > (this.deps.maxBodyBytes ?? MAX_BODY_BYTES)) {
      this.immediate(413, "request body too large", "body_too_large", "bad_request");
      return;
    }
    const budget = this.deps.bodyBudget;
    const taken = budget.take(chunk.length, req.budgeted);
    if (taken) req.budgeted += chunk.length;
    if (chunk.length > 0) {
      req.chunks.push(chunk);
      req.bytes += chunk.length;
    }
    if (!taken) {
      // All streams together hold as much body as the process may: route now on what this one has, by
      // load (its prefix is not read: the route must not wait holding it), and hand it back; the rest of
      // the body passes through unbuffered (req.decided).
      this.deps.metrics.extProcBufferOverflows.inc();
      this.shared.warnOverflow("budget", { bytes: req.bytes, heldBytes: budget.usedBytes, maxBytes: budget.maxBytes });
      // A body whose model must (or, under the pool's rewrite rules, may) be rewritten cannot go on unheld (it
      // would name a model the pool does not serve): refused as overload, for the gateway to retry, rather than
      // sent where it fails.
      if (req.cls.modelRewrite !== undefined || this.deps.rewriteRules?.() !== undefined) return this.immediate(429, "EPP request-body buffer full", "shed", "shed");
      // Never tokenized: a plain join (joinBody's shared memory is for a pool member to read it without a copy).
      const body = req.chunks.length === 1 ? req.chunks[0]! : Buffer.concat(req.chunks, req.bytes);
      req.chunks = []; // handed back now: nothing of it stays with the stream, uncounted, until its response ends
      this.decide(body, "body", eos, "over_budget");
      return;
    }
    // BUFFERED and BUFFERED_PARTIAL send the body as one message (end_of_stream false when trailers
    // follow), which gets one answer: the route. Full duplex answers once the body has ended.
    if (!eos && this.fullDuplex) return;
    // BUFFERED_PARTIAL cuts a body longer than Envoy's buffer at the limit (end_of_stream false, the
    // rest goes upstream unseen): that prefix may not parse, and then the route is by load.
    this.decide(joinBody(req.chunks, req.bytes), "body", true, this.mode === "BUFFERED_PARTIAL" && !eos ? "maybe_cut" : "whole");
  }

  /** Trailers end a body that never carried end_of_stream: decide now, then answer the trailers. */
  private onRequestTrailers(msg: ProcessingRequest): void {
    const req = this.req;
    if (req && !req.decided) {
      // The buffered modes send a body as one message, which takes the route: none came, so the route is
      // this trailers message's answer (Envoy's filter waits on a trailers answer here).
      if (!this.fullDuplex) {
        req.bodyless = true;
        warnOnce(this.shared.warned, this.deps.log, "trailers_route", { mode: this.mode },
          "a request with trailers and no body in a buffered body mode: its route goes as envoy.lb metadata alone (a trailers answer cannot set request headers)");
        return this.decide(EMPTY, "trailers");
      }
      this.decide(joinBody(req.chunks, req.bytes), "body", false);
      // The route waits for the body's tokens: the trailers are answered after it (replayed, decided by then).
      if (this.held !== null) return this.hold(msg, this.wireBytes);
    }
    this.send(continueResponse("request_trailers"));
  }

  /**
   * `cut`: the body may be a prefix ("maybe_cut", BUFFERED_PARTIAL), and one that does not parse routes by
   * load; or it is one ("over_budget", the rest to come unbuffered), routed by load unread. The body is read
   * (parsed, validated, its model rewritten) and tokenized by tokenizeBody, in a pool member unless there is
   * none: this thread only sheds, picks and answers.
   */
  private decide(body: Uint8Array, at: AnswerOn, bodyEnds = true, cut: BodyCut = "whole"): void {
    const req = this.req!;
    const maybeCut = cut !== "whole";
    req.decided = true;
    const started = performance.now();
    const shed = shedReason({
      priority: req.cls.priority,
      inflight: this.deps.routing.load.inflight,
      maxInflight: this.deps.maxInflight,
      queuesFull: req.cls.priority < 0 && (this.deps.queuesFull?.() ?? false),
      // Whether some objective is critical (the top of the cap is kept for it) matters to standard requests only;
      // read each time: watched InferenceObjectives change the priorities while the process runs.
      criticalKnown: req.cls.priority === 0 && this.deps.maxInflight > 0 && hasCriticalObjective(this.deps.priorities?.() ?? NO_PRIORITIES),
    });
    if (shed) {
      this.deps.metrics.shedByClass.inc({ class: req.cls.priority < 0 ? "sheddable" : req.cls.priority > 0 ? "critical" : "standard" });
      this.immediate(429, shed, "shed", "shed");
      return;
    }
    if (body.length === 0 || cut === "over_budget") {
      this.route(req, { fields: { kind: "none" }, tokens: EMPTY_IDS, body, rewritten: false }, at, bodyEnds, maybeCut, started);
      return;
    }
    req.chunks = []; // the body is `body` from here on
    req.tokenizing = new AbortController();
    // The rewrite is made where the body is read, when this EPP forwards the body it holds: the rule for the body's
    // model, if any, else the header's.
    const forwards = at === "body" && !maybeCut;
    const rewriteModel = forwards ? req.cls.modelRewrite : undefined;
    const rewriteRules = forwards ? this.deps.rewriteRules?.() : undefined;
    // The pool has rules but this prefix goes upstream as the client wrote it (a BUFFERED_PARTIAL body cut at the limit).
    if (maybeCut && this.deps.rewriteRules?.() !== undefined) this.countRewrite("rules_not_applied");
    let read: RoutedBody | Promise<RoutedBody>;
    try {
      // A long text is answered as soon as its known prefix settles the pick (the rest is not tokenized).
      const picker = this.deps.routing.picker;
      const onPrefix = this.deps.routeOnSettledPrefix === true;
      // A request in a cache namespace of its own is routed by load whatever the option: no prefix changes its pick,
      // and the estimated whole length it is answered with is what it is charged for (unmatched).
      const settles: Settles | undefined = onPrefix || this.deps.sglangBodies === true
        ? (fields, tokens, promptTokens) => {
            const as = this.scoredAs(req, fields);
            return as.namespaced || (onPrefix && picker.settles({ model: as.model, cacheSalt: fields.cacheSalt, tokens, promptTokens, subset: req.subset }));
          }
        : undefined;
      read = this.deps.tokenizeBody({ body, path: req.path, rewriteModel, ...(rewriteRules ? { rewriteRules } : {}), maybeCut }, req.tokenizing.signal, settles);
    } catch (err) {
      req.tokenizing = undefined; // nothing runs for it: its end has nothing to abort
      if (this.refused(err)) return;
      throw err;
    }
    if (read instanceof Promise) return this.awaitTokens(read, req, (r) => this.route(req, r, at, bodyEnds, maybeCut, started));
    req.tokenizing = undefined;
    this.route(req, read, at, bodyEnds, maybeCut, started);
  }

  /**
   * Where a slow pick's time went: reading and tokenizing (`readMs`: in the pool, its wait for a member, the
   * member's own time on its thread, and `handoffMs`, the rest: the job's way to the member, which may wait for a
   * CPU before it starts, and the answer's way back through the event loop), then the decision itself
   * (`decideMs`: matching, costing, choosing).
   */
  private slowPick(read: RoutedBody, ms: number, decideMs: number): void {
    const t = read.trace;
    const round = (x: number) => Math.round(x * 10) / 10;
    const handoffMs = t?.busyMs !== undefined && t.waitMs !== undefined ? round(t.ms - t.waitMs - t.busyMs) : undefined;
    this.shared.warnSlowPick(t?.outcome ?? "unread", {
      ms: round(ms), decideMs: round(decideMs), bodyBytes: read.body.length, tokens: read.tokens.length,
      ...(read.promptTokens !== undefined ? { promptTokens: read.promptTokens } : {}),
      ...(t ? { thread: t.thread, readMs: round(t.ms) } : {}),
      ...(t?.waitMs !== undefined ? { waitMs: round(t.waitMs) } : {}),
      ...(t?.busyMs !== undefined ? { busyMs: round(t.busyMs) } : {}),
      ...(handoffMs !== undefined ? { handoffMs } : {}),
      ...(t?.freshTokens !== undefined ? { freshTokens: t.freshTokens } : {}),
    });
  }

  /** The rewrite rules' model names pinned as labels before a request is labelled, whenever the rules have changed. */
  private pinRewriteNames(): void {
    const names = this.deps.rewriteModelNames?.();
    if (names === undefined || names === this.shared.pinnedRewriteNames) return;
    this.shared.labels.models.pin(names);
    this.shared.pinnedRewriteNames = names;
  }

  /** A body the model server would refuse: 400, counted (TooDeep also by depth). False for any other error. */
  private refused(err: unknown): boolean {
    if (!(err instanceof BadRequest)) return false;
    if (err instanceof TooDeep) this.deps.metrics.jsonDepthRefusals.inc({ where: "ext_proc" });
    this.immediate(400, err.message, "bad_request", "bad_request");
    return true;
  }

  /** The pick on the request's tokens (O(blocks)), and its answer. */
  private route(req: RequestState, read: RoutedBody, at: AnswerOn, bodyEnds: boolean, maybeCut: boolean, started: number): void {
    const routeStarted = performance.now();
    const { fields, tokens, promptTokens, newTurnTokens, body } = read;
    this.release(req); // answered or handed back in this call: no longer held for a route
    this.pinRewriteNames();
    const { model, namespaced } = this.scoredAs(req, fields);
    // The model it runs as, not the adapter form SGLang's lora_path gives the pick: llm-d labels the model named.
    req.figures.body(fields.model, runsAs(req, fields), fields.stream);
    if (fields.cut !== undefined) {
      this.deps.metrics.partialBodies.inc();
      this.deps.log.debug({ bytes: body.length, err: fields.cut }, "BUFFERED_PARTIAL body cut at the buffer limit: routing by load");
    }
    if (fields.target === "") {
      // A rule without targets: llm-d's answer (Director.modelRewriteIfNeeded).
      this.countRewrite("rule_no_targets");
      this.immediate(400, "model not found in request body", "bad_request", "bad_request");
      return;
    }
    if (fields.unrendered !== undefined) {
      const { cause, message } = fields.unrendered;
      this.deps.metrics.unrenderedBodies.inc({ cause });
      if (cause === "template_engine" || cause === "render_bound") this.shared.warnUnrenderable(cause, { model: fields.model, err: message });
      else this.deps.log.debug({ model: fields.model, cause, err: message }, "prompt not rendered here: routing by load");
    }
    // Only a path the decode side's sidecar splits may name a prefill worker: on any other the prefill is the decode worker's.
    const pathSplit = splitPath(req.path) !== undefined;
    // SGLang keeps an extra_key's blocks apart and no event names them: matched on nothing, charged for its length.
    const pick = namespaced
      ? { model, cacheSalt: fields.cacheSalt, ...unmatched(tokens, promptTokens), subset: req.subset, pathSplit }
      : { model, cacheSalt: fields.cacheSalt, tokens, promptTokens, newTurnTokens, subset: req.subset, pathSplit };
    const unscored = fields.batchedPrompts !== undefined ? "batched_prompts" : namespaced ? "cache_namespace" : undefined;
    const routing = RoutedRequest.route(this.deps.routing, pick, { explain: req.explain, unscored });
    if (routing.kind === "no_endpoint") {
      this.immediate(503, `no endpoint eligible (${routing.reason})`, routing.reason, "no_endpoint");
      return;
    }
    const routed = (req.routed = routing.request);
    const now = performance.now();
    this.deps.metrics.pickLatency.observe((now - started) / 1000);
    if (this.deps.slowPickMs && now - started >= this.deps.slowPickMs) this.slowPick(read, now - started, now - routeStarted);
    req.figures.outcome("routed", req.bytes);
    if (this.warmable(fields, body)) {
      if (this.keep(req, body.length)) req.reply = { request: { body, path: req.path }, capture: new ReplyCapture() };
    }
    // ...and the forwarded body names it, where the body is held until the route is sent (model-rewrite.ts).
    const held = at === "body" && !maybeCut ? body : undefined;
    const rewrite = req.bodyless ? {} : modelRewrite(fields.target ?? req.cls.modelRewrite, fields.model, held, read.rewritten ? body : undefined, fields.rule !== undefined);
    if (rewrite.outcome) this.countRewrite(rewrite.outcome);
    req.responseModel = rewrite.response;
    const forward = body;
    const { chosen, requestBlocks } = routed.decision;
    const pd = disaggregationHeaders(routed);
    const extra: [string, string][] = routed.explanation ? [[EXPLANATION_HEADER, routed.explanation], ...pd.set] : pd.set;
    const route: Route = {
      // The protocol's ordered list: the pick first, then next-best distinct endpoints for retries.
      endpoint: routed.endpoints(this.deps.fallbacks ?? 0).join(","),
      scores: this.deps.emitEndpointScores ? endpointScores(routed) : undefined,
      // The destination's rank (a decode rank when disaggregated); the prefill rank goes in pd.set.
      dpRank: chosen.candidate.rankHeader,
      // Not for a prefix: the rest of the body comes after it (the client's own content-length stays right).
      // Nor for no body, as GAIE (only a non-empty body's length): a request with trailers and no body is no
      // request of length 0 to a data plane that applies it (HTTP/1.1 carries trailers only in chunked coding).
      contentLength: at === "body" && !maybeCut && forward.length > 0 && (this.fullDuplex || rewrite.body) ? forward.length : undefined,
      extraHeaders: extra.length > 0 ? extra : undefined,
      removeHeaders: pd.remove,
      body: this.fullDuplex ? undefined : rewrite.body,
    };
    const prefill = routed.prefillCandidate;
    this.deps.log.debug(
      { worker: chosen.candidate.workerId, rank: chosen.candidate.dpRank, overlap: chosen.overlap, blocks: requestBlocks, ...(prefill ? { prefill: prefill.workerId, prefillRank: prefill.dpRank } : {}) },
      "routed",
    );
    this.sendRoute(route, at, forward, bodyEnds);
  }

  /** The route goes back as the answer the body mode expects: on the headers, the (held back) body, or the trailers. */
  private sendRoute(route: Route, at: AnswerOn, body: Uint8Array, bodyEnds: boolean): void {
    if (at === "headers") {
      this.send(routedHeaders(route));
    } else if (at === "trailers") {
      this.send(routedTrailers(route));
    } else if (this.fullDuplex) {
      this.send(routedHeaders(route));
      // The body was held back until the route was known; hand it back in bounded chunks (counted in the
      // budget again, as answers, until they are sent: grpc-h2.ts, ReceiveBudget). Nothing to hand back for a
      // request that had headers then trailers and no body: Envoy asked for no chunk.
      if (body.length === 0 && bodyEnds) this.send(streamedBody("request_body", EMPTY, true));
      for (let off = 0; off < body.length; off += STREAM_CHUNK) {
        const end = Math.min(off + STREAM_CHUNK, body.length);
        this.send(streamedBody("request_body", body.subarray(off, end), bodyEnds && end === body.length));
      }
    } else {
      this.send(routedBody(route));
    }
  }

  /**
   * The endpoint the data plane reports served the request (GAIE protocol: envoy.lb
   * x-gateway-destination-endpoint-served, on the response path): its RoutedRequest moves its load there.
   */
  private served(endpoint: string | undefined): void {
    const routed = this.req?.routed;
    const picked = routed?.candidate.endpoint;
    const moved = routed?.servedBy(endpoint);
    if (moved === "unknown_endpoint") this.deps.log.debug({ picked, served: endpoint }, "served by an endpoint this EPP does not know; load left on the pick");
    else if (moved === "moved") this.deps.log.debug({ picked, served: endpoint }, "served elsewhere: load moved");
  }

  private countRewrite(outcome: RewriteOutcome): void {
    this.deps.metrics.modelRewrites.inc({ result: outcome });
    if (outcome === "body_not_held" || outcome === "rules_not_applied")
      warnOnce(this.shared.warned, this.deps.log, `rewrite_${outcome}`, { mode: this.mode },
        `${outcome === "body_not_held" ? "x-gateway-model-name-rewrite scored" : "the pool has InferenceModelRewrite rules"}, but the body was not held before the route (request body mode NONE/STREAMED, or a BUFFERED_PARTIAL body cut at the limit): it goes upstream naming the client's model; use FULL_DUPLEX_STREAMED or BUFFERED`);
  }

  private immediate(code: ImmediateStatus, message: string, details: string, outcome: RequestOutcome): void {
    (this.req?.figures ?? new RequestFigures(this.deps.metrics, this.shared.labels, UNCLASSED)).outcome(outcome);
    this.send(immediate(code, message, details));
    // The HTTP request is answered; the stream stays up for whatever comes next.
    this.finish();
  }

  /** What a request is scored as (scoredAs): the model it runs as, to SGLang workers with its adapter and namespace. */
  private scoredAs(req: RequestState, fields: BodyFields): ReturnType<typeof scoredAs> {
    return scoredAs(runsAs(req, fields), fields, this.deps.sglangBodies === true);
  }

  /**
   * Whether to keep a routed body to warm the next turn from its reply, when one will come through this stream: a
   * chat completion's (a Responses reply is no chat completion, and is neither kept nor read). Not a chat this
   * process cannot render (its next turn would fail the same way), nor one cut at the routing bound, nor a body
   * larger than the pool warms (counted).
   */
  private warmable(fields: BodyFields, body: Uint8Array): boolean {
    const warm = this.deps.warmReply;
    if (!warm || fields.kind !== "chat" || fields.responses || fields.unrendered !== undefined || fields.boundCut || !this.responseBodies) return false;
    if (body.length <= warm.maxBodyBytes) return true;
    this.deps.metrics.replyWarmsDropped.inc({ cause: "too_large" });
    return false;
  }

  /**
   * Adds a response chunk to the reply to warm with. The reply is dropped when what warming keeps is full
   * (counted), or when it grows past what a reply may be (ReplyCapture: its next turn tokenizes it anyway).
   */
  private captureReply(req: RequestState, reply: NonNullable<RequestState["reply"]>, chunk: Uint8Array): void {
    const kept = this.keep(req, chunk.length);
    if (kept) reply.capture.add(chunk);
    if (!kept || reply.capture.overflowed) this.dropReply(req);
  }

  /** The request's reply is not warmed after all: what it kept goes back. */
  private dropReply(req: RequestState): void {
    this.release(req);
    req.reply = undefined;
  }

  /** Keeps `n` more bytes for the request's reply warming, or counts that warming has no room for it. */
  private keep(req: RequestState, n: number): boolean {
    if (!this.deps.bodyBudget.keep(n)) {
      this.deps.metrics.replyWarmsDropped.inc({ cause: "budget" });
      return false;
    }
    req.kept += n;
    return true;
  }

  /** Gives back what the request holds in the process's budget: its body, and what reply warming keeps (idempotent). */
  private release(req: RequestState): void {
    this.deps.bodyBudget.give(req.budgeted);
    this.deps.bodyBudget.unkeep(req.kept);
    req.budgeted = 0;
    req.kept = 0;
  }

  /** Ends the current request's routing life: its load released, its response's figures recorded (idempotent). */
  private finish(): void {
    // A stream reset or failed while messages were held: they will not be handled (see awaitTokens).
    if (this.closed) this.giveHeldBytes();
    const req = this.req;
    if (!req) return;
    this.req = undefined;
    this.release(req);
    req.figures.end();
    req.tokenizing?.abort();
    if (req.routed) {
      // No response body seen (the gateway's response_body_mode is NONE, or the response had none):
      // the load was held to the stream's end, and its prefill part never turned into decode.
      if (!req.responseBody) this.deps.metrics.releasedWithoutResponseBody.inc();
      req.routed.end();
    }
  }
}

/**
 * The prefill worker for the decode side's sidecar (llm-d's P/D protocol): `x-prefiller-host-port` names
 * its API server, and kv-epp's rank header the rank when that server fronts several. In a pool with
 * prefill workers a request that is not disaggregated gets neither, and a client's own are removed: only
 * the EPP names a prefill worker (a sidecar would send the prompt wherever the header says). A pool
 * without prefill workers is answered as before.
 */
function disaggregationHeaders(routed: RoutedRequest): { set: [string, string][]; remove?: string[] } {
  if (!routed.decision.pd) return { set: [] };
  const p = routed.prefillCandidate;
  if (!p) return { set: [], remove: [PREFILLER_HOST_PORT_HEADER, PREFILL_RANK_HEADER] };
  const set: [string, string][] = [[PREFILLER_HOST_PORT_HEADER, p.endpoint]];
  if (p.rankHeader !== undefined) return { set: [...set, [PREFILL_RANK_HEADER, String(p.rankHeader)]] };
  return { set, remove: [PREFILL_RANK_HEADER] };
}

/**
 * llm-d's per-endpoint scores, where a higher score is preferred: here an endpoint's is its best rank's cost,
 * negated (the pick's is the highest). Ranks that cost nothing finite are left out.
 */
function endpointScores(routed: RoutedRequest): Record<string, number> {
  const scores: Record<string, number> = {};
  for (const { candidate, cost } of routed.decision.scored) {
    const score = -cost;
    const other = scores[candidate.endpoint];
    if (Number.isFinite(score) && (other === undefined || score > other)) scores[candidate.endpoint] = score;
  }
  return scores;
}

/** The message whose answer carries the route. */
type AnswerOn = "headers" | "body" | "trailers";

/** Whether a body handed to decide is whole, may be cut at Envoy's buffer (BUFFERED_PARTIAL), or is a prefix (the body budget was spent). */
type BodyCut = "whole" | "maybe_cut" | "over_budget";

/** Messages a stream may send while its route is pending (held, answered in order once it is known). */
const MAX_HELD = 256;

/** A message held while the route is pending: its encoded length, and what holding it costs (heldCost). */
type Held = { msg: ProcessingRequest; wireBytes: number; cost: number };

/**
 * What a decoded message's bytes outside its body may take in memory, per encoded byte: header maps decode to an
 * object per entry, and an empty entry is 2 bytes on the wire (measured: 1 MB of them held 17 MB of heap, 0.8 MB
 * of one-letter entries 2.7 MB). A body is one view of the message's bytes.
 */
const DECODED_PER_WIRE_BYTE = 32;

/** Its body's bytes, and the rest at what they may decode to (DECODED_PER_WIRE_BYTE): a message held is held decoded. */
function heldCost(msg: ProcessingRequest, wireBytes: number): number {
  const body = (msg.request_body?.body?.length ?? 0) + (msg.response_body?.body?.length ?? 0);
  return body + DECODED_PER_WIRE_BYTE * Math.max(0, wireBytes - body);
}

const EMPTY = new Uint8Array(0);
const EMPTY_IDS = new Uint32Array(0);

/**
 * The model a request runs as: the one its body was read to name (a rule's target, else the header's), else the
 * header's (x-gateway-model-name-rewrite), else the body's.
 */
function runsAs(req: RequestState, fields: BodyFields): string | undefined {
  return fields.target ?? req.cls.modelRewrite ?? fields.model;
}

const NO_PRIORITIES: ReadonlyMap<string, number> = new Map();
/** A failure outside any request's headers: the class a request without GAIE headers has. */
const UNCLASSED = { fairnessId: DEFAULT_FAIRNESS_ID, priority: 0 };
