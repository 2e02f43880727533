// The load generator's side of ext_proc: it plays the gateway (Envoy) for one HTTP request per stream.
// Buffered request body: headers -> continue, body -> the routing answer (destination header); then the
// response's headers and end of body, so the EPP releases the request's load.
import * as grpc from "@grpc/grpc-js";
import { DESTINATION_HEADER, loadProtos, type ProcessingRequest } from "@kv-epp/epp";

type Mutation = { header_mutation?: { set_headers?: { header?: { key: string; raw_value?: Uint8Array; value?: string } }[] } };
type Answer = {
  request_headers?: { response?: Mutation };
  request_body?: { response?: Mutation };
  immediate_response?: { status?: { code?: string | number }; details?: string };
};
type Call = grpc.ClientDuplexStream<ProcessingRequest, Answer>;
type ExtProcStub = grpc.Client & { Process(): Call };

const enc = new TextEncoder();
const header = (key: string, value: string) => ({ key, raw_value: enc.encode(value) });

export class RoutingError extends Error {
  override name = "RoutingError";
}

export type Routed = {
  /** ip:port of the chosen worker */
  endpoint: string;
  /** from sending the request headers to the routing answer, ms */
  pickMs: number;
  /** tell the EPP the response has ended (releases the request's load), then close the stream */
  finish(status: number): Promise<void>;
};

export class ExtProcClient {
  private readonly stub: ExtProcStub;

  constructor(readonly address: string) {
    const { extProc } = loadProtos();
    this.stub = new extProc(address, grpc.credentials.createInsecure()) as unknown as ExtProcStub;
  }

  async route(path: string, body: Uint8Array): Promise<Routed> {
    const call = this.stub.Process();
    const answers = answerQueue(call);
    const started = performance.now();
    try {
      call.write({
        request_headers: {
          headers: { headers: [header(":method", "POST"), header(":path", path), header("content-type", "application/json")] },
          end_of_stream: false,
        },
        protocol_config: { request_body_mode: "BUFFERED", response_body_mode: "NONE" },
      });
      refuseImmediate(await answers.next());
      call.write({ request_body: { body, end_of_stream: true } });
      const routed = refuseImmediate(await answers.next());
      const endpoint = destination(routed.request_body?.response ?? routed.request_headers?.response);
      if (!endpoint) throw new RoutingError("routing answer without a destination header");
      const pickMs = performance.now() - started;
      return {
        endpoint,
        pickMs,
        finish: async (status) => {
          try {
            call.write({ response_headers: { headers: { headers: [header(":status", String(status))] }, end_of_stream: false } });
            await answers.next();
            call.write({ response_body: { body: new Uint8Array(0), end_of_stream: true } });
            await answers.next();
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
  return {
    next(): Promise<Answer> {
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
    },
  };
}
