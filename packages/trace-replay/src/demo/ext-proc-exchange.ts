// The gateway's side of one ext_proc stream per HTTP request, request and response path, as Envoy runs
// it with GAIE's filter configuration (processing_mode: request and response headers SEND, request and
// response body FULL_DUPLEX_STREAMED, trailers SEND; config/charts/standalone/values.yaml):
// - full duplex: request headers and body -> the route on the headers answer, then the request body the
//   EPP hands back (that is what goes upstream). Response headers, then each upstream body chunk as it
//   arrives (end_of_stream on an empty last one: an HTTP/1 chunked body ends after its last chunk). The
//   client gets the headers once the EPP answered them, and the body chunks the EPP streams back.
// - buffered (request and response body BUFFERED, response headers SEND, Envoy's default): the route on
//   the request body answer; Envoy holds the response headers until the whole body is buffered and the
//   EPP answered it ("we won't be able to modify the headers any more" otherwise, ext_proc's
//   processor_state.cc), so the client gets the whole response at once.
// The demo's own client: @kv-epp/epp's ExtProcClient (the cluster simulation's) stops at the route.
import type * as grpc from "@grpc/grpc-js";
import { DESTINATION_HEADER, extProcChannel, loadProtos, METADATA_NAMESPACE, RoutingError, type ClientBodyMode, type ProcessingRequest } from "@kv-epp/epp";

type HeaderValue = { key: string; raw_value?: Uint8Array; value?: string };
type HeaderMutation = { set_headers?: { header?: HeaderValue }[]; remove_headers?: string[] };
type BodyMutation = { body?: Uint8Array; clear_body?: boolean; streamed_response?: { body?: Uint8Array; end_of_stream?: boolean } };
type Common = { header_mutation?: HeaderMutation; body_mutation?: BodyMutation };
type Phase = "request_headers" | "request_body" | "response_headers" | "response_body";
type Answer = { [P in Phase]?: { response?: Common } } & {
  immediate_response?: { status?: { code?: string | number }; details?: string };
};
type Call = grpc.ClientDuplexStream<ProcessingRequest, Answer>;
type ExtProcStub = grpc.Client & { Process(): Call };

const enc = new TextEncoder();
const EMPTY = new Uint8Array(0);
/** GAIE's metadata key for the endpoint that served a request (the EPP's SERVED_KEY). */
const SERVED_KEY = "x-gateway-destination-endpoint-served";
const header = (key: string, value: string) => ({ key, raw_value: enc.encode(value) });
const valueOf = (h: HeaderValue) => (h.raw_value && h.raw_value.length > 0 ? Buffer.from(h.raw_value).toString() : (h.value ?? ""));
// Not forwarded as they came: the body may be rewritten (Envoy drops content-length with body
// mutations in full duplex), and framing is the gateway's own.
const HOP_BY_HOP = new Set(["content-length", "transfer-encoding", "connection", "keep-alive", "content-encoding"]);

export type Exchange = {
  /** ip:port of the chosen worker */
  endpoint: string;
  /** the request body to send upstream: what the EPP handed back (full duplex) or the original */
  body: Uint8Array;
  /** the headers the EPP set on the request (the destination, a DP rank), for the upstream request */
  headers: Record<string, string>;
  /** from the request headers written to the HTTP/2 stream to the routing answer, ms */
  pickMs: number;
  /** performance.now() when the request headers were written to the HTTP/2 stream */
  writtenAt: number;
  /** Passes the upstream's response through the EPP; `extra` headers go to the client too. */
  respond(upstream: Response, extra: Record<string, string>): Promise<Response>;
  /** The request was given up before a response (the data plane resets the ext_proc stream). */
  cancel(): void;
};

/** One EPP replica's ext_proc port, over TLS as the demo's EPPs serve it. */
export class ExtProcGateway {
  private readonly stub: ExtProcStub;

  constructor(
    readonly address: string,
    readonly mode: ClientBodyMode,
  ) {
    const channel = extProcChannel(true);
    this.stub = new (loadProtos().extProc)(address, channel.credentials, channel.options) as unknown as ExtProcStub;
  }

  async route(path: string, body: Uint8Array): Promise<Exchange> {
    const call = this.stub.Process();
    const answers = new Answers(call);
    const fullDuplex = this.mode === "full-duplex";
    // The pick clock starts when grpc-js hands the headers to the HTTP/2 stream (its write callback), not
    // at write(): a new stream waits there for the channel, and a burst's streams for the event loop.
    let writtenAt: number | undefined;
    const asked = performance.now();
    try {
      call.write(requestHeaders(path, fullDuplex ? "FULL_DUPLEX_STREAMED" : "BUFFERED"), () => void (writtenAt ??= performance.now()));
      if (!fullDuplex) await answers.until("request_headers");
      call.write({ request_body: { body, end_of_stream: true } });
      const routed = await answers.until(fullDuplex ? "request_headers" : "request_body");
      const answeredAt = performance.now();
      const common = (fullDuplex ? routed.request_headers : routed.request_body)?.response;
      const endpoint = destination(common?.header_mutation);
      if (!endpoint) throw new RoutingError("routing answer without a destination header");
      const started = Math.min(writtenAt ?? asked, answeredAt);
      const upstreamBody = fullDuplex ? await answers.streamedBody("request_body") : mutatedBody(common?.body_mutation, body);
      return {
        endpoint,
        body: upstreamBody,
        headers: setHeaders(common?.header_mutation),
        pickMs: answeredAt - started,
        writtenAt: started,
        respond: (upstream, extra) =>
          fullDuplex ? respondStreamed(call, answers, endpoint, upstream, extra) : respondBuffered(call, answers, endpoint, upstream, extra),
        cancel: () => call.cancel(),
      };
    } catch (e) {
      call.cancel();
      throw e;
    }
  }

  close(): void {
    this.stub.close();
  }
}

/** Request headers announcing the processing mode (Envoy 1.34+ sends protocol_config on the first message). */
function requestHeaders(path: string, bodyMode: "FULL_DUPLEX_STREAMED" | "BUFFERED"): ProcessingRequest {
  const headers = [header(":method", "POST"), header(":path", path), header("content-type", "application/json")];
  return {
    request_headers: { headers: { headers }, end_of_stream: false },
    protocol_config: { request_body_mode: bodyMode, response_body_mode: bodyMode },
  };
}

/**
 * The response headers, with the endpoint that served the request in the envoy.lb metadata
 * (GAIE's x-gateway-destination-endpoint-served: the data plane reports where it sent the request).
 */
function responseHeaders(upstream: Response, served: string, bodyFollows: boolean): ProcessingRequest {
  const headers = [header(":status", String(upstream.status))];
  upstream.headers.forEach((v, k) => void (HOP_BY_HOP.has(k) || headers.push(header(k, v))));
  return {
    response_headers: { headers: { headers }, end_of_stream: !bodyFollows },
    metadata_context: { filter_metadata: { [METADATA_NAMESPACE]: { fields: { [SERVED_KEY]: { stringValue: served } } } } },
  };
}

/** A header mutation's set headers, as the data plane applies them to the upstream request. */
function setHeaders(m: HeaderMutation | undefined): Record<string, string> {
  const out: Record<string, string> = {};
  for (const s of m?.set_headers ?? []) if (s.header && !s.header.key.startsWith(":") && !HOP_BY_HOP.has(s.header.key)) out[s.header.key] = valueOf(s.header);
  return out;
}

function clientHeaders(upstream: Response, extra: Record<string, string>, ...mutations: (HeaderMutation | undefined)[]): Headers {
  const h = new Headers();
  upstream.headers.forEach((v, k) => void (HOP_BY_HOP.has(k) || h.set(k, v)));
  for (const m of mutations) {
    for (const k of m?.remove_headers ?? []) h.delete(k);
    for (const s of m?.set_headers ?? []) if (s.header && !s.header.key.startsWith(":")) h.set(s.header.key, valueOf(s.header));
  }
  for (const [k, v] of Object.entries(extra)) h.set(k, v);
  return h;
}

/** Full duplex: upstream chunks go to the EPP as they come; the client gets the EPP's chunks back. */
async function respondStreamed(call: Call, answers: Answers, served: string, upstream: Response, extra: Record<string, string>): Promise<Response> {
  const reader = upstream.body?.getReader();
  call.write(responseHeaders(upstream, served, reader !== undefined));
  // One response_body per event-loop turn of upstream data, what was read by then (as Envoy sends one
  // per socket read): a gateway that falls behind sends fewer, larger chunks instead of queueing more.
  const pump = async (r: NonNullable<typeof reader>) => {
    const pending: Uint8Array[] = [];
    let flushed: Promise<void> | undefined;
    const flush = async () => {
      await new Promise<void>((resolve) => setImmediate(resolve));
      const body = pending.length === 1 ? pending[0]! : Buffer.concat(pending.splice(0));
      pending.length = 0;
      flushed = undefined;
      await write(call, { response_body: { body, end_of_stream: false } }).catch(() => call.cancel());
    };
    try {
      for (;;) {
        const { done, value } = await r.read();
        if (done) break;
        if (value.length === 0) continue;
        pending.push(value);
        flushed ??= flush();
      }
      await flushed;
      await write(call, { response_body: { body: EMPTY, end_of_stream: true } });
    } catch {
      call.cancel(); // the upstream broke (or the client left): Envoy resets the ext_proc stream
    }
  };
  if (reader) void pump(reader);
  let answered: Answer;
  try {
    answered = await answers.until("response_headers");
  } catch (e) {
    void reader?.cancel();
    throw e;
  }
  const headers = clientHeaders(upstream, extra, answered.response_headers?.response?.header_mutation);
  if (!reader) {
    call.end();
    return new Response(null, { status: upstream.status, headers });
  }
  const body = new ReadableStream<Uint8Array>({
    async pull(controller) {
      try {
        const a = await answers.until("response_body");
        const s = a.response_body?.response?.body_mutation?.streamed_response;
        if (s?.body && s.body.length > 0) controller.enqueue(s.body);
        if (s?.end_of_stream) {
          controller.close();
          call.end();
        }
      } catch (e) {
        controller.error(e);
        void reader.cancel();
      }
    },
    cancel(reason) {
      call.cancel();
      return reader.cancel(reason);
    },
  });
  return new Response(body, { status: upstream.status, headers });
}

/** Buffered: the whole body, then one answer for it; nothing reaches the client before that. */
async function respondBuffered(call: Call, answers: Answers, served: string, upstream: Response, extra: Record<string, string>): Promise<Response> {
  const hasBody = upstream.body !== null;
  call.write(responseHeaders(upstream, served, hasBody));
  try {
    const [h, whole] = await Promise.all([answers.until("response_headers"), hasBody ? upstream.bytes() : Promise.resolve(EMPTY)]);
    let bodyMutation: Common | undefined;
    if (hasBody) {
      call.write({ response_body: { body: whole, end_of_stream: true } });
      bodyMutation = (await answers.until("response_body")).response_body?.response;
    }
    const headers = clientHeaders(upstream, extra, h.response_headers?.response?.header_mutation, bodyMutation?.header_mutation);
    return new Response(hasBody ? mutatedBody(bodyMutation?.body_mutation, whole) : null, { status: upstream.status, headers });
  } finally {
    call.end();
  }
}

function mutatedBody(m: BodyMutation | undefined, body: Uint8Array): Uint8Array {
  if (m?.clear_body) return EMPTY;
  return m?.body && m.body.length > 0 ? m.body : body;
}

function destination(m: HeaderMutation | undefined): string | undefined {
  const h = m?.set_headers?.find((s) => s.header?.key === DESTINATION_HEADER)?.header;
  return h && valueOf(h);
}

/** Writes with grpc-js' flow control: waits for 'drain' when its buffer is full. */
async function write(call: Call, msg: ProcessingRequest): Promise<void> {
  if (call.write(msg)) return;
  await new Promise<void>((resolve, reject) => {
    const done = (e?: Error) => {
      call.off("drain", done);
      call.off("error", done);
      if (e) reject(e);
      else resolve();
    };
    call.on("drain", done);
    call.on("error", done);
  });
}

/** A stream's answers in order (the EPP answers each phase in the order asked); a stream error or end rejects. */
class Answers {
  private readonly queued: Answer[] = [];
  private waiter: { resolve: (a: Answer) => void; reject: (e: Error) => void } | undefined;
  private failure: Error | undefined;

  constructor(call: Call) {
    call.on("data", (a: Answer) => {
      const w = this.waiter;
      this.waiter = undefined;
      if (w) w.resolve(a);
      else this.queued.push(a);
    });
    call.on("error", (e: Error) => this.fail(new RoutingError(`ext_proc stream failed: ${e.message}`)));
    call.on("end", () => this.fail(new RoutingError("ext_proc stream ended")));
  }

  private fail(e: Error): void {
    this.failure ??= e;
    this.waiter?.reject(this.failure);
    this.waiter = undefined;
  }

  private next(timeoutMs: number): Promise<Answer> {
    const a = this.queued.shift();
    if (a) return Promise.resolve(a);
    if (this.failure) return Promise.reject(this.failure);
    return new Promise((resolve, reject) => {
      const t = setTimeout(() => this.fail(new RoutingError("no ext_proc answer in time")), timeoutMs);
      this.waiter = { resolve: (x) => (clearTimeout(t), resolve(x)), reject: (e) => (clearTimeout(t), reject(e)) };
    });
  }

  /**
   * The next answer, which must be for `phase`; an immediate response refuses the request. A streamed
   * response body waits on the worker's next chunk, so its wait is as long as Envoy's GAIE message_timeout.
   */
  async until(phase: Phase): Promise<Answer> {
    const a = await this.next(phase === "response_body" ? 1_000_000 : 30_000);
    if (a.immediate_response) {
      const i = a.immediate_response;
      throw new RoutingError(`EPP answered ${i.status?.code ?? "?"} (${i.details ?? "immediate response"})`);
    }
    if (a[phase] == null) throw new RoutingError(`expected a ${phase} answer, got ${Object.keys(a).join(", ")}`);
    return a;
  }

  /** Full duplex: the body chunks the EPP hands back, up to the one with end_of_stream. */
  async streamedBody(phase: "request_body"): Promise<Uint8Array> {
    const parts: Uint8Array[] = [];
    for (;;) {
      const s = (await this.until(phase))[phase]?.response?.body_mutation?.streamed_response;
      if (s?.body && s.body.length > 0) parts.push(s.body);
      if (s?.end_of_stream) return parts.length === 1 ? parts[0]! : Buffer.concat(parts);
    }
  }
}
