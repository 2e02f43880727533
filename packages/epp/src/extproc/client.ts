// The gateway's side of ext_proc (what Envoy does), for the demo's load generator and the cluster
// simulation: one HTTP request per stream.
// Full duplex (GAIE's mode, the default): request headers and the whole body are written at once; the
// route comes on the request-headers answer, followed by the body handed back in chunks (dropped here:
// the caller sends its own copy to the worker). Buffered: headers -> CONTINUE, body -> the
// route on the body answer. Then the response's headers and end of body, so the EPP releases the load.
import * as grpc from "@grpc/grpc-js";
import { DESTINATION_HEADER, type ProcessingRequest } from "./messages.ts";
import { loadProtos } from "./protos.ts";

type Mutation = { header_mutation?: { set_headers?: { header?: { key: string; raw_value?: Uint8Array; value?: string } }[] } };
type Answer = {
  request_headers?: { response?: Mutation };
  request_body?: { response?: Mutation };
  response_headers?: unknown;
  response_body?: unknown;
  immediate_response?: { status?: { code?: string | number }; details?: string };
};
type Call = grpc.ClientDuplexStream<ProcessingRequest, Answer>;
type ExtProcStub = grpc.Client & { Process(): Call };

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

export class ExtProcClient {
  private readonly stub: ExtProcStub;

  constructor(
    readonly address: string,
    readonly mode: ClientBodyMode = "full-duplex",
    opts: { tls?: boolean } = {},
  ) {
    const { extProc } = loadProtos();
    const ch = extProcChannel(opts.tls ?? true);
    this.stub = new extProc(address, ch.credentials, ch.options) as unknown as ExtProcStub;
  }

  async route(path: string, body: Uint8Array): Promise<Routed> {
    const call = this.stub.Process();
    const answers = answerQueue(call);
    const fullDuplex = this.mode === "full-duplex";
    // The pick clock starts when grpc-js hands the headers to the HTTP/2 stream (its write callback), not
    // at write(): a new stream waits there for the channel, and a burst's streams for the event loop.
    let writtenAt: number | undefined;
    const asked = performance.now();
    try {
      call.write(
        {
          request_headers: {
            headers: { headers: [header(":method", "POST"), header(":path", path), header("content-type", "application/json")] },
            end_of_stream: false,
          },
          protocol_config: { request_body_mode: fullDuplex ? "FULL_DUPLEX_STREAMED" : "BUFFERED", response_body_mode: "NONE" },
        },
        () => void (writtenAt ??= performance.now()),
      );
      if (!fullDuplex) await answers.until("request_headers");
      call.write({ request_body: { body, end_of_stream: true } });
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
            call.write({ response_headers: { headers: { headers: [header(":status", String(status))] }, end_of_stream: false } });
            await answers.until("response_headers");
            call.write({ response_body: { body: responseBody, end_of_stream: true } });
            await answers.until("response_body");
          } finally {
            call.end();
          }
        },
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

/** Answers of one stream in order; a stream error or end rejects the waiting reader. */
function answerQueue(call: Call, timeoutMs = 30_000) {
  const queued: Answer[] = [];
  const waiters: { resolve: (a: Answer) => void; reject: (e: Error) => void }[] = [];
  let failure: Error | undefined;
  const fail = (e: Error) => {
    failure ??= e;
    for (const w of waiters.splice(0)) w.reject(failure);
  };
  call.on("data", (a: Answer) => {
    const w = waiters.shift();
    if (w) w.resolve(a);
    else queued.push(a);
  });
  call.on("error", (e: Error) => fail(new RoutingError(`ext_proc stream failed: ${e.message}`)));
  call.on("end", () => fail(new RoutingError("ext_proc stream ended")));
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
