// Where a vLLM worker says its KV events are published, read from the worker itself rather than
// derived from a port convention. Two merged vLLM interfaces report it:
// - HTTP, `GET /kv_event_sources` on the API server (vLLM #55844): `{"sources": [{data_parallel_rank,
//   endpoint, replay_endpoint, topic}, ...]}` sorted by rank. With `tcp://*:0` every rank binds an
//   ephemeral port on the node's IP and reports the port it got; explicit ports keep base + rank.
// - gRPC, `vllm.Control/GetKvEventSources` on vLLM's gRPC server (vLLM #50033): one `KvEventSource` per
//   rank (transport, endpoint, topic, replay_endpoint, optional data_parallel_rank, encoding, ...). Its
//   field 2 is the endpoint URI as configured (`string endpoint`); a later revision of vLLM's Rust server
//   sends a `{host, port, protocol}` message in the same field (`endpoint_addr`): both are read.
// SGLang reports it in `GET /server_info`'s `kv_events` descriptor (sglang #25844): one publisher host, a base
// port and the DP size (rank r on base + r), or, where it advertises them, a `publishers` list of each rank's
// endpoint; null when it publishes nothing. Read when a server has no `/kv_event_sources`. The one host
// cannot place a server spanning nodes: there each rank publishes on base + its global rank on the node
// its scheduler runs on, and the descriptor says nothing of which node that is (SGLang's own note on
// resolve_load_pub_range), so several DP ranks over several nodes (`nnodes`, beside the descriptor in
// /server_info) are refused rather than dialed on the wrong host.
// A wildcard host (`*`, `0.0.0.0`, `::`) is not dialable from elsewhere: it becomes the host the report
// was read from. Fields, keys and transports this reader does not know are skipped and counted.
import * as grpc from "@grpc/grpc-js";
import { bracketHost, endpointHost } from "@kv-epp/protocol";
import protobuf from "protobufjs";
import { z } from "zod";

/** One rank's KV-event source as the worker reported it (the shape `registerWorkerIntents` takes, plus the topic). */
export type ReportedSource = { rank: number; kvEvents: string; replay: string | null; topic: string };

export type ReportedSources = {
  sources: ReportedSource[];
  /** Entries skipped (a transport other than ZMQ, no usable endpoint, a rank missing where several sources) and unknown fields read past. */
  skipped: number;
  unknownFields: number;
};

export class ReportedSourcesError extends Error {}

/** A report that cannot be used as the worker made it: asking again does not help (not retried). */
export class UnusableReportError extends Error {}

export type ReadOptions = { timeoutMs?: number };

/**
 * Reads a worker's KV-event sources from `from`: `http://host:port` (vLLM's API server) or
 * `grpc://host:port` (vLLM's gRPC server; `grpcs://` for TLS, unverified as for a pod's own certificate).
 */
export function readReportedSources(from: string, o: ReadOptions = {}): Promise<ReportedSources> {
  const url = new URL(from);
  if (url.protocol === "http:" || url.protocol === "https:") return readHttp(url, o);
  if (url.protocol === "grpc:" || url.protocol === "grpcs:") return readGrpc(url, o);
  throw new ReportedSourcesError(`${from}: expected http://, https://, grpc:// or grpcs://`);
}

// ---- HTTP (vLLM #55844) ---------------------------------------------------------------------------

const HttpSource = z.looseObject({
  data_parallel_rank: z.number().int().min(0).nullish(),
  endpoint: z.string().min(1),
  replay_endpoint: z.string().nullish(),
  topic: z.string().nullish(),
});
const HTTP_KEYS = new Set(["data_parallel_rank", "endpoint", "replay_endpoint", "topic"]);

/** GET `target` (a pod's own certificate is not verified); a failure to reach it is a ReportedSourcesError. */
async function get(target: URL, o: ReadOptions): Promise<Response> {
  try {
    return await fetch(target, { signal: AbortSignal.timeout(o.timeoutMs ?? 5000), tls: { rejectUnauthorized: false } } as RequestInit);
  } catch (e) {
    throw new ReportedSourcesError(`${target}: ${(e as Error).message}`);
  }
}

async function readHttp(url: URL, o: ReadOptions): Promise<ReportedSources> {
  const target = new URL("/kv_event_sources", url);
  const res = await get(target, o);
  if (res.status === 404) {
    await res.body?.cancel().catch(() => {});
    return readSglang(url, o, target);
  }
  if (!res.ok) throw new ReportedSourcesError(`${target}: HTTP ${res.status}`);
  const body = (await res.json().catch(() => undefined)) as unknown;
  // The route answers {"sources": [...]}; an earlier revision answered the list itself.
  const list = Array.isArray(body) ? body : (body as { sources?: unknown } | null)?.sources;
  if (!Array.isArray(list)) throw new ReportedSourcesError(`${target}: expected {"sources": [...]}`);
  const raw: RawSource[] = [];
  let skipped = 0, unknownFields = 0;
  for (const item of list) {
    const p = HttpSource.safeParse(item);
    if (!p.success) {
      skipped++;
      continue;
    }
    unknownFields += Object.keys(p.data).filter((k) => !HTTP_KEYS.has(k)).length;
    raw.push({ rank: p.data.data_parallel_rank ?? null, endpoint: p.data.endpoint, replay: p.data.replay_endpoint ?? null, topic: p.data.topic ?? "" });
  }
  return finish(raw, url.hostname, skipped, unknownFields);
}

// ---- SGLang's /server_info (sglang #25844) --------------------------------------------------------------

const SglangPublisher = z.looseObject({ dp_rank: z.number().int().min(0), endpoint: z.string().min(1) });
const SglangKvEvents = z.looseObject({
  publisher: z.string(),
  endpoint_host: z.string().min(1),
  endpoint_port_base: z.number().int().min(1).max(65535),
  topic: z.string().nullish(),
  dp_size: z.number().int().min(1).max(4096).nullish(),
  publishers: z.array(z.unknown()).nullish(),
});
// The load range (load_endpoint_port_base, load_topic) is SGLang's load publisher's, not KV events: known, not read.
const SGLANG_KEYS = new Set(["publisher", "endpoint_host", "endpoint_port_base", "topic", "dp_size", "publishers", "block_size", "load_endpoint_port_base", "load_topic"]);

/** `/server_info`'s `kv_events`, for a server without `/kv_event_sources` (`missing`: that route, for the error). */
async function readSglang(url: URL, o: ReadOptions, missing: URL): Promise<ReportedSources> {
  const target = new URL("/server_info", url);
  const res = await get(target, o);
  if (!res.ok) throw new ReportedSourcesError(`${missing}: HTTP 404, and ${target}: HTTP ${res.status} (neither vLLM's report nor SGLang's)`);
  const body = (await res.json().catch(() => undefined)) as { kv_events?: unknown; nnodes?: unknown } | undefined;
  if (body === undefined || body === null || typeof body !== "object" || !("kv_events" in body))
    throw new ReportedSourcesError(`${target}: no kv_events descriptor (an SGLang before #25844, or not SGLang)`);
  // null: the server publishes no KV events.
  if (body.kv_events === null) return { sources: [], skipped: 0, unknownFields: 0 };
  const p = SglangKvEvents.safeParse(body.kv_events);
  if (!p.success) throw new ReportedSourcesError(`${target}: kv_events is not a publisher descriptor: ${p.error.issues[0]?.message ?? "invalid"}`);
  const d = p.data;
  const unknownFields = Object.keys(d).filter((k) => !SGLANG_KEYS.has(k)).length;
  if (d.publisher !== "zmq") return { sources: [], skipped: 1, unknownFields };
  const topic = d.topic ?? "";
  const raw: RawSource[] = [];
  let skipped = 0;
  if (d.publishers) {
    // Each rank's own endpoint (multi-node DP ranks live on other hosts than base + rank on this one).
    for (const item of d.publishers) {
      const e = SglangPublisher.safeParse(item);
      if (e.success) raw.push({ rank: e.data.dp_rank, endpoint: e.data.endpoint, replay: null, topic });
      else skipped++;
    }
  } else {
    const nodes = typeof body.nnodes === "number" ? body.nnodes : 1;
    if (nodes > 1 && (d.dp_size ?? 1) > 1)
      throw new UnusableReportError(
        `${target}: ${d.dp_size} DP ranks over ${nodes} nodes, and kv_events names one host for all of them: ranks on other nodes publish there, on base + their global rank; state the ranks per node (static dpStartRank, or the pods' start-rank annotation) instead`,
      );
    const host = bracketHost(d.endpoint_host);
    for (let rank = 0; rank < (d.dp_size ?? 1); rank++) {
      if (d.endpoint_port_base + rank > 65535) {
        skipped++;
        continue;
      }
      raw.push({ rank, endpoint: `tcp://${host}:${d.endpoint_port_base + rank}`, replay: null, topic });
    }
  }
  return finish(raw, url.hostname, skipped, unknownFields);
}

// ---- gRPC (vLLM #50033) ---------------------------------------------------------------------------

// vLLM's rust/proto/control.proto, the messages this reader needs (field numbers as there). Field 2 is
// declared bytes so both of its revisions can be read (a URI string, or an endpoint message).
const PROTO = `
syntax = "proto3";
package vllm;
message GetKvEventSourcesRequest {}
message GetKvEventSourcesResponse { repeated KvEventSource sources = 1; }
message KvEventSource {
  string transport = 1;
  bytes endpoint = 2;
  string topic = 3;
  string replay_endpoint = 4;
  optional uint32 data_parallel_rank = 5;
  string encoding = 6;
  uint32 schema_version = 7;
  uint32 buffer_steps = 8;
  uint32 hwm = 9;
  uint32 max_queue_size = 10;
}
message KvEventEndpoint { string host = 1; uint32 port = 2; string protocol = 3; }
`;
const root = protobuf.parse(PROTO, { keepCase: true }).root;
const Response_ = root.lookupType("vllm.GetKvEventSourcesResponse");
const Endpoint = root.lookupType("vllm.KvEventEndpoint");
/** The RPC's full path, for a server in tests too. */
export const GET_KV_EVENT_SOURCES = "/vllm.Control/GetKvEventSources";

type GrpcSource = { transport?: string; endpoint?: Uint8Array; topic?: string; replay_endpoint?: string; data_parallel_rank?: number };

function readGrpc(url: URL, o: ReadOptions): Promise<ReportedSources> {
  const creds = url.protocol === "grpcs:"
    ? grpc.credentials.createSsl(null, null, null, { checkServerIdentity: () => undefined, rejectUnauthorized: false })
    : grpc.credentials.createInsecure();
  const client = new grpc.Client(url.host, creds);
  return new Promise<ReportedSources>((resolve, reject) => {
    client.makeUnaryRequest<Uint8Array, GrpcResponse>(
      GET_KV_EVENT_SOURCES,
      () => Buffer.alloc(0), // GetKvEventSourcesRequest {}: no fields
      decodeGrpcResponse,
      new Uint8Array(0),
      { deadline: Date.now() + (o.timeoutMs ?? 5000) },
      (err, res) => {
        client.close();
        if (err || !res) return reject(new ReportedSourcesError(`${url.host} GetKvEventSources: ${err?.message ?? "no answer"}`));
        try {
          resolve(fromGrpc(res, url.hostname));
        } catch (e) {
          reject(e);
        }
      },
    );
  });
}

type GrpcResponse = { sources: GrpcSource[]; unknownFields: number };

function decodeGrpcResponse(bytes: Buffer): GrpcResponse {
  const msg = Response_.decode(bytes) as unknown as { sources?: GrpcSource[] };
  return { sources: msg.sources ?? [], unknownFields: unknownFieldsOf(bytes) };
}

/** Fields a newer server adds (protobufjs skips them silently): counted from the wire. */
function unknownFieldsOf(bytes: Uint8Array): number {
  let n = 0;
  const r = protobuf.Reader.create(bytes);
  while (r.pos < r.len) {
    const tag = r.uint32();
    if (tag >>> 3 === 1 && (tag & 7) === 2) {
      const inner = protobuf.Reader.create(r.bytes());
      while (inner.pos < inner.len) {
        const t = inner.uint32();
        if (t >>> 3 < 1 || t >>> 3 > 10) n++;
        inner.skipType(t & 7);
      }
    } else {
      n++;
      r.skipType(tag & 7);
    }
  }
  return n;
}

function fromGrpc(res: GrpcResponse, readHost: string): ReportedSources {
  const raw: RawSource[] = [];
  let skipped = 0;
  for (const s of res.sources) {
    const endpoint = s.endpoint && s.endpoint.length > 0 ? endpointOfField(s.endpoint) : undefined;
    if ((s.transport ?? "") !== "zmq" || endpoint === undefined) {
      skipped++;
      continue;
    }
    raw.push({ rank: s.data_parallel_rank ?? null, endpoint, replay: s.replay_endpoint || null, topic: s.topic ?? "" });
  }
  return finish(raw, readHost, skipped, res.unknownFields);
}

/** Field 2 of KvEventSource: a URI (`tcp://host:port`) or an endpoint message {host, port, protocol}. */
function endpointOfField(bytes: Uint8Array): string | undefined {
  const text = new TextDecoder("utf-8", { fatal: false }).decode(bytes);
  if (/^[a-z][a-z0-9+.-]*:\/\//i.test(text)) return text;
  try {
    const e = Endpoint.decode(bytes) as unknown as { host?: string; port?: number; protocol?: string };
    if (!e.host || !e.port) return undefined;
    return `${e.protocol || "tcp"}://${bracketHost(e.host)}:${e.port}`;
  } catch {
    return undefined;
  }
}

// ---- common ---------------------------------------------------------------------------------------

type RawSource = { rank: number | null; endpoint: string; replay: string | null; topic: string };

const WILDCARDS = new Set(["*", "0.0.0.0", "::", "", "[::]"]);

/** `tcp://*:5557` read from host h: `tcp://h:5557`; any other endpoint as reported. */
function dialable(endpoint: string, readHost: string): string {
  const m = /^(tcp:\/\/)(\[[^\]]*\]|[^:/]*)(:\d+)$/.exec(endpoint);
  if (!m) return endpoint;
  const host = endpointHost(`${m[2]}${m[3]}`);
  return WILDCARDS.has(host) || WILDCARDS.has(m[2]!) ? `${m[1]}${bracketHost(readHost.replace(/^\[|\]$/g, ""))}${m[3]}` : endpoint;
}

function finish(raw: RawSource[], readHost: string, skipped: number, unknownFields: number): ReportedSources {
  const sources: ReportedSource[] = [];
  for (const r of raw) {
    // A source without a rank is one for all ranks (events aggregated): rank 0 when it is the only one.
    const rank = r.rank ?? (raw.length === 1 ? 0 : undefined);
    if (rank === undefined || sources.some((s) => s.rank === rank)) {
      skipped++;
      continue;
    }
    sources.push({ rank, kvEvents: dialable(r.endpoint, readHost), replay: r.replay ? dialable(r.replay, readHost) : null, topic: r.topic });
  }
  sources.sort((a, b) => a.rank - b.rank);
  return { sources, skipped, unknownFields };
}
