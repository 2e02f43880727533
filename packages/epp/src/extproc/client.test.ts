// The gateway-side client against a real EPP: the route in both body modes, the load it holds until
// finish(), and an immediate response turned into a RoutingError.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import type { EppHandle } from "../main.ts";
import { FakeWorkerEvents, HOST, MODEL, startTestEpp, tokens } from "../../test/helpers.ts";
import { ExtProcClient, RoutingError } from "./client.ts";
import { framed, messageReader } from "./grpc-frames.ts";
import { continueResponse, routedHeaders, type ProcessingRequest, type ProcessingResponse } from "./messages.ts";
import { loadProtos } from "./protos.ts";
import { waitFor } from "@kv-epp/testkit";
import http2 from "node:http2";

const enc = new TextEncoder();
const body = (seed: number) => enc.encode(JSON.stringify({ model: MODEL, prompt: tokens(64, seed), max_tokens: 1 }));

let kv: FakeWorkerEvents;
let epp: EppHandle;
beforeAll(async () => {
  kv = await FakeWorkerEvents.start();
  epp = await startTestEpp([{ id: "w1", address: `${HOST}:18100`, kvEvents: kv.endpoint }]);
});
afterAll(async () => {
  await epp.stop({ graceMs: 0 });
  await kv.close();
});

describe("ExtProcClient", () => {
  test.each(["full-duplex", "buffered"] as const)("%s: routes, holds the request's load until finish()", async (mode) => {
    const client = new ExtProcClient(`${HOST}:${epp.ports.grpc}`, mode);
    try {
      const routed = await client.route("/v1/completions", body(1));
      expect(routed.endpoint).toBe(`${HOST}:18100`);
      expect(routed.pickMs).toBeGreaterThanOrEqual(0);
      expect(epp.load.inflight).toBe(1);
      await routed.finish(200);
      await waitFor(() => epp.load.inflight === 0, { message: "the request's load released" });
    } finally {
      client.close();
    }
  });

  test("an immediate response (400 for a body that is not JSON) is a RoutingError", async () => {
    const client = new ExtProcClient(`${HOST}:${epp.ports.grpc}`);
    try {
      const err = await client.route("/v1/completions", enc.encode("{not json")).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(RoutingError);
      expect(String(err)).toContain("BadRequest"); // envoy.type.v3.StatusCode 400, as its enum name
    } finally {
      client.close();
    }
  });
});

describe("ExtProcClient against a server that misbehaves", () => {
  const codec = loadProtos().extProc.service.Process!;
  /** An h2c server; `onStream` answers each stream. */
  async function serve(onStream: (stream: http2.ServerHttp2Stream, session: http2.Http2Session) => void) {
    const server = http2.createServer();
    server.on("stream", (stream: http2.ServerHttp2Stream) => onStream(stream, stream.session!));
    await new Promise<void>((resolve) => server.listen(0, HOST, resolve));
    return { server, address: `${HOST}:${(server.address() as { port: number }).port}` };
  }
  const answer = (stream: http2.ServerHttp2Stream, m: ProcessingResponse) => stream.write(framed(codec.responseSerialize(m) as Buffer));

  test("a gRPC status in a reply of headers alone is a RoutingError naming it; a grpc-message that does not decode is shown raw", async () => {
    const { server, address } = await serve((stream) =>
      stream.respond({ ":status": 200, "content-type": "application/grpc", "grpc-status": "12", "grpc-message": "no%E0such" }, { endStream: true }));
    const client = new ExtProcClient(address, "full-duplex", { tls: false });
    try {
      const err = await client.route("/v1/completions", body(1)).catch((e: unknown) => e);
      expect(err).toBeInstanceOf(RoutingError);
      expect(String(err)).toContain("gRPC status 12 no%E0such");
    } finally {
      client.close();
      server.close();
    }
  });

  test("after the server's GOAWAY the next route opens a new connection", async () => {
    const sessions = new Set<http2.Http2Session>();
    const { server, address } = await serve((stream, session) => {
      sessions.add(session);
      stream.respond({ ":status": 200, "content-type": "application/grpc" }, { waitForTrailers: true });
      stream.on("wantTrailers", () => stream.sendTrailers({ "grpc-status": "0" }));
      stream.on("data", messageReader((bytes) => {
        const m = codec.requestDeserialize(bytes) as ProcessingRequest;
        if (m.request_body) {
          answer(stream, routedHeaders({ endpoint: "10.0.0.1:8000" }));
          session.goaway(); // draining: this stream finishes, no new one is taken
        } else if (m.response_headers) answer(stream, continueResponse("response_headers"));
        else if (m.response_body) {
          answer(stream, continueResponse("response_body"));
          stream.end();
        }
        return true;
      }));
    });
    const client = new ExtProcClient(address, "full-duplex", { tls: false });
    try {
      // The GOAWAY follows the first route's answer, so it is read before that request has finished.
      for (let i = 0; i < 2; i++) {
        const routed = await client.route("/v1/completions", body(i));
        expect(routed.endpoint).toBe("10.0.0.1:8000");
        await routed.finish(200);
      }
      expect(sessions.size).toBe(2);
    } finally {
      client.close();
      server.close();
    }
  });
});
