// Property tests of ext_proc against an in-process EPP over real HTTP/2: random sequences of every
// ProcessingRequest case (and empty, truncated and garbage messages) in every body mode, each on its
// own stream. Whatever arrives, the stream ends (answered or with a gRPC status), every answer is a
// ProcessingResponse, the request's load is released, and the EPP serves a good request afterwards.
import { afterAll, beforeAll, expect, test } from "bun:test";
import fc from "fast-check";
import http2 from "node:http2";
import { waitFor, LOOPBACK } from "@kv-epp/testkit";
import type { ProcessingRequest } from "../src/extproc/messages.ts";
import { loadProtos } from "../src/extproc/protos.ts";
import type { EppHandle } from "../src/main.ts";
import { FakeWorkerEvents, body, extProcClient, headers, rawExtProcSession, setHeader, startTestEpp, tokens } from "./helpers.ts";
import { grpcFrame } from "./hostile-peers.ts";

const method = loadProtos().extProc.service.Process!;
const serialize = (m: ProcessingRequest) => Buffer.from(method.requestSerialize(m));
const MODES = ["NONE", "STREAMED", "BUFFERED", "BUFFERED_PARTIAL", "FULL_DUPLEX_STREAMED", "GRPC"] as const;

let ev: FakeWorkerEvents;
let epp: EppHandle;

beforeAll(async () => {
  ev = await FakeWorkerEvents.start();
  epp = await startTestEpp([{ id: "worker-a", address: `${LOOPBACK}.4.61:8000`, kvEvents: ev.endpoint }]);
});

afterAll(async () => {
  await epp?.stop({ graceMs: 500 });
  await ev?.close();
});

const enc = new TextEncoder();
const bodyBytes = fc.oneof(
  fc.constant(enc.encode(JSON.stringify({ prompt: tokens(40, 3) }))),
  fc.constant(enc.encode(JSON.stringify({ messages: [{ role: "user", content: "hello there" }] }))),
  fc.constant(enc.encode(`{"prompt":${"[".repeat(5000)}${"]".repeat(5000)}}`)),
  fc.string({ maxLength: 40 }).map((s) => enc.encode(s)),
  fc.constant(new Uint8Array(0)),
);
const headerMap = { headers: [{ key: ":status", raw_value: enc.encode("200") }] };

/** One wire message: a ProcessingRequest of any case, or bytes that are not quite one. */
const wireMessage = fc.oneof(
  fc.record({ eos: fc.boolean() }).map(({ eos }) => serialize(headers("/v1/completions", eos))),
  fc.record({ b: bodyBytes, eos: fc.boolean() }).map(({ b, eos }) => serialize({ request_body: { body: b, end_of_stream: eos } })),
  fc.constant(serialize({ request_trailers: { trailers: headerMap } })),
  fc.boolean().map((eos) => serialize({ response_headers: { headers: headerMap, end_of_stream: eos } })),
  fc.record({ b: bodyBytes, eos: fc.boolean() }).map(({ b, eos }) => serialize({ response_body: { body: b, end_of_stream: eos } })),
  fc.constant(serialize({ response_trailers: { trailers: headerMap } })),
  fc.constant(Buffer.alloc(0)), // the empty message: no request case
  // A message cut short, or random bytes: most do not parse; some parse as another message.
  fc.record({ cut: fc.nat() }).map(({ cut }) => {
    const full = serialize({ request_body: { body: enc.encode('{"prompt":[1,2,3]}'), end_of_stream: true } });
    return full.subarray(0, cut % full.length);
  }),
  fc.uint8Array({ maxLength: 24 }).map((b) => Buffer.from(b)),
);

/** The first message may say the body mode and observability (as Envoy's protocol_config does). */
const firstMessage = fc.record({
  mode: fc.option(fc.constantFrom(...MODES), { nil: undefined }),
  observe: fc.boolean(),
  eos: fc.boolean(),
});

/** Sends the frames on one stream, then half-closes or resets; the answers and the final grpc-status. */
function exchange(session: http2.ClientHttp2Session, frames: Buffer[], leave: "end" | "reset") {
  return new Promise<{ answers: Buffer; status: string | undefined }>((resolve) => {
    const req = session.request({ ":method": "POST", ":path": method.path, "content-type": "application/grpc", te: "trailers" });
    const chunks: Buffer[] = [];
    let status: string | undefined;
    req.on("response", (h) => (status ??= h["grpc-status"] as string | undefined));
    req.on("trailers", (t) => (status = t["grpc-status"] as string));
    req.on("data", (d: Buffer) => chunks.push(d));
    req.on("error", () => {});
    req.on("close", () => resolve({ answers: Buffer.concat(chunks), status }));
    for (const f of frames) req.write(f);
    if (leave === "end") req.end();
    else setTimeout(() => req.close(http2.constants.NGHTTP2_CANCEL), 5);
  });
}

/** Every length-prefixed message in `bytes` decodes as a ProcessingResponse; how many there were. */
function decodeAll(bytes: Buffer): number {
  let n = 0;
  for (let off = 0; off < bytes.length; n++) {
    const len = bytes.readUInt32BE(off + 1);
    method.responseDeserialize(bytes.subarray(off + 5, off + 5 + len));
    off += 5 + len;
  }
  return n;
}

test("any sequence of messages, in any body mode: the stream ends, answers decode, load is released", async () => {
  const session = rawExtProcSession(epp.ports.grpc);
  session.on("error", () => {});
  await fc.assert(
    fc.asyncProperty(firstMessage, fc.array(wireMessage, { maxLength: 8 }), fc.constantFrom("end", "reset"), async (first, rest, leave) => {
      const opening: ProcessingRequest = { ...headers("/v1/completions", first.eos), observability_mode: first.observe };
      if (first.mode) opening.protocol_config = { request_body_mode: first.mode, response_body_mode: first.mode };
      const { answers, status } = await exchange(session, [serialize(opening), ...rest].map(grpcFrame), leave);
      // 12 (UNIMPLEMENTED): GRPC body mode, refused at stream start.
      if (leave === "end") expect(["0", "3", "12", "13"]).toContain(status!);
      decodeAll(answers);
      await waitFor(() => epp.load.inflight === 0, { timeoutMs: 5000, message: "load released" });
    }),
    { numRuns: 150 },
  );
  session.destroy();
  const c = extProcClient(epp.ports.grpc);
  const s = c.open();
  s.send(headers());
  s.send(body({ prompt: tokens(40, 3) }));
  expect(setHeader((await s.next()).request_headers?.response, "x-gateway-destination-endpoint")).toBe(`${LOOPBACK}.4.61:8000`);
  s.end();
  c.close();
});

test("each case out of order ends its stream with INVALID_ARGUMENT: a body or trailers before headers, headers while a body is awaited", async () => {
  const session = rawExtProcSession(epp.ports.grpc);
  const bodyMsg = serialize({ request_body: { body: enc.encode("{}"), end_of_stream: true } });
  const trailers = serialize({ request_trailers: { trailers: headerMap } });
  const awaiting = serialize(headers("/v1/completions", false));
  for (const frames of [[bodyMsg], [trailers], [awaiting, awaiting], [awaiting, serialize({ request_body: { body: enc.encode("{"), end_of_stream: false } }), awaiting]])
    expect((await exchange(session, frames.map(grpcFrame), "end")).status).toBe("3");
  session.destroy();
  expect(epp.load.inflight).toBe(0);
});
