// The gateway's part of a request, as Envoy with GAIE's ext_proc filter plays it in FULL_DUPLEX_STREAMED
// mode: send the request headers and body to an EPP, read the destination it sets, send the request
// to that worker's OpenAI endpoint, then pass the response headers and body back through the stream
// (which is how the EPP learns the request finished). Uses the EPP's own protos.
import * as grpc from "@grpc/grpc-js";
import { DESTINATION_HEADER, loadProtos, type ProcessingRequest } from "@kv-epp/epp";

type Mutation = { header_mutation?: { set_headers?: { header?: { key: string; raw_value?: Uint8Array } }[] } };
type Streamed = { body_mutation?: { streamed_response?: { end_of_stream?: boolean } } };
type ProcessingResponse = {
  request_headers?: { response?: Mutation };
  request_body?: { response?: Streamed };
  response_headers?: unknown;
  response_body?: { response?: Streamed };
  immediate_response?: { status?: { code?: string | number }; details?: string };
};
type ExtProcClient = grpc.Client & { Process(): grpc.ClientDuplexStream<ProcessingRequest, ProcessingResponse> };

const enc = new TextEncoder();
const header = (key: string, value: string) => ({ key, raw_value: enc.encode(value) });

/** One ext_proc stream with an awaitable queue of responses. */
class ProcessStream {
  private readonly queue: ProcessingResponse[] = [];
  private readonly waiters: ((r: ProcessingResponse | Error) => void)[] = [];
  private error: Error | undefined;
  private readonly call: grpc.ClientDuplexStream<ProcessingRequest, ProcessingResponse>;

  constructor(client: ExtProcClient) {
    this.call = client.Process();
    this.call.on("data", (r: ProcessingResponse) => {
      const w = this.waiters.shift();
      if (w) w(r);
      else this.queue.push(r);
    });
    this.call.on("error", (e: Error) => {
      this.error = e;
      for (const w of this.waiters.splice(0)) w(e);
    });
  }

  send(msg: ProcessingRequest): void {
    this.call.write(msg);
  }

  next(timeoutMs: number): Promise<ProcessingResponse> {
    const queued = this.queue.shift();
    if (queued) return Promise.resolve(queued);
    if (this.error) return Promise.reject(this.error);
    return new Promise((resolve, reject) => {
      const t = setTimeout(() => reject(new Error(`no ext_proc response within ${timeoutMs} ms`)), timeoutMs);
      this.waiters.push((r) => {
        clearTimeout(t);
        if (r instanceof Error) reject(r);
        else resolve(r);
      });
    });
  }

  end(): void {
    this.call.end();
  }
}

export type Routed = { epp: string; endpoint: string; status: number; cachedTokens: number };

export class Gateway {
  private readonly clients = new Map<string, ExtProcClient>();

  constructor(private readonly opts: { grpcPort?: number; timeoutMs?: number } = {}) {}

  private client(eppIp: string): ExtProcClient {
    let c = this.clients.get(eppIp);
    if (!c) {
      const { extProc } = loadProtos();
      c = new extProc(`${eppIp}:${this.opts.grpcPort ?? 9002}`, grpc.credentials.createInsecure()) as unknown as ExtProcClient;
      this.clients.set(eppIp, c);
    }
    return c;
  }

  /** Routes one `/v1/completions` request through the EPP at `eppIp` and sends it to the worker it picks. */
  async completion(eppIp: string, request: { model: string; prompt: string; max_tokens: number }): Promise<Routed> {
    const timeoutMs = this.opts.timeoutMs ?? 10_000;
    const s = new ProcessStream(this.client(eppIp));
    try {
      const json = JSON.stringify(request);
      s.send({
        request_headers: {
          headers: { headers: [header(":method", "POST"), header(":path", "/v1/completions"), header("content-type", "application/json")] },
          end_of_stream: false,
        },
      } as ProcessingRequest);
      s.send({ request_body: { body: enc.encode(json), end_of_stream: true } } as ProcessingRequest);
      const first = await s.next(timeoutMs);
      if (first.immediate_response) {
        throw new Error(`EPP ${eppIp} answered ${first.immediate_response.status?.code}: ${first.immediate_response.details ?? ""}`);
      }
      const set = first.request_headers?.response?.header_mutation?.set_headers ?? [];
      const raw = set.find((h) => h.header?.key === DESTINATION_HEADER)?.header?.raw_value;
      if (!raw) throw new Error(`EPP ${eppIp} set no ${DESTINATION_HEADER}`);
      const endpoint = Buffer.from(raw).toString();
      // The body comes back as streamed chunks; the last one ends the request phase.
      for (;;) {
        const r = await s.next(timeoutMs);
        if (r.request_body?.response?.body_mutation?.streamed_response?.end_of_stream) break;
      }

      const res = await fetch(`http://${endpoint}/v1/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: json });
      const answer = (await res.json()) as { usage?: { prompt_tokens_details?: { cached_tokens?: number } } };

      s.send({ response_headers: { headers: { headers: [header(":status", String(res.status))] }, end_of_stream: false } } as ProcessingRequest);
      await s.next(timeoutMs);
      s.send({ response_body: { body: enc.encode(JSON.stringify(answer)), end_of_stream: true } } as ProcessingRequest);
      for (;;) {
        const r = await s.next(timeoutMs);
        if (r.response_body?.response?.body_mutation?.streamed_response?.end_of_stream || (r.response_body && !r.response_body.response?.body_mutation)) break;
      }
      return { epp: eppIp, endpoint, status: res.status, cachedTokens: answer.usage?.prompt_tokens_details?.cached_tokens ?? 0 };
    } finally {
      s.end();
    }
  }

  close(): void {
    for (const c of this.clients.values()) c.close();
    this.clients.clear();
  }
}
