// Test fixtures for the EPP: an ext_proc client over the same protos, an in-process EPP from a static
// config, and KV event publishers standing in for workers' ZMQ endpoints.
import { setDefaultTimeout } from "bun:test";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import * as grpc from "@grpc/grpc-js";
import http2 from "node:http2";
import { computeBlockHashes } from "@kv-epp/index-wasm";
import { KvEventPublisher } from "@kv-epp/kv-events";
import pino from "pino";
import { stringify } from "yaml";
import { parseConfig } from "../src/config.ts";
import type { ProcessingRequest, Struct } from "../src/extproc/messages.ts";
import { loadProtos } from "../src/extproc/protos.ts";
import { extProcChannel } from "../src/extproc/client.ts";
import { startEpp, type EppHandle } from "../src/main.ts";
import { LOOPBACK, tempDir } from "@kv-epp/testkit";

// Real processes and sockets on a shared 2-core machine: generous per-test budget (waits are polled).
setDefaultTimeout(30_000);

export const HOST = `${LOOPBACK}.4.1`;
export const BLOCK = 16;
export const MODEL = "test-model";

// The fields tests read from responses (proto-loader objects).
export type Resp = {
  response?: string;
  request_headers?: { response?: Common };
  request_body?: { response?: Common };
  response_headers?: { response?: Common };
  response_body?: { response?: Common };
  immediate_response?: { status?: { code?: string | number }; headers?: Common["header_mutation"]; body?: Buffer; details?: string };
  dynamic_metadata?: Struct;
};
type Common = {
  header_mutation?: { set_headers?: { header?: { key: string; raw_value?: Buffer } }[]; remove_headers?: string[] };
  clear_route_cache?: boolean;
  body_mutation?: { body?: Buffer; streamed_response?: { body?: Buffer; end_of_stream?: boolean } };
};

/** A duplex ext_proc stream with an awaitable queue of responses. */
export class ExtProcStream {
  private readonly queue: Resp[] = [];
  private readonly waiters: ((r: Resp | Error) => void)[] = [];
  private error: Error | undefined;
  readonly call: grpc.ClientDuplexStream<ProcessingRequest, Resp>;

  constructor(client: grpc.Client & { Process(): grpc.ClientDuplexStream<ProcessingRequest, Resp> }) {
    this.call = client.Process();
    this.call.on("data", (r: Resp) => {
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

  next(timeoutMs = 5000): Promise<Resp> {
    const queued = this.queue.shift();
    if (queued) return Promise.resolve(queued);
    if (this.error) return Promise.reject(this.error);
    return new Promise((resolve, reject) => {
      const t = setTimeout(() => reject(new Error("no ext_proc response in time")), timeoutMs);
      this.waiters.push((r) => {
        clearTimeout(t);
        if (r instanceof Error) reject(r);
        else resolve(r);
      });
    });
  }

  /** Responses already received and not yet read. */
  get pending(): number {
    return this.queue.length;
  }

  end(): void {
    this.call.end();
  }
}

/** An ext_proc client as a gateway opens it: TLS (unverified), or h2c with `tls: false`. */
export function extProcClient(port: number, host = HOST, o: { tls?: boolean } = {}) {
  const { extProc } = loadProtos();
  const ch = extProcChannel(o.tls ?? true);
  const client = new extProc(`${host}:${port}`, ch.credentials, ch.options) as unknown as grpc.Client & {
    Process(): grpc.ClientDuplexStream<ProcessingRequest, Resp>;
  };
  return { client, open: () => new ExtProcStream(client), close: () => client.close() };
}

/** A raw HTTP/2 session to an EPP's ext_proc port over TLS, unverified as the gateways connect. */
export function rawExtProcSession(port: number, host = HOST): http2.ClientHttp2Session {
  return http2.connect(`https://${host}:${port}`, { rejectUnauthorized: false, servername: "dynamo-epp" });
}

/** grpc.health.v1 on the health port (plaintext), or with `tls` on the ext_proc port (--health-checking). */
export function healthClient(port: number, host = HOST, o: { tls?: boolean } = {}) {
  const { health } = loadProtos();
  const ch = extProcChannel(o.tls ?? false);
  // Its own connections: grpc-js otherwise shares them per address across clients, and an ephemeral
  // port an earlier test's server used may be this one's now.
  return new health(`${host}:${port}`, ch.credentials, { ...ch.options, "grpc.use_local_subchannel_pool": 1 }) as unknown as grpc.Client & {
    Check(req: { service: string }, cb: (err: grpc.ServiceError | null, res?: { status: string }) => void): void;
    List(req: object, cb: (err: grpc.ServiceError | null, res?: { statuses: Record<string, { status: string }> }) => void): void;
    Watch(req: { service: string }): grpc.ClientReadableStream<{ status: string }>;
  };
}

/** Health/List's answer as name -> status. */
export function listHealth(c: ReturnType<typeof healthClient>): Promise<Record<string, string>> {
  return new Promise((resolve, reject) =>
    c.List({}, (err, res) => (err ? reject(err) : resolve(Object.fromEntries(Object.entries(res!.statuses).map(([k, v]) => [k, v.status]))))),
  );
}

export function checkHealth(c: ReturnType<typeof healthClient>, service: string): Promise<string> {
  return new Promise((resolve, reject) => c.Check({ service }, (err, res) => (err ? reject(err) : resolve(res!.status))));
}

const enc = new TextEncoder();

export function headers(path = "/v1/completions", endOfStream = false, extra: Partial<ProcessingRequest> = {}, contentType = "application/json"): ProcessingRequest {
  return {
    request_headers: {
      headers: {
        headers: [
          { key: ":method", raw_value: enc.encode("POST") },
          { key: ":path", raw_value: enc.encode(path) },
          { key: "content-type", raw_value: enc.encode(contentType) },
        ],
      },
      end_of_stream: endOfStream,
    },
    ...extra,
  };
}

export function body(json: unknown, endOfStream = true): ProcessingRequest {
  return { request_body: { body: typeof json === "string" ? enc.encode(json) : enc.encode(JSON.stringify(json)), end_of_stream: endOfStream } };
}

export function setHeader(r: Common | undefined, key: string): string | undefined {
  const h = r?.header_mutation?.set_headers?.find((s) => s.header?.key === key);
  return h?.header?.raw_value ? Buffer.from(h.header.raw_value).toString() : undefined;
}

/** A header an ImmediateResponse sets. */
export function immediateHeader(r: Resp, key: string): string | undefined {
  return setHeader({ header_mutation: r.immediate_response?.headers }, key);
}

export function lbMetadata(r: Resp): string | undefined {
  return r.dynamic_metadata?.fields?.["envoy.lb"]?.structValue?.fields?.["x-gateway-destination-endpoint"]?.stringValue;
}

export function tokens(n: number, seed: number): number[] {
  return Array.from({ length: n }, (_, i) => (seed * 7919 + i * 31) % 50000);
}

/** A stand-in for a worker's KV event endpoint: publishes BlockStored batches like vLLM. */
export class FakeWorkerEvents {
  private constructor(
    readonly pub: KvEventPublisher,
    readonly dpRank: number,
  ) {}

  /** `dpRank`: the rank this publisher stands for (vLLM's rank r publishes on the KV port + r). */
  static async start(host = HOST, port = 0, dpRank = 0): Promise<FakeWorkerEvents> {
    return new FakeWorkerEvents(await KvEventPublisher.bind({ endpoint: `tcp://${host}:${port}` }), dpRank);
  }

  get endpoint(): string {
    return this.pub.endpoint;
  }

  /**
   * Stores a prompt's full blocks as one chain. Block hashes are derived from the content (as vLLM's
   * are), so publishing the same prompt again is idempotent.
   */
  storePrompt(ids: number[], blockSize = BLOCK): void {
    const local = computeBlockHashes(Uint32Array.from(ids), blockSize);
    const hashes: bigint[] = [];
    const buf = new BigUint64Array(2);
    let parent = 0n;
    for (const t of local) {
      buf[0] = parent;
      buf[1] = t;
      parent = Bun.hash.xxHash3(new Uint8Array(buf.buffer), 7n);
      hashes.push(parent);
    }
    this.pub.publish({
      ts: Date.now() / 1000,
      dataParallelRank: this.dpRank,
      events: [
        {
          type: "BlockStored",
          blockHashes: hashes,
          parentBlockHash: null,
          tokenIds: ids.slice(0, hashes.length * blockSize),
          blockSize,
          loraId: null,
          medium: "GPU",
        },
      ],
    });
  }

  /**
   * Publishes until `indexed` holds. A PUB drops messages until the subscriber's subscription has
   * arrived, which a completed handshake does not guarantee (ZeroMQ's "slow joiner").
   */
  async storeUntil(ids: number[], indexed: () => Promise<boolean> | boolean, opts: { timeoutMs?: number } = {}): Promise<void> {
    const deadline = Date.now() + (opts.timeoutMs ?? 10_000);
    for (;;) {
      this.storePrompt(ids);
      for (let i = 0; i < 5; i++) {
        if (await indexed()) return;
        await Bun.sleep(20);
      }
      if (Date.now() > deadline) throw new Error("prompt never indexed");
    }
  }

  close(): Promise<void> {
    return this.pub.close();
  }
}

export function localHashes(ids: number[], blockSize = BLOCK): BigUint64Array {
  return computeBlockHashes(Uint32Array.from(ids), blockSize);
}

export type TestWorker = {
  id: string;
  address: string | string[];
  kvEvents: string;
  replay?: string;
  dpSize?: number;
  dpStartRank?: number;
  kvEventsBind?: boolean;
  dpLb?: "internal" | "hybrid" | "external";
  role?: "prefill" | "decode" | "both" | "prefill-decode";
  metrics?: string;
};

export function writeStaticConfig(workers: TestWorker[], peers: string[] = [], extra: Record<string, unknown> = {}): string {
  const path = join(tempDir("epp-test-"), "epp.yaml");
  writeFileSync(path, stringify({ model: MODEL, blockSize: BLOCK, workers, peers, ...extra }));
  return path;
}

export const quietLog = pino({ level: process.env.EPP_TEST_LOG ?? "silent" });

/** A logger that keeps every line's msg (and fields) in memory, for asserting log order. */
export function capturingLog(): { log: pino.Logger; lines: { msg: string; [k: string]: unknown }[] } {
  const lines: { msg: string }[] = [];
  const log = pino({ level: "info" }, { write: (s: string) => void lines.push(JSON.parse(s)) });
  return { log, lines };
}

/** An in-process EPP on HOST with ephemeral ports. */
export async function startTestEpp(
  workers: TestWorker[],
  o: { peers?: string[]; flags?: string[]; host?: string; waitReady?: boolean; log?: pino.Logger } = {},
): Promise<EppHandle> {
  const host = o.host ?? HOST;
  const cfg = parseConfig(
    [
      "--config", writeStaticConfig(workers, o.peers),
      "--listen", host,
      "--grpc-port", "0", "--grpc-health-port", "0", "--metrics-port", "0", "--replica-agg-port", "0", "--subscribe-wait-ms", "1000", "--selection-port", "0",
      "--scrape-interval-ms", "0",
      "--recovery-timeout-ms", "3000",
      // Each test's EPP starts cold: the decision warm-up is tested on its own (warm-decisions.test.ts).
      "--warm-up-picks", "0",
      // The EPP runs on the test's own thread: a short slice would stay with it for every later test (tested on its own).
      "--thread-slice-us", "0",
      ...(o.flags ?? []),
    ],
    {},
  );
  const epp = await startEpp(cfg, { log: o.log ?? quietLog });
  if (o.waitReady !== false) await epp.ready;
  return epp;
}

export async function postJson(url: string, json: unknown): Promise<{ status: number; body: any }> {
  const res = await fetch(url, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(json) });
  return { status: res.status, body: await res.json() };
}

/** A TCP server that accepts and reads but never answers (an HTTP store hung mid-request). */
export async function hungServer(host = HOST): Promise<{ url: string; connections: () => number; close: () => Promise<void> }> {
  const { createServer } = await import("node:net");
  const sockets: import("node:net").Socket[] = [];
  const server = createServer((s) => {
    sockets.push(s);
    s.resume();
    s.on("error", () => {});
  });
  await new Promise<void>((r) => server.listen(0, host, () => r()));
  return {
    url: `http://${host}:${(server.address() as { port: number }).port}`,
    connections: () => sockets.length,
    close: () => new Promise<void>((r) => (sockets.forEach((s) => s.destroy()), server.close(() => r()))),
  };
}

/** One series' value from a Prometheus text page at `base` (e.g. `name{label="x"}`); undefined when absent. */
export async function scrapeMetric(base: string, series: string): Promise<number | undefined> {
  const text = await (await fetch(`${base}/metrics`)).text();
  const line = text.split("\n").find((l) => l.startsWith(`${series} `));
  return line === undefined ? undefined : Number(line.slice(series.length + 1));
}
