// Reading a worker's KV-event sources as vLLM reports them: its API server's `GET /kv_event_sources`
// (vLLM #55844) and its gRPC server's `vllm.Control/GetKvEventSources` (vLLM #50033), over real HTTP and
// real gRPC (grpc-js). The gRPC answers are protobuf bytes written field by field as vLLM's server
// (prost) writes them, in both revisions of the endpoint field.
import { LOOPBACK } from "@kv-epp/testkit";
import { afterAll, describe, expect, test } from "bun:test";
import * as grpc from "@grpc/grpc-js";
import protobuf from "protobufjs";
import { GET_KV_EVENT_SOURCES, readReportedSources, ReportedSourcesError, UnusableReportError } from "../src/index.ts";

const cleanups: (() => unknown)[] = [];
afterAll(async () => {
  for (const c of cleanups.reverse()) await c();
});

function httpServer(answer: unknown, status = 200) {
  const srv = Bun.serve({
    hostname: `${LOOPBACK}.7.21`, port: 0,
    fetch: (req) => (new URL(req.url).pathname === "/kv_event_sources" ? Response.json(answer, { status }) : new Response(null, { status: 404 })),
  });
  cleanups.push(() => srv.stop(true));
  return `http://${LOOPBACK}.7.21:${srv.port}`;
}

describe("GET /kv_event_sources (vLLM #55844)", () => {
  test("reads each rank's endpoint, replay and topic; a wildcard host becomes the host the report came from", async () => {
    const from = httpServer({
      sources: [
        { data_parallel_rank: 1, endpoint: "tcp://0.0.0.0:41002", replay_endpoint: null, topic: "kv" },
        { data_parallel_rank: 0, endpoint: "tcp://10.1.2.3:41001", replay_endpoint: "tcp://*:41003", topic: "kv" },
      ],
    });
    const r = await readReportedSources(from);
    expect(r.sources).toEqual([
      { rank: 0, kvEvents: "tcp://10.1.2.3:41001", replay: `tcp://${LOOPBACK}.7.21:41003`, topic: "kv" },
      { rank: 1, kvEvents: `tcp://${LOOPBACK}.7.21:41002`, replay: null, topic: "kv" },
    ]);
    expect(r.skipped + r.unknownFields).toBe(0);
  });

  test("the earlier bare-list answer is read too; unknown keys are counted, a malformed entry skipped", async () => {
    const from = httpServer([
      { data_parallel_rank: 0, endpoint: "tcp://10.1.2.3:5557", topic: "", hwm: 100000 },
      { data_parallel_rank: 1 },
    ]);
    const r = await readReportedSources(from);
    expect(r.sources).toEqual([{ rank: 0, kvEvents: "tcp://10.1.2.3:5557", replay: null, topic: "" }]);
    expect(r).toMatchObject({ skipped: 1, unknownFields: 1 });
  });

  test("a server without the route (a vLLM before #55844) is a clear error", async () => {
    const srv = Bun.serve({ hostname: `${LOOPBACK}.7.21`, port: 0, fetch: () => new Response("Not Found", { status: 404 }) });
    cleanups.push(() => srv.stop(true));
    await expect(readReportedSources(`http://${LOOPBACK}.7.21:${srv.port}`)).rejects.toThrow(ReportedSourcesError);
  });
});

describe("SGLang's GET /server_info kv_events (sglang #25844), for a server without /kv_event_sources", () => {
  function sglang(kvEvents: unknown, serverArgs: Record<string, unknown> = {}) {
    const srv = Bun.serve({
      hostname: `${LOOPBACK}.7.21`, port: 0,
      fetch: (req) => (new URL(req.url).pathname === "/server_info" ? Response.json({ model_path: "m", ...serverArgs, kv_events: kvEvents }) : new Response(null, { status: 404 })),
    });
    cleanups.push(() => srv.stop(true));
    return `http://${LOOPBACK}.7.21:${srv.port}`;
  }

  test("a host and a base port: rank r on base + r, a wildcard host the one the report came from", async () => {
    // With --load-publish-endpoint, SGLang adds its load range to the descriptor: known keys, not KV events.
    const r = await readReportedSources(sglang({ publisher: "zmq", endpoint_host: "*", endpoint_port_base: 5557, topic: "kv", block_size: 64, dp_size: 2, load_endpoint_port_base: 5559, load_topic: "load" }));
    expect(r.sources).toEqual([
      { rank: 0, kvEvents: `tcp://${LOOPBACK}.7.21:5557`, replay: null, topic: "kv" },
      { rank: 1, kvEvents: `tcp://${LOOPBACK}.7.21:5558`, replay: null, topic: "kv" },
    ]);
    expect(r.skipped + r.unknownFields).toBe(0);
  });

  test("a publishers list (each rank's own endpoint) wins over the base port; an entry without a rank is skipped", async () => {
    const r = await readReportedSources(sglang({
      publisher: "zmq", endpoint_host: "*", endpoint_port_base: 5557, dp_size: 8,
      publishers: [{ dp_rank: 4, endpoint: "tcp://10.0.0.2:5561" }, { dp_rank: 0, endpoint: "tcp://10.0.0.1:5557" }, { endpoint: "tcp://10.0.0.3:5557" }],
    }));
    expect(r.sources).toEqual([
      { rank: 0, kvEvents: "tcp://10.0.0.1:5557", replay: null, topic: "" },
      { rank: 4, kvEvents: "tcp://10.0.0.2:5561", replay: null, topic: "" },
    ]);
    expect(r.skipped).toBe(1);
  });

  test("DP ranks over several nodes are refused (one host cannot place them), not retried; one rank over several nodes is on the head's host", async () => {
    // /server_info carries the server args beside the descriptor: nnodes 2, DP attention with 4 ranks.
    const multi = sglang({ publisher: "zmq", endpoint_host: "*", endpoint_port_base: 5557, topic: "", block_size: 16, dp_size: 4 }, { nnodes: 2, node_rank: 0, dp_size: 4 });
    const err = await readReportedSources(multi).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(UnusableReportError);
    expect(err).not.toBeInstanceOf(ReportedSourcesError);
    expect((err as Error).message).toMatch(/4 DP ranks over 2 nodes/);
    // Pure TP over two nodes: the one publisher is tensor rank 0's, on the node serving /server_info.
    const tp = await readReportedSources(sglang({ publisher: "zmq", endpoint_host: "*", endpoint_port_base: 5557, topic: "", block_size: 16, dp_size: 1 }, { nnodes: 2 }));
    expect(tp.sources).toEqual([{ rank: 0, kvEvents: `tcp://${LOOPBACK}.7.21:5557`, replay: null, topic: "" }]);
  });

  test("null (no KV events) reports none; another publisher is skipped; a malformed descriptor is a clear error", async () => {
    expect(await readReportedSources(sglang(null))).toEqual({ sources: [], skipped: 0, unknownFields: 0 });
    expect(await readReportedSources(sglang({ publisher: "nats", endpoint_host: "h", endpoint_port_base: 1 }))).toMatchObject({ sources: [], skipped: 1 });
    await expect(readReportedSources(sglang({ publisher: "zmq", endpoint_port_base: "x" }))).rejects.toThrow(/not a publisher descriptor/);
  });
});

// ---- gRPC ----

/** KvEventSource as prost writes it: fields in number order, proto3 defaults (empty, 0) left out. */
function source(f: { transport?: string; endpoint?: string; endpointAddr?: { host: string; port: number; protocol?: string }; topic?: string; replay?: string; rank?: number; encoding?: string; schemaVersion?: number; extra?: boolean }): Uint8Array {
  const w = protobuf.Writer.create();
  if (f.transport) w.uint32((1 << 3) | 2).string(f.transport);
  if (f.endpoint) w.uint32((2 << 3) | 2).string(f.endpoint);
  if (f.endpointAddr) {
    const e = protobuf.Writer.create();
    e.uint32((1 << 3) | 2).string(f.endpointAddr.host).uint32((2 << 3) | 0).uint32(f.endpointAddr.port);
    if (f.endpointAddr.protocol) e.uint32((3 << 3) | 2).string(f.endpointAddr.protocol);
    w.uint32((2 << 3) | 2).bytes(e.finish());
  }
  if (f.topic) w.uint32((3 << 3) | 2).string(f.topic);
  if (f.replay) w.uint32((4 << 3) | 2).string(f.replay);
  if (f.rank !== undefined) w.uint32((5 << 3) | 0).uint32(f.rank); // optional: written even when 0
  if (f.encoding) w.uint32((6 << 3) | 2).string(f.encoding);
  if (f.schemaVersion) w.uint32((7 << 3) | 0).uint32(f.schemaVersion);
  if (f.extra) w.uint32((11 << 3) | 0).uint32(7); // a field a newer server adds
  return w.finish();
}

function response(sources: Uint8Array[]): Buffer {
  const w = protobuf.Writer.create();
  for (const s of sources) w.uint32((1 << 3) | 2).bytes(s);
  return Buffer.from(w.finish());
}

async function grpcServer(answer: Buffer | grpc.StatusObject): Promise<string> {
  const server = new grpc.Server();
  server.addService({
    GetKvEventSources: {
      path: GET_KV_EVENT_SOURCES, requestStream: false, responseStream: false,
      requestSerialize: (b: Buffer) => b, requestDeserialize: (b: Buffer) => b,
      responseSerialize: (b: Buffer) => b, responseDeserialize: (b: Buffer) => b,
      originalName: "GetKvEventSources",
    },
  } as unknown as grpc.ServiceDefinition, {
    GetKvEventSources: (_call: unknown, cb: grpc.sendUnaryData<Buffer>) => (Buffer.isBuffer(answer) ? cb(null, answer) : cb(answer, null)),
  });
  const port = await new Promise<number>((resolve, reject) =>
    server.bindAsync(`${LOOPBACK}.7.22:0`, grpc.ServerCredentials.createInsecure(), (err, p) => (err ? reject(err) : resolve(p))));
  cleanups.push(() => new Promise<void>((done) => server.tryShutdown(() => done())));
  return `grpc://${LOOPBACK}.7.22:${port}`;
}

describe("vllm.Control/GetKvEventSources (vLLM #50033)", () => {
  test("the endpoint as configured (string field), one source per rank, rank 0 written explicitly", async () => {
    const from = await grpcServer(response([
      source({ transport: "zmq", endpoint: "tcp://*:5557", topic: "kv", replay: "tcp://*:5657", rank: 0, encoding: "msgpack", schemaVersion: 1 }),
      source({ transport: "zmq", endpoint: "tcp://*:5558", topic: "kv", replay: "tcp://*:5658", rank: 1, encoding: "msgpack", schemaVersion: 1 }),
    ]));
    const r = await readReportedSources(from);
    expect(r.sources).toEqual([
      { rank: 0, kvEvents: `tcp://${LOOPBACK}.7.22:5557`, replay: `tcp://${LOOPBACK}.7.22:5657`, topic: "kv" },
      { rank: 1, kvEvents: `tcp://${LOOPBACK}.7.22:5558`, replay: `tcp://${LOOPBACK}.7.22:5658`, topic: "kv" },
    ]);
    expect(r.skipped + r.unknownFields).toBe(0);
  });

  test("the later {host, port, protocol} endpoint message in the same field is read too", async () => {
    const from = await grpcServer(response([source({ transport: "zmq", endpointAddr: { host: "10.0.0.9", port: 40123, protocol: "tcp" }, rank: 2 })]));
    expect((await readReportedSources(from)).sources).toEqual([{ rank: 2, kvEvents: "tcp://10.0.0.9:40123", replay: null, topic: "" }]);
  });

  test("another transport is skipped, an unknown field counted; one source without a rank is rank 0", async () => {
    const from = await grpcServer(response([
      source({ transport: "nats", endpoint: "nats://bus:4222", rank: 0 }),
      source({ transport: "zmq", endpoint: "tcp://10.0.0.9:5557", extra: true }),
    ]));
    const r = await readReportedSources(from);
    expect(r.sources).toEqual([{ rank: 0, kvEvents: "tcp://10.0.0.9:5557", replay: null, topic: "" }]);
    expect(r).toMatchObject({ skipped: 1, unknownFields: 1 });
  });

  test("UNIMPLEMENTED (a server without the RPC) is a clear error", async () => {
    const from = await grpcServer({ code: grpc.status.UNIMPLEMENTED, details: "GetKvEventSources", metadata: new grpc.Metadata() });
    await expect(readReportedSources(from)).rejects.toThrow(/GetKvEventSources/);
  });
});
