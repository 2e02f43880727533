// ext_proc ExternalProcessor.Process: one gRPC stream per HTTP request (a new request_headers on the
// same stream starts a new request). Request headers + body -> routing decision; response headers and
// body are watched to release the request's load when it finishes, or when the stream breaks.
import type { Logger } from "pino";
import { throttledWarn } from "../log-throttle.ts";
import type { BodyMode } from "../config.ts";
import type { Metrics, RequestOutcome } from "../metrics.ts";
import type { ActiveLoad, Lease } from "../picker/load.ts";
import type { Decision, Picker } from "../picker/picker.ts";
import type { PrefixKeys } from "../picker/pending.ts";
import { EXPLAIN_REQUEST_HEADER, EXPLANATION_HEADER, explanation } from "../picker/explain.ts";
import { predictionOf, type ResponseWatch, type RoutingQuality } from "../picker/quality.ts";
import { prefillBlocksOf } from "../picker/decide.ts";
import type { Tokenize } from "../tokens.ts";
import type { Candidate } from "../workers/registry.ts";
import { FairnessLabels, hasCriticalObjective, requestClass, shedReason, type RequestClass } from "./gaie-headers.ts";
import { GrpcStatus, type BidiCall, type StatusCode } from "./grpc-h2.ts";
import { BadRequest, MAX_BODY_BYTES, parseBodyBytes, TooDeep, type ParsedBody, type RoutedInput } from "./openai-body.ts";
import type { ChatMessage } from "@kv-epp/tokenizer";
import { ReplyCapture } from "./reply-capture.ts";
import {
  type BodySendMode,
  continueResponse,
  findHeader,
  immediate,
  routedBody,
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

export type ExtProcDeps = {
  picker: Picker;
  load: ActiveLoad;
  tokenize: Tokenize;
  metrics: Metrics;
  log: Logger;
  bodyMode: BodyMode;
  /** Shed (429) when this many requests are in flight (0: never). */
  maxInflight: number;
  maxBodyBytes?: number;
  /** Watches responses for the cached tokens and TTFT they report (routing quality). */
  quality?: RoutingQuality;
  /** Explain every decision, not only those asking with x-kv-epp-explain: 1. */
  explainAll?: boolean;
  /** InferenceObjective name -> priority (x-gateway-inference-objective). */
  priorities?: ReadonlyMap<string, number>;
  /** Every worker is over --queue-threshold (saturated: sheddable requests get 429). */
  queuesFull?: () => boolean;
  /** Next-best distinct endpoints sent after the pick, for the gateway's retries (0: none). */
  fallbacks?: number;
  /** The routable worker ranks, to find the one a served endpoint names. */
  candidates?: () => readonly Candidate[];
  /** A chat's response ended with this reply: warm the conversation's next turn (the tokenizer pool). */
  warmReply?: (input: RoutedInput, reply: ChatMessage) => void;
};

/** What one ext_proc server's streams share. */
type Shared = {
  warned: Set<string>;
  fairness: FairnessLabels;
  /** Rejected streams, logged at most once per reason per interval (a client may send them in a loop). */
  warnRejected: (reason: string, fields?: Record<string, unknown>) => void;
  /** Some objective is critical: the top of --max-inflight is kept for it (shedReason). */
  criticalKnown: boolean;
};

type Duplex = BidiCall<ProcessingRequest, ProcessingResponse>;

/** Per-HTTP-request state on a stream. */
type RequestState = {
  subset: Set<string> | undefined;
  chunks: Uint8Array[];
  bytes: number;
  lease: Lease | undefined;
  /** The response's watch: predicted vs reported cached tokens, observed TTFT. */
  watch?: ResponseWatch;
  /** The routing decision (what it predicted for each candidate, should another serve the request). */
  picked?: Extract<Decision, { kind: "picked" }>;
  /** Asked why this worker: the decision's explanation goes on the routed request and the response. */
  explain: boolean;
  explanation?: string;
  /** A decision was sent (or an immediate response): later request messages are not expected. */
  decided: boolean;
  /** GAIE headers: model rewrite, priority, fairness id. */
  cls: RequestClass;
  /** Where its load is counted: the picked rank, or the one the gateway reports served it. */
  routed?: { candidate: Candidate; blocks: number; prefillBlocks: number; prefilled: boolean; prefix?: PrefixKeys };
  /** A response_body message came for it (the gateway sends response bodies). */
  responseBody: boolean;
  /** Aborts its tokenization in the pool when the request ends first. */
  tokenizing?: AbortController;
  /** A routed chat: its input and its reply as it streams back, to warm the next turn. */
  reply?: { input: RoutedInput; capture: ReplyCapture };
};

/** The request's prefill is over (first response byte, or its deadline): its load stops counting it as ahead. */
function prefillOver(req: RequestState): void {
  req.lease?.prefilled();
  if (req.routed) req.routed.prefilled = true;
}

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

export function createProcessHandler(deps: ExtProcDeps): (call: Duplex) => void {
  // per server: per process as deployed
  const shared: Shared = { warned: new Set(), fairness: new FairnessLabels(), warnRejected: throttledWarn(deps.log, "ext_proc stream rejected"),
    criticalKnown: hasCriticalObjective(deps.priorities ?? NO_PRIORITIES),
  };
  return (call) => new ProcessStream(call, deps, shared).run();
}

class ProcessStream {
  private req: RequestState | undefined;
  /** The request body mode, from the first message's protocol_config (else --body-mode). */
  private mode: BodySendMode | undefined;
  private responseStreamed = false;
  /** Response body chunks come as the upstream sends them (STREAMED, FULL_DUPLEX_STREAMED). */
  private responseChunked = false;
  private observe = false;
  private closed = false;
  /** A request_headers has come on this stream. */
  private started = false;
  /** Messages that came while a decision waited for its tokens (null: none waits). */
  private held: ProcessingRequest[] | null = null;

  private get fullDuplex(): boolean {
    return this.mode === "FULL_DUPLEX_STREAMED";
  }

  constructor(
    private readonly call: Duplex,
    private readonly deps: ExtProcDeps,
    private readonly shared: Shared,
  ) {}

  run(): void {
    this.call.on("data", (msg: ProcessingRequest) => {
      if (this.held !== null) this.held.push(msg);
      else this.handle(msg);
    });
    this.call.on("end", () => {
      this.finish();
      if (!this.closed) {
        this.closed = true;
        this.call.end();
      }
    });
    this.call.on("error", (err) => {
      this.deps.log.debug({ err: String(err) }, "ext_proc stream error");
      this.finish();
    });
    this.call.on("cancelled", () => this.finish());
  }

  private handle(msg: ProcessingRequest): void {
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
   * stream that ends first aborts the tokenization (finish).
   */
  private awaitTokens(pending: Promise<Uint32Array>, req: RequestState, route: (tokens: Uint32Array) => void): void {
    this.held = [];
    pending.then(
      (tokens) => {
        if (this.req === req) route(tokens);
      },
      (err: unknown) => {
        if (this.req !== req) return; // the stream ended: the tokenization was cancelled
        if (err instanceof BadRequest) this.immediate(400, err.message, "bad_request", "bad_request");
        else this.failed(err);
      },
    ).catch((err: unknown) => this.failed(err)).finally(() => {
      const held = this.held ?? [];
      this.held = null;
      for (let i = 0; i < held.length; i++) {
        this.handle(held[i]!);
        const waiting = this.held as ProcessingRequest[] | null; // set again by a decision that now waits
        if (waiting !== null) {
          waiting.push(...held.slice(i + 1));
          break;
        }
      }
    });
  }

  /** Ends the stream with INVALID_ARGUMENT (its request's load released), counted by reason. */
  private reject(reason: "no_request" | "unexpected" | "grpc_body_mode", message: string, code: StatusCode = GrpcStatus.INVALID_ARGUMENT): void {
    this.deps.metrics.extProcRejected.inc({ reason });
    if (reason === "grpc_body_mode") warnOnce(this.shared.warned, this.deps.log, reason, { reason, err: message }, "ext_proc stream rejected");
    else this.shared.warnRejected(reason, { err: message });
    this.finish();
    this.closed = true;
    this.call.fail(code, message);
  }

  private send(msg: ProcessingResponse): void {
    if (this.observe || this.closed) return;
    this.call.write(msg);
  }

  private onMessage(msg: ProcessingRequest): void {
    // A message with no request case (the empty message, or a field number this proto does not know)
    // says nothing to act on: the stream is broken, not the process.
    if (msg.request === undefined) return this.reject("no_request", "ProcessingRequest without a request case");
    const outOfOrder = this.outOfOrder(msg);
    if (outOfOrder) return this.reject("unexpected", outOfOrder);
    if (this.mode === undefined) {
      const pc = msg.protocol_config;
      // NONE is proto3's zero value, absent on the wire: a protocol_config without a mode means NONE.
      this.mode = pc ? (pc.request_body_mode ?? "NONE") : this.deps.bodyMode === "buffered" ? "BUFFERED" : "FULL_DUPLEX_STREAMED";
      this.responseStreamed = pc ? pc.response_body_mode === "FULL_DUPLEX_STREAMED" : this.fullDuplex;
      // BUFFERED and BUFFERED_PARTIAL send the response body whole, at its end: no first token to time.
      this.responseChunked = pc ? this.responseStreamed || pc.response_body_mode === "STREAMED" : this.fullDuplex;
      if (!pc)
        warnOnce(
          this.shared.warned,
          this.deps.log,
          "no_protocol_config",
          { assumed: this.mode, bodyMode: this.deps.bodyMode },
          `ext_proc streams carry no protocol_config (Envoy before 1.34 does not send it): assuming request body mode ${this.mode} from --body-mode ${this.deps.bodyMode}; if the filter's processing_mode.request_body_mode differs, set --body-mode buffered|full-duplex to match it`,
        );
      // The body would come as gRPC messages to be answered one by one, not as the HTTP/JSON body
      // routing reads: refused at once, with the reason, instead of answers Envoy calls spurious.
      if (this.mode === "GRPC" || (pc && pc.response_body_mode === "GRPC"))
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
    if (this.req && !this.req.decided && (msg.request_body || msg.request_trailers)) {
      const hint = subsetHint(msg);
      if (hint) this.req.subset = hint;
    }
    if (msg.request_body) return this.onRequestBody(msg.request_body.body ?? EMPTY, msg.request_body.end_of_stream === true);
    if (msg.request_trailers) return this.onRequestTrailers();
    if (msg.response_headers) {
      const status = findHeader(msg.response_headers.headers, ":status");
      if (status && status !== "200") this.deps.log.debug({ status }, "upstream answered non-200");
      this.req?.watch?.headers(findHeader(msg.response_headers.headers, "content-type"), this.responseChunked);
      this.served(servedEndpoint(msg) ?? findHeader(msg.response_headers.headers, SERVED_KEY));
      const explained = this.req?.explanation;
      this.send(explained ? responseHeadersWith([[EXPLANATION_HEADER, explained]]) : continueResponse("response_headers"));
      if (msg.response_headers.end_of_stream) this.finish();
      return;
    }
    if (msg.response_body) {
      // The first response bytes mean the worker has finished this request's prefill.
      if (this.req) {
        prefillOver(this.req);
        this.req.responseBody = true;
      }
      const body = msg.response_body.body ?? EMPTY;
      const eos = msg.response_body.end_of_stream === true;
      this.req?.watch?.body(body);
      const reply = this.req?.reply;
      if (reply) {
        reply.capture.add(body);
        if (eos) {
          const message = reply.capture.message();
          if (message) this.deps.warmReply?.(reply.input, message);
        }
      }
      this.send(this.responseStreamed ? streamedBody("response_body", body, eos) : continueResponse("response_body"));
      if (eos) this.finish();
      return;
    }
    if (msg.response_trailers) {
      this.send(continueResponse("response_trailers"));
      this.finish();
    }
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
    const cls = requestClass(msg.request_headers!.headers, this.deps.priorities ?? NO_PRIORITIES);
    this.deps.metrics.fairnessRequests.inc({ fairness_id: this.shared.fairness.label(cls.fairnessId) });
    this.req = { subset: subsetHint(msg), chunks: [], bytes: 0, lease: undefined, decided: false, explain, responseBody: false, cls };
    // No body, or none before the route is taken (NONE: not sent; STREAMED: the headers go upstream
    // once answered): the decision is by load alone, on the headers.
    if (msg.request_headers!.end_of_stream || this.mode === "NONE" || this.mode === "STREAMED") {
      this.decide(EMPTY, "headers");
      return;
    }
    // Buffered modes wait for the headers answer before sending the body; full duplex does not,
    // and there the headers answer must carry the route, so it waits for the body.
    if (!this.fullDuplex) this.send(continueResponse("request_headers"));
  }

  private onRequestBody(chunk: Uint8Array, eos: boolean): void {
    const req = this.req;
    if (!req || req.decided) {
      // A body after our answer (STREAMED, or after an immediate response): pass it through untouched.
      this.send(this.fullDuplex ? streamedBody("request_body", chunk, eos) : continueResponse("request_body"));
      return;
    }
    if (chunk.length > 0) {
      req.chunks.push(chunk);
      req.bytes += chunk.length;
    }
    if (req.bytes > (this.deps.maxBodyBytes ?? MAX_BODY_BYTES)) {
      this.immediate(413, "request body too large", "body_too_large", "bad_request");
      return;
    }
    // BUFFERED and BUFFERED_PARTIAL send the body as one message (end_of_stream false when trailers
    // follow), which gets one answer: the route. Full duplex answers once the body has ended.
    if (!eos && this.fullDuplex) return;
    // BUFFERED_PARTIAL cuts a body longer than Envoy's buffer at the limit (end_of_stream false, the
    // rest goes upstream unseen): that prefix may not parse, and then the route is by load.
    this.decide(concat(req.chunks, req.bytes), "body", true, this.mode === "BUFFERED_PARTIAL" && !eos);
  }

  /** Trailers end a body that never carried end_of_stream: decide now, then answer the trailers. */
  private onRequestTrailers(): void {
    const req = this.req;
    if (req && !req.decided) this.decide(concat(req.chunks, req.bytes), "body", false, this.mode === "BUFFERED_PARTIAL");
    this.send(continueResponse("request_trailers"));
  }

  /** `maybeCut`: the body may be a prefix (BUFFERED_PARTIAL); one that does not parse routes by load. */
  private decide(body: Uint8Array, at: "headers" | "body", bodyEnds = true, maybeCut = false): void {
    const req = this.req!;
    req.decided = true;
    const started = performance.now();
    try {
      const parsed: ParsedBody = body.length > 0 ? this.parse(body, maybeCut) : { input: { kind: "none" } };
      const shed = shedReason({
        priority: req.cls.priority,
        inflight: this.deps.load.inflight,
        maxInflight: this.deps.maxInflight,
        queuesFull: req.cls.priority < 0 && (this.deps.queuesFull?.() ?? false),
        criticalKnown: this.shared.criticalKnown,
      });
      if (shed) {
        this.deps.metrics.shedByClass.inc({ class: req.cls.priority < 0 ? "sheddable" : req.cls.priority > 0 ? "critical" : "standard" });
        this.immediate(429, shed, "shed", "shed");
        return;
      }
      req.tokenizing = new AbortController();
      const tokens = this.deps.tokenize(parsed.input, req.tokenizing.signal);
      if (tokens instanceof Promise) {
        this.awaitTokens(tokens, req, (t) => this.route(req, parsed, t, body, at, bodyEnds, started));
        return;
      }
      this.route(req, parsed, tokens, body, at, bodyEnds, started);
    } catch (err) {
      if (err instanceof BadRequest) {
        if (err instanceof TooDeep) this.deps.metrics.jsonDepthRefusals.inc({ where: "ext_proc" });
        this.immediate(400, err.message, "bad_request", "bad_request");
        return;
      }
      throw err;
    }
  }

  /** The pick on the request's tokens (O(blocks)), and its answer. */
  private route(req: RequestState, parsed: ParsedBody, tokens: Uint32Array, body: Uint8Array, at: "headers" | "body", bodyEnds: boolean, started: number): void {
    let contentLength: number | undefined;
    const batchedPrompts = parsed.batchedPrompts;
    // x-gateway-model-name-rewrite names the model the request runs as (an adapter's identity too).
    const decision: Decision = this.deps.picker.pick({ model: req.cls.modelRewrite ?? parsed.model, cacheSalt: parsed.cacheSalt, tokens, subset: req.subset });
    if (decision.kind === "no_endpoint") {
      this.immediate(503, `no endpoint eligible (${decision.reason})`, decision.reason, "no_endpoint");
      return;
    }
    const { chosen, requestBlocks } = decision;
    const prefillBlocks = prefillBlocksOf(requestBlocks, chosen.overlap);
    req.lease = this.deps.load.acquire(chosen.candidate.key, requestBlocks, prefillBlocks, decision.prefix);
    req.routed = { candidate: chosen.candidate, blocks: requestBlocks, prefillBlocks, prefilled: false, prefix: decision.prefix };
    // A response that is not streamed (or a data plane that buffers it) shows no byte until it ends, so
    // its prefill would count as ahead of every later request for its whole decode: it stops counting
    // at twice its predicted TTFT if no byte came before.
    if (prefillBlocks > 0) setTimeout(() => prefillOver(req), 2 * chosen.predictedTtftMs).unref();
    this.deps.metrics.inflight.set(this.deps.load.inflight);
    this.deps.metrics.pickLatency.observe((performance.now() - started) / 1000);
    if (requestBlocks > 0) this.deps.metrics.overlapRatio.observe(chosen.overlap / requestBlocks);
    // A batch's usage adds up all its prompts, its first token is any prompt's: nothing to compare with
    // the prediction made for the first prompt.
    if (batchedPrompts === undefined) req.watch = this.deps.quality?.watch(predictionOf(decision), performance.now());
    else if (this.deps.quality) this.deps.metrics.cachedTokensUnscored.inc({ reason: "batched_prompts" });
    req.picked = decision;
    if (this.deps.warmReply && parsed.input.kind === "chat") req.reply = { input: parsed.input, capture: new ReplyCapture() };
    if (req.explain) req.explanation = explanation(decision);
    this.deps.metrics.requests.inc({ outcome: "routed" });
    if (at === "body" && this.fullDuplex) contentLength = body.length;
    const route: Route = {
      // The protocol's ordered list: the pick first, then next-best distinct endpoints for retries.
      endpoint: [chosen.candidate.endpoint, ...fallbacks(decision.scored, chosen.candidate.endpoint, this.deps.fallbacks ?? 0)].join(","),
      dpRank: chosen.candidate.rankHeader,
      contentLength,
      extraHeaders: req.explanation ? [[EXPLANATION_HEADER, req.explanation]] : undefined,
    };
    this.deps.log.debug(
      { worker: chosen.candidate.workerId, rank: chosen.candidate.dpRank, overlap: chosen.overlap, blocks: requestBlocks },
      "routed",
    );
    if (at === "headers") {
      this.send(routedHeaders(route));
    } else if (this.fullDuplex) {
      this.send(routedHeaders(route));
      // The body was held back until the route was known; hand it back in bounded chunks. Nothing to
      // hand back for a request that had headers then trailers and no body: Envoy asked for no chunk.
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
   * x-gateway-destination-endpoint-served, on the response path). A retry or fallback that landed
   * elsewhere moves the request's load to the rank there, so the load is charged where the work is.
   */
  private served(endpoint: string | undefined): void {
    const req = this.req;
    const routed = req?.routed;
    if (!endpoint || !req || !routed || !req.lease || endpoint === routed.candidate.endpoint) return;
    const at = (this.deps.candidates?.() ?? []).filter((c) => c.endpoint === endpoint);
    const next = at.find((c) => c.dpRank === routed.candidate.dpRank) ?? at[0];
    if (!next) {
      this.deps.metrics.servedElsewhere.inc({ result: "unknown_endpoint" });
      this.deps.log.debug({ picked: routed.candidate.endpoint, served: endpoint }, "served by an endpoint this EPP does not know; load left on the pick");
      return;
    }
    req.lease.release();
    req.lease = this.deps.load.acquire(next.key, routed.blocks, routed.prefilled ? 0 : routed.prefillBlocks, routed.prefix);
    req.routed = { ...routed, candidate: next };
    // The response tells about the rank that served it: compared with what was predicted for that one.
    const scored = req.picked?.scored.find((s) => s.candidate.key === next.key);
    req.watch?.servedBy(scored && predictionOf(req.picked!, scored));
    this.deps.metrics.servedElsewhere.inc({ result: "moved" });
    this.deps.log.debug({ picked: routed.candidate.endpoint, served: endpoint }, "served elsewhere: load moved");
  }

  private parse(body: Uint8Array, maybeCut: boolean): ParsedBody {
    try {
      return parseBodyBytes(body);
    } catch (err) {
      if (!maybeCut || !(err instanceof BadRequest) || err instanceof TooDeep) throw err;
      this.deps.metrics.partialBodies.inc();
      this.deps.log.debug({ bytes: body.length, err: String(err) }, "BUFFERED_PARTIAL body cut at the buffer limit: routing by load");
      return { input: { kind: "none" } };
    }
  }

  private immediate(code: ImmediateStatus, message: string, details: string, outcome: RequestOutcome): void {
    this.deps.metrics.requests.inc({ outcome });
    this.send(immediate(code, message, details));
    // The HTTP request is answered; the stream stays up for whatever comes next.
    this.finish();
  }

  /** Releases the current request's load (idempotent). */
  private finish(): void {
    const req = this.req;
    if (!req) return;
    this.req = undefined;
    req.tokenizing?.abort();
    req.watch?.end();
    if (req.lease) {
      // No response body seen (the gateway's response_body_mode is NONE, or the response had none):
      // the load was held to the stream's end, and its prefill part never turned into decode.
      if (!req.responseBody) this.deps.metrics.releasedWithoutResponseBody.inc();
      req.lease.release();
      this.deps.metrics.inflight.set(this.deps.load.inflight);
    }
  }
}

const EMPTY = new Uint8Array(0);
const NO_PRIORITIES: ReadonlyMap<string, number> = new Map();

/** Up to `n` endpoints after `picked`, cheapest first, each once (several ranks may share one). */
function fallbacks(scored: readonly { candidate: Candidate; cost: number }[], picked: string, n: number): string[] {
  if (n <= 0) return [];
  const out: string[] = [];
  for (const s of [...scored].sort((a, b) => a.cost - b.cost)) {
    const ep = s.candidate.endpoint;
    if (ep !== picked && !out.includes(ep)) out.push(ep);
    if (out.length === n) break;
  }
  return out;
}

function concat(chunks: Uint8Array[], total: number): Uint8Array {
  if (chunks.length === 1) return chunks[0]!;
  const out = new Uint8Array(total);
  let off = 0;
  for (const c of chunks) {
    out.set(c, off);
    off += c.length;
  }
  return out;
}
