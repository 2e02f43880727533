// The gateway's side of ext_proc (what Envoy does), for the EPP's decision warm-up and the cluster simulation:
// one HTTP/2 stream per request.
// Full duplex (GAIE's mode, the default): request headers and the whole body are written at once; the
// route comes on the request-headers answer, followed by the body handed back in chunks (dropped here:
// the caller sends its own copy to the worker). Buffered: headers -> CONTINUE, body -> the
// route on the body answer. Then the response's headers and end of body, so the EPP releases the load.
import * as grpc from "@grpc/grpc-js";
import http2 from "node:http2";
import { framed, messageReader } from "./grpc-frames.ts";
import { DESTINATION_HEADER, type ProcessingRequest } from "./messages.ts";
import { EXT_PROC_SERVICE, loadProtos } from "./protos.ts";

type Mutation = { header_mutation?: { set_headers?: { header?: { key: string; raw_value?: Uint8Array; value?: string } }[] } };
type Answer = {
  request_headers?: { response?: Mutation };
  request_body?: { response?: Mutation };
  response_headers?: unknown;
  response_body?: unknown;
  immediate_response?: { status?: { code?: string | number }; details?: string };
};

const enc = new TextEncoder();
const header = (key: string, value: string) => ({ key, raw_value: enc.encode(value) });

export class RoutingError extends Error {
  override name = "RoutingError";
}

/** ext_proc request body mode the client announces in `protocol_config` (the EPPs are started alike). */
export type ClientBodyMode = "full-duplex" | "buffered";
type Phase = "request_headers" | "request_body" | "response_headers" | "response_body";

export type Routed = {
  /** ip:port of the chosen worker */
  endpoint: string;
  /** from the request headers written to the HTTP/2 stream to the routing answer, ms */
  pickMs: number;
  /** performance.now() when the request headers were written to the HTTP/2 stream */
  writtenAt: number;
  /** tell the EPP the response has ended, with its body if given (releases the request's load), then close the stream */
  finish(status: number, body?: Uint8Array): Promise<void>;
};

/**
 * The channel to an EPP's ext_proc port as the gateways open it: TLS without verifying the certificate
 * (Envoy AI Gateway, kgateway and GAIE's own chart do not verify the EPP's self-signed certificate), or
 * h2c for an EPP started with --secure-serving=false.
 */
export function extProcChannel(tls: boolean): { credentials: grpc.ChannelCredentials; options: grpc.ChannelOptions } {
  if (!tls) return { credentials: grpc.credentials.createInsecure(), options: {} };
  return {
    credentials: grpc.credentials.createSsl(null, null, null, { rejectUnauthorized: false }),
    // TLS refuses an IP address as the server name (SNI); any name does when nothing is verified.
    options: { "grpc.ssl_target_name_override": "dynamo-epp" },
  };
}

/**
 * One HTTP/2 connection to an EPP's ext_proc port, a gRPC stream per request. Plain node:http2 with gRPC's framing
 * and the server's own codec rather than a grpc-js channel: the EPP warms its decision path through this client
 * before it serves (warm-decisions.ts), and grpc-js's call machinery cost the starting replica more CPU there than
 * the server it warms (a third of the decision thread's samples against a fifth). The gRPC counterpart the tests
 * hold the server to is grpc-js itself (test/helpers.ts, extProcChannel).
 */
export class ExtProcClient {
  private session: http2.ClientHttp2Session | undefined;
  private readonly codec = loadProtos().extProc.service.Process!;

  constructor(
    readonly address: string,
    readonly mode: ClientBodyMode = "full-duplex",
    private readonly opts: { tls?: boolean } = {},
  ) {}

  /** The connection, made again once the last one closed (as a channel reconnects; a GOAWAY closes it too). */
  private connection(): http2.ClientHttp2Session {
    if (this.session && !this.session.closed && !this.session.destroyed) return this.session;
    const tls = this.opts.tls ?? true;
    // Unverified, as gateways connect (see extProcChannel); TLS refuses an IP address as the server name.
    const s = http2.connect(`${tls ? "https" : "http"}://${this.address}`, tls ? { rejectUnauthorized: false, servername: "dynamo-epp" } : {});
    s.on("error", () => {}); // each stream reports its own failure
    this.session = s;
    return s;
  }

  async route(path: string, body: Uint8Array): Promise<Routed> {
    const stream = this.connection().request({
      ":method": "POST", ":path": `/${EXT_PROC_SERVICE}/Process`, "content-type": "application/grpc", te: "trailers",
    });
    const answers = answerQueue(stream, (m) => this.codec.responseDeserialize(m) as Answer);
    const send = (m: ProcessingRequest, written?: () => void) => stream.write(framed(this.codec.requestSerialize(m)), written);
    const fullDuplex = this.mode === "full-duplex";
    // The pick clock starts when the headers message reaches the HTTP/2 stream (its write callback), not at
    // request(): a new stream may wait there for the connection, and a burst's streams for the event loop.
    let writtenAt: number | undefined;
    const asked = performance.now();
    try {
      send({
        request_headers: {
          headers: { headers: [header(":method", "POST"), header(":path", path), header("content-type", "application/json")] },
          end_of_stream: false,
        },
        protocol_config: { request_body_mode: fullDuplex ? "FULL_DUPLEX_STREAMED" : "BUFFERED", response_body_mode: "NONE" },
      } as ProcessingRequest, () => void (writtenAt ??= performance.now()));
      if (!fullDuplex) await answers.until("request_headers");
      send({ request_body: { body, end_of_stream: true } } as ProcessingRequest);
      const routed = await answers.until(fullDuplex ? "request_headers" : "request_body");
      const answeredAt = performance.now();
      const endpoint = destination(fullDuplex ? routed.request_headers?.response : routed.request_body?.response);
      if (!endpoint) throw new RoutingError("routing answer without a destination header");
      const started = Math.min(writtenAt ?? asked, answeredAt);
      return {
        endpoint,
        pickMs: answeredAt - started,
        writtenAt: started,
        finish: async (status, responseBody = new Uint8Array(0)) => {
          try {
            // Full duplex: the body chunks the EPP hands back come first; until() skips them.
            send({ response_headers: { headers: { headers: [header(":status", String(status))] }, end_of_stream: false } } as ProcessingRequest);
            await answers.until("response_headers");
            send({ response_body: { body: responseBody, end_of_stream: true } } as ProcessingRequest);
            await answers.until("response_body");
          } finally {
            stream.end();
          }
        },
      };
    } catch (e) {
      stream.close(http2.constants.NGHTTP2_CANCEL);
      throw e;
    }
  }

  close(): void {
    this.session?.close();
  }
}

/** gRPC's status for trailers that carry none (as grpc-js reads them). */
const GRPC_UNKNOWN = 2;

/** A grpc-message as sent: percent-encoded, and shown raw when it does not decode (gRPC never fails on it). */
function grpcMessage(v: string | string[] | undefined): string {
  const raw = String(v ?? "");
  try {
    return decodeURIComponent(raw);
  } catch {
    return raw;
  }
}

function refuseImmediate(a: Answer): Answer {
  if (a.immediate_response) {
    const code = a.immediate_response.status?.code;
    throw new RoutingError(`EPP answered ${code ?? "?"} (${a.immediate_response.details ?? "immediate response"})`);
  }
  return a;
}

function destination(m: Mutation | undefined): string | undefined {
  const h = m?.header_mutation?.set_headers?.find((s) => s.header?.key === DESTINATION_HEADER)?.header;
  if (!h) return undefined;
  return h.raw_value && h.raw_value.length > 0 ? Buffer.from(h.raw_value).toString() : h.value;
}

/** Answers of one stream in order; a stream error, a gRPC status or the stream's end rejects the waiting reader. */
function answerQueue(stream: http2.ClientHttp2Stream, decode: (m: Buffer) => Answer, timeoutMs = 30_000) {
  const queued: Answer[] = [];
  const waiters: { resolve: (a: Answer) => void; reject: (e: Error) => void }[] = [];
  let failure: Error | undefined;
  const fail = (e: Error) => {
    failure ??= e;
    for (const w of waiters.splice(0)) w.reject(failure);
  };
  stream.on("data", messageReader((m) => {
    let a: Answer;
    try {
      a = decode(m);
    } catch (e) {
      fail(new RoutingError(`undecodable ext_proc answer: ${(e as Error).message}`));
      return false;
    }
    const w = waiters.shift();
    if (w) w.resolve(a);
    else queued.push(a);
    return true;
  }));
  // A gRPC status comes in the trailers, or in the headers of a reply that is only headers (a refusal); an HTTP
  // status other than 200 is no gRPC answer at all.
  const status = (h: http2.IncomingHttpHeaders, trailers: boolean) => {
    const code = h["grpc-status"] === undefined ? (trailers ? GRPC_UNKNOWN : 0) : Number(h["grpc-status"]);
    if (code !== 0) fail(new RoutingError(`ext_proc stream failed: gRPC status ${code} ${grpcMessage(h["grpc-message"])}`));
  };
  stream.on("response", (h) => {
    if (h[":status"] !== 200) fail(new RoutingError(`ext_proc stream failed: HTTP status ${h[":status"]}`));
    else status(h, false);
  });
  stream.on("trailers", (t) => status(t, true));
  stream.on("error", (e: Error) => fail(new RoutingError(`ext_proc stream failed: ${e.message}`)));
  stream.on("close", () => fail(new RoutingError(`ext_proc stream ended${stream.rstCode ? ` (reset, code ${stream.rstCode})` : ""}`)));
  const next = (): Promise<Answer> => {
    const a = queued.shift();
    if (a) return Promise.resolve(a);
    if (failure) return Promise.reject(failure);
    return new Promise((resolve, reject) => {
      const t = setTimeout(() => reject(new RoutingError("no ext_proc answer in time")), timeoutMs);
      waiters.push({
        resolve: (x) => (clearTimeout(t), resolve(x)),
        reject: (e) => (clearTimeout(t), reject(e)),
      });
    });
  };
  return {
    /** The next answer for `phase`, skipping others (the streamed-back request body); refuses an immediate response. */
    async until(phase: Phase): Promise<Answer> {
      for (;;) {
        const a = refuseImmediate(await next());
        if (a[phase] != null) return a;
      }
    },
  };
}
