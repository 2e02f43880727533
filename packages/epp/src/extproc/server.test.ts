// The stream state machine on a call made here (no transport): a tokenization that never settles keeps
// the route pending, so what a stream may send meanwhile is bounded deterministically; a one-worker pool
// shows which answer kind carries the route for each message sequence Envoy sends.
import { EventEmitter } from "node:events";
import { describe, expect, test } from "bun:test";
import { KvIndex } from "@kv-epp/index-wasm";
import { readBody, type BodyFields, type BodyRequest } from "@kv-epp/tokenizer";
import type { RoutedBody } from "../tokens.ts";
import { workerKey } from "@kv-epp/protocol";
import { ActiveLoad, LatencyModel, NO_METRICS, Picker, type Candidate, type RoutingContext } from "@kv-epp/routing";
import pino from "pino";
import { createMetrics } from "../metrics.ts";
import { BodyBudget } from "./body-budget.ts";
import { GrpcStatus } from "./grpc-h2.ts";
import type { BodySendMode, ProcessingRequest, ProcessingResponse } from "./messages.ts";
import { loadProtos } from "./protos.ts";
import { createProcessHandler, type ExtProcDeps } from "./server.ts";

class FakeCall extends EventEmitter {
  failed: { code: number; message: string } | undefined;
  readonly written: ProcessingResponse[] = [];
  write(msg: ProcessingResponse): void {
    this.written.push(msg);
  }
  end(): void {}
  fail(code: number, message: string): void {
    this.failed = { code, message };
    this.emit("cancelled");
  }
}

const serialize = loadProtos().extProc.service.Process!.requestSerialize as (m: ProcessingRequest) => Buffer;
/** A message's encoded length, as the transport hands it on with the message. */
const wireBytes = (m: ProcessingRequest) => serialize(m).length;

/** A full-duplex stream whose body (15 bytes) is in, its route pending for good, against a 1 MiB body budget. */
function pendingRoute() {
  const bodyBudget = new BodyBudget(1 << 20);
  const handle = createProcessHandler({
    routing: { load: { inflight: 0 } } as unknown as RoutingContext,
    tokenizeBody: () => new Promise(() => {}), // the route stays pending
    metrics: createMetrics(),
    log: pino({ level: "silent" }),
    bodyMode: "auto",
    maxInflight: 0,
    bodyBudget,
  });
  const call = new FakeCall();
  handle(call as never);
  const data = (m: ProcessingRequest) => call.emit("data", m, wireBytes(m));
  data({ request: "request_headers", request_headers: { headers: { headers: [] } }, protocol_config: { request_body_mode: "FULL_DUPLEX_STREAMED" } });
  data({ request: "request_body", request_body: { body: new TextEncoder().encode('{"prompt":"hi"}'), end_of_stream: true } });
  return { bodyBudget, call, data };
}

test("a stream that sends more than 256 messages while its route is pending fails with RESOURCE_EXHAUSTED, its body's bytes given back", () => {
  const { bodyBudget, call, data } = pendingRoute();
  expect(bodyBudget.usedBytes).toBe(15);
  const trailers: ProcessingRequest = { request: "request_trailers", request_trailers: { trailers: { headers: [] } } };
  for (let i = 0; i < 256; i++) data(trailers);
  expect(call.failed).toBeUndefined();
  data(trailers);
  expect(call.failed?.code).toBe(GrpcStatus.RESOURCE_EXHAUSTED);
  expect(bodyBudget.usedBytes).toBe(0);
});

test("a message held while the route is pending is charged what it may take decoded: trailers of many entries fail the stream once the budget for such messages is spent, every byte given back", () => {
  const { bodyBudget, call, data } = pendingRoute();
  // A few trailers are held, charged 32 times their encoded length (header entries decode to objects).
  const few: ProcessingRequest = { request: "request_trailers", request_trailers: { trailers: { headers: [{ key: "x-a", raw_value: new Uint8Array([49]) }] } } };
  data(few);
  expect(bodyBudget.usedBytes).toBe(15 + 32 * wireBytes(few));
  expect(call.failed).toBeUndefined();
  // 20,000 empty entries: 40 KB encoded, over 1 MiB charged, past the 1 MiB budget with the held message before it.
  data({ request: "request_trailers", request_trailers: { trailers: { headers: Array.from({ length: 20_000 }, () => ({ key: "" })) } } });
  expect(call.failed?.code).toBe(GrpcStatus.RESOURCE_EXHAUSTED);
  expect(bodyBudget.usedBytes).toBe(0);
});

test("a body sent while the route is pending is held within the body budget: past it the stream fails with RESOURCE_EXHAUSTED, every byte given back", () => {
  const { bodyBudget, call, data } = pendingRoute();
  // Envoy sends nothing more of the request after its end: a client that does is held to the budget.
  const body: ProcessingRequest = { request: "request_body", request_body: { body: new Uint8Array(100_000), end_of_stream: false } };
  data(body);
  // The body's bytes, and the few around it at what they may decode to.
  expect(bodyBudget.usedBytes).toBe(15 + 100_000 + 32 * (wireBytes(body) - 100_000));
  expect(call.failed).toBeUndefined();
  data({ request: "request_body", request_body: { body: new Uint8Array(2 << 20), end_of_stream: false } });
  expect(call.failed?.code).toBe(GrpcStatus.RESOURCE_EXHAUSTED);
  expect(bodyBudget.usedBytes).toBe(0);
});

const ENDPOINT = "10.0.0.1:8000";

/**
 * A stream against a one-worker pool (every request goes there), its answers recorded. `mode`: the request body mode
 * its protocol_config says (undefined: it sends none, the flags' modes apply); `responses`: the gateway's response
 * body mode (default none sent); `path`: the request's :path.
 */
/** `opts.handle`: another stream of a handler routedStream returned (its server's shared state with it). */
function routedStream(mode: BodySendMode | undefined, deps: Partial<ExtProcDeps> = {}, opts: { responses?: BodySendMode; path?: string; handle?: (call: never) => void } = {}) {
  const candidates: Candidate[] = [{ workerId: "w", dpRank: 0, key: workerKey({ workerId: "w", dpRank: 0 }), endpoint: ENDPOINT, rankHeader: undefined }];
  const index = KvIndex.create({ blockSize: 16 });
  const load = new ActiveLoad();
  const latency = new LatencyModel();
  const picker = new Picker({
    indexers: { lookup: () => ({ key: "m", blockSize: 16, index }) },
    candidates: () => candidates,
    load,
    signals: () => undefined,
    options: { prefillLoadScale: 16, decodeLoadScale: 1, queueWeight: 0, temperature: 0, shape: { kind: "blocks" }, queueThreshold: 0, cost: "weights" },
    latency,
  });
  const routing: RoutingContext = { picker, load, latency, metrics: NO_METRICS, candidates: () => candidates, clock: { now: () => 0 } };
  const handle = opts.handle ?? createProcessHandler({
    routing,
    tokenizeBody: () => {
      throw new Error("no body to read");
    },
    metrics: createMetrics(),
    log: pino({ level: "silent" }),
    bodyMode: "auto",
    maxInflight: 0,
    bodyBudget: new BodyBudget(1 << 20),
    ...deps,
  });
  const call = new FakeCall();
  handle(call as never);
  const data = (m: ProcessingRequest) => call.emit("data", m, wireBytes(m));
  const headers = opts.path === undefined ? [] : [{ key: ":path", raw_value: new TextEncoder().encode(opts.path) }];
  const protocolConfig = mode === undefined ? {} : { protocol_config: { request_body_mode: mode, ...(opts.responses ? { response_body_mode: opts.responses } : {}) } };
  data({ request: "request_headers", request_headers: { headers: { headers } }, ...protocolConfig });
  return { call, data, handle };
}

type Answer = { request_headers?: { response?: { header_mutation?: { set_headers?: { header: { key: string } }[] } } }; dynamic_metadata?: unknown };
const kinds = (written: ProcessingResponse[]) => written.map((m) => Object.keys(m).find((k) => k !== "dynamic_metadata"));
const lbEndpoint = (m: ProcessingResponse | undefined) =>
  (m?.dynamic_metadata as { fields: Record<string, { structValue: { fields: Record<string, { stringValue: string }> } }> } | undefined)?.fields["envoy.lb"]?.structValue.fields[
    "x-gateway-destination-endpoint"
  ]?.stringValue;
const trailers: ProcessingRequest = { request: "request_trailers", request_trailers: { trailers: { headers: [] } } };

test("BUFFERED, headers then trailers and no body: the route is the trailers' answer (envoy.lb metadata), never a body answer Envoy would drop as spurious", () => {
  for (const mode of ["BUFFERED", "BUFFERED_PARTIAL"] as const) {
    const { call, data } = routedStream(mode);
    expect(kinds(call.written)).toEqual(["request_headers"]); // CONTINUE: the body is awaited
    data(trailers);
    expect(kinds(call.written)).toEqual(["request_headers", "request_trailers"]);
    expect(lbEndpoint(call.written[1])).toBe(ENDPOINT);
  }
});

test("FULL_DUPLEX_STREAMED, headers then trailers and no body: the route sets no content-length (GAIE sets it only for a non-empty body)", () => {
  const { call, data } = routedStream("FULL_DUPLEX_STREAMED");
  data(trailers);
  expect(kinds(call.written)).toEqual(["request_headers", "request_trailers"]);
  const set = (call.written[0] as Answer).request_headers?.response?.header_mutation?.set_headers ?? [];
  expect(set.map((h) => h.header.key)).toContain("x-gateway-destination-endpoint");
  expect(set.map((h) => h.header.key)).not.toContain("content-length");
});

test("under InferenceModelRewrite rules, a body not held before the route is counted rules_not_applied, and one over the body budget is refused (429), not sent naming a model a rule may rewrite", async () => {
  const rules = { exact: new Map([["alias", { rewrite: "canary", targets: [{ modelRewrite: "target" }] }]]) };
  const metrics = createMetrics();
  const count = async () => (await metrics.registry.getSingleMetric("dynamo_epp_model_rewrites_total")!.get()).values.find((v) => v.labels.result === "rules_not_applied")?.value ?? 0;
  // STREAMED: the route goes on the headers, the body after it as the client wrote it.
  const streamed = routedStream("STREAMED", { metrics, rewriteRules: () => rules });
  expect(kinds(streamed.call.written)).toEqual(["request_headers"]);
  expect(await count()).toBe(1);
  // Without rules nothing is counted.
  routedStream("STREAMED", { metrics });
  expect(await count()).toBe(1);
  // Full duplex, a 40-byte budget another stream's body already holds: this one's first chunk cannot be held.
  const bodyBudget = new BodyBudget(40);
  const chunk = (): ProcessingRequest => ({ request: "request_body", request_body: { body: new TextEncoder().encode('{"model":"alias","prompt":"hi"}'), end_of_stream: false } });
  routedStream("FULL_DUPLEX_STREAMED", { bodyBudget }).data(chunk());
  const over = routedStream("FULL_DUPLEX_STREAMED", { rewriteRules: () => rules, bodyBudget });
  over.data(chunk());
  expect((over.call.written[0] as { immediate_response?: { status?: { code?: number } } }).immediate_response?.status?.code).toBe(429);
});

test("FULL_DUPLEX_STREAMED, a body in chunks is joined once into shared memory for its reading (a pool member reads it without a copy), and forwarded as sent", () => {
  const seen: Uint8Array[] = [];
  const { call, data } = routedStream("FULL_DUPLEX_STREAMED", {
    tokenizeBody: (req) => (seen.push(req.body), { fields: { kind: "none" }, tokens: new Uint32Array(0), body: req.body, rewritten: false }),
  });
  const sent = ['{"model":"m",', '"prompt":', '"hi"}'].map((s) => new TextEncoder().encode(s));
  sent.forEach((body, i) => data({ request: "request_body", request_body: { body, end_of_stream: i === sent.length - 1 } }));
  expect(seen).toHaveLength(1);
  expect(seen[0]!.buffer).toBeInstanceOf(SharedArrayBuffer);
  expect(new TextDecoder().decode(seen[0])).toBe('{"model":"m","prompt":"hi"}');
  type Streamed = { request_body?: { response?: { body_mutation?: { streamed_response?: { body: Uint8Array } } } } };
  const forwarded = call.written.map((m) => (m as Streamed).request_body?.response?.body_mutation?.streamed_response?.body).filter((b) => b !== undefined);
  expect(new TextDecoder().decode(Buffer.concat(forwarded))).toBe('{"model":"m","prompt":"hi"}');
  // A body in one chunk is that chunk, not copied here (the pool copies what it sends of one).
  const one: Uint8Array[] = [];
  const whole = routedStream("FULL_DUPLEX_STREAMED", { tokenizeBody: (req) => (one.push(req.body), { fields: { kind: "none" }, tokens: new Uint32Array(0), body: req.body, rewritten: false }) });
  const body = new TextEncoder().encode('{"prompt":"hi"}');
  whole.data({ request: "request_body", request_body: { body, end_of_stream: true } });
  expect(one[0]).toBe(body);
});

test("FULL_DUPLEX_STREAMED, a body past the body budget is routed unread: joined plainly, not into shared memory, and forwarded as sent", () => {
  // A 40-byte budget another stream's 25 bytes partly hold: this one's first chunk is held, its second is not,
  // so the route goes now, by load, on the two chunks joined.
  const bodyBudget = new BodyBudget(40);
  routedStream("FULL_DUPLEX_STREAMED", { bodyBudget }).data({ request: "request_body", request_body: { body: new Uint8Array(25), end_of_stream: false } });
  const sent = ['{"model":"m",', '"prompt":', '"hi"}'].map((s) => new TextEncoder().encode(s));
  const { call, data } = routedStream("FULL_DUPLEX_STREAMED", { bodyBudget });
  sent.forEach((body, i) => data({ request: "request_body", request_body: { body, end_of_stream: i === sent.length - 1 } }));
  type Streamed = { request_body?: { response?: { body_mutation?: { streamed_response?: { body: Uint8Array } } } } };
  const forwarded = call.written.map((m) => (m as Streamed).request_body?.response?.body_mutation?.streamed_response?.body).filter((b) => b !== undefined);
  expect(new TextDecoder().decode(Buffer.concat(forwarded))).toBe('{"model":"m","prompt":"hi"}');
  expect(forwarded.some((b) => b.buffer instanceof SharedArrayBuffer)).toBe(false);
});

describe("reply warming", () => {
  const enc = new TextEncoder();
  /** A full-duplex stream whose bodies read as `fields`, warming into `warmed` (bodies up to `maxBodyBytes`). */
  const warmingStream = (path: string, fields: BodyFields, maxBodyBytes = 1 << 20) => {
    const bodyBudget = new BodyBudget(1 << 20);
    const metrics = createMetrics();
    const warmed: { request: BodyRequest; reply: Uint8Array }[] = [];
    const { call, data } = routedStream("FULL_DUPLEX_STREAMED", {
      bodyBudget, metrics,
      tokenizeBody: (req) => ({ fields, tokens: new Uint32Array(0), body: req.body, rewritten: false }),
      warmReply: { maxBodyBytes, warm: (request, reply) => warmed.push({ request, reply }) },
    }, { responses: "FULL_DUPLEX_STREAMED", path });
    const respond = (...chunks: string[]) => {
      data({ request: "response_headers", response_headers: { headers: { headers: [] } } });
      chunks.forEach((c, i) => data({ request: "response_body", response_body: { body: enc.encode(c), end_of_stream: i === chunks.length - 1 } }));
    };
    /** A response as an HTTP/2 upstream with trailers sends it: no body chunk marks the end, the trailers do (unless `trailers` is false). */
    const respondUntilTrailers = (status: string, chunks: string[], trailers = true) => {
      data({ request: "response_headers", response_headers: { headers: { headers: [{ key: ":status", raw_value: enc.encode(status) }] } } });
      for (const c of chunks) data({ request: "response_body", response_body: { body: enc.encode(c), end_of_stream: false } });
      if (trailers) data({ request: "response_trailers", response_trailers: { trailers: { headers: [] } } });
    };
    const dropped = async (cause: string) => (await metrics.registry.getSingleMetric("dynamo_epp_reply_warms_dropped_total")!.get()).values.find((v) => v.labels.cause === cause)?.value ?? 0;
    return { bodyBudget, call, data, respond, respondUntilTrailers, warmed, dropped };
  };
  const request = (body: Uint8Array): ProcessingRequest => ({ request: "request_body", request_body: { body, end_of_stream: true } });

  test("a chat completion's body and reply are kept until its response ends, then handed to the pool as received: the decision thread reads no reply", () => {
    const s = warmingStream("/v1/chat/completions", { kind: "chat" });
    const body = enc.encode('{"model":"m","messages":[{"role":"user","content":"hi"}]}');
    s.data(request(body));
    expect(s.bodyBudget.usedBytes).toBe(body.length);
    const chunks = [`data: ${JSON.stringify({ choices: [{ index: 0, delta: { content: "Hel" } }] })}\n\n`, `data: ${JSON.stringify({ choices: [{ index: 0, delta: { content: "lo" } }] })}\n\ndata: [DONE]\n\n`];
    s.respond(...chunks);
    expect(s.bodyBudget.usedBytes).toBe(0);
    expect(s.warmed).toHaveLength(1);
    expect(s.warmed[0]!.request).toMatchObject({ body, path: "/v1/chat/completions" });
    expect(new TextDecoder().decode(s.warmed[0]!.reply)).toBe(chunks.join(""));
  });

  test("a response that ends with trailers (an HTTP/2 upstream's) is warmed at them, once, as one whose body ended: what was kept is given back", () => {
    const s = warmingStream("/v1/chat/completions", { kind: "chat" });
    const body = enc.encode('{"model":"m","messages":[{"role":"user","content":"hi"}]}');
    s.data(request(body));
    const chunks = [`data: ${JSON.stringify({ choices: [{ index: 0, delta: { content: "Hel" } }] })}\n\n`, `data: ${JSON.stringify({ choices: [{ index: 0, delta: { content: "lo" }, finish_reason: "stop" }] })}\n\ndata: [DONE]\n\n`];
    s.respondUntilTrailers("200", chunks, false);
    expect(s.warmed).toHaveLength(0); // the body has not said it ended
    expect(s.bodyBudget.usedBytes).toBeGreaterThan(0);
    s.data({ request: "response_trailers", response_trailers: { trailers: { headers: [] } } });
    expect(s.warmed).toHaveLength(1);
    expect(s.warmed[0]!.request).toMatchObject({ body, path: "/v1/chat/completions" });
    expect(new TextDecoder().decode(s.warmed[0]!.reply)).toBe(chunks.join(""));
    expect(s.bodyBudget.usedBytes).toBe(0);
    // Whatever follows (a repeated end, the stream's close) warms nothing more.
    s.data({ request: "response_trailers", response_trailers: { trailers: { headers: [] } } });
    s.call.emit("end");
    expect(s.warmed).toHaveLength(1);
    expect(s.bodyBudget.usedBytes).toBe(0);
  });

  test("a response that would end with trailers warms nothing when its status is not 2xx or its stream is reset first, and gives back what was kept", () => {
    const reply = [JSON.stringify({ choices: [{ index: 0, message: { role: "assistant", content: "ok" }, finish_reason: "stop" }] })];
    const failed = warmingStream("/v1/chat/completions", { kind: "chat" });
    failed.data(request(enc.encode('{"model":"m","messages":[{"role":"user","content":"hi"}]}')));
    failed.respondUntilTrailers("503", reply);
    expect(failed.warmed).toHaveLength(0);
    expect(failed.bodyBudget.usedBytes).toBe(0);
    const reset = warmingStream("/v1/chat/completions", { kind: "chat" });
    reset.data(request(enc.encode('{"model":"m","messages":[{"role":"user","content":"hi"}]}')));
    reset.respondUntilTrailers("200", reply, false);
    expect(reset.bodyBudget.usedBytes).toBeGreaterThan(0);
    reset.call.emit("error", new Error("stream reset"));
    expect(reset.warmed).toHaveLength(0);
    expect(reset.bodyBudget.usedBytes).toBe(0);
  });

  test("an error response (status not 2xx) gives back what was kept at its headers and is not warmed: its body holds no reply", () => {
    const s = warmingStream("/v1/chat/completions", { kind: "chat" });
    s.data(request(enc.encode('{"model":"m","messages":[{"role":"user","content":"hi"}]}')));
    expect(s.bodyBudget.usedBytes).toBeGreaterThan(0);
    s.data({ request: "response_headers", response_headers: { headers: { headers: [{ key: ":status", raw_value: enc.encode("400") }] } } });
    expect(s.bodyBudget.usedBytes).toBe(0);
    const error = JSON.stringify({ error: { message: "This model's maximum context length is 40960 tokens.", type: "BadRequestError", code: 400 } });
    s.data({ request: "response_body", response_body: { body: enc.encode(error), end_of_stream: true } });
    expect(s.bodyBudget.usedBytes).toBe(0);
    expect(s.warmed).toHaveLength(0);
  });

  test("a /v1/responses request keeps neither its body nor its reply, whose events no warm can read", () => {
    const s = warmingStream("/v1/responses", { kind: "chat", responses: true });
    s.data(request(enc.encode('{"model":"m","input":"hi"}')));
    expect(s.bodyBudget.usedBytes).toBe(0);
    const delta = (text: string) => `event: response.output_text.delta\ndata: ${JSON.stringify({ type: "response.output_text.delta", delta: text })}\n\n`;
    s.data({ request: "response_headers", response_headers: { headers: { headers: [] } } });
    s.data({ request: "response_body", response_body: { body: enc.encode(delta("Hel")), end_of_stream: false } });
    expect(s.bodyBudget.usedBytes).toBe(0);
    s.data({ request: "response_body", response_body: { body: enc.encode(delta("lo")), end_of_stream: true } });
    expect(s.warmed).toHaveLength(0);
  });

  test("a chat body larger than the pool warms is not kept, counted", async () => {
    const s = warmingStream("/v1/chat/completions", { kind: "chat" }, 16);
    s.data(request(enc.encode('{"model":"m","messages":[{"role":"user","content":"hi"}]}')));
    expect(s.bodyBudget.usedBytes).toBe(0);
    expect(await s.dropped("too_large")).toBe(1);
    s.respond(JSON.stringify({ choices: [{ message: { role: "assistant", content: "ok" } }] }));
    expect(s.warmed).toHaveLength(0);
  });
});

test("a tokenization is aborted when its request ends before it settles, and left alone once it has (no abort for no one)", async () => {
  const signals: AbortSignal[] = [];
  const settle: (() => void)[] = [];
  const { call, data } = routedStream("FULL_DUPLEX_STREAMED", {
    tokenizeBody: (req, signal) => {
      signals.push(signal!);
      return new Promise<RoutedBody>((resolve) => settle.push(() => resolve({ fields: { kind: "none" }, tokens: new Uint32Array(0), body: req.body, rewritten: false })));
    },
  });
  const body = { request: "request_body" as const, request_body: { body: new TextEncoder().encode('{"prompt":"hi"}'), end_of_stream: true } };
  data(body);
  settle[0]!();
  await Bun.sleep(0);
  expect(kinds(call.written)).toEqual(["request_headers", "request_body"]);
  call.emit("end");
  expect(signals[0]!.aborted).toBe(false);

  const next = routedStream("FULL_DUPLEX_STREAMED", { tokenizeBody: (_req, signal) => (signals.push(signal!), new Promise<RoutedBody>(() => {})) });
  next.data(body);
  next.call.emit("cancelled");
  expect(signals[1]!.aborted).toBe(true);
});

describe("without protocol_config, the body modes --body-mode and --response-body-mode name", () => {
  const enc = new TextEncoder();
  /** The body read as the EPP reads it (a cut one routed by load, a malformed one refused), nothing tokenized. */
  const read = (req: BodyRequest): RoutedBody => ({ fields: readBody(req).fields, tokens: new Uint32Array(0), body: req.body, rewritten: false });
  const chunk = (text: string, end_of_stream: boolean): ProcessingRequest => ({ request: "request_body", request_body: { body: enc.encode(text), end_of_stream } });
  const status = (m: ProcessingResponse | undefined) => (m as { immediate_response?: { status?: { code?: number } } } | undefined)?.immediate_response?.status?.code;

  test("none: the headers are answered at once with the route by load, where a protocol_config saying full duplex still waits for the body", () => {
    const none = routedStream(undefined, { bodyMode: "none", tokenizeBody: read });
    expect(kinds(none.call.written)).toEqual(["request_headers"]);
    expect(lbEndpoint(none.call.written[0])).toBe(ENDPOINT);
    const told = routedStream("FULL_DUPLEX_STREAMED", { bodyMode: "none", tokenizeBody: read });
    expect(kinds(told.call.written)).toEqual([]);
  });

  test("streamed: the headers carry the route, and a body split across chunks passes with a CONTINUE each, never read nor refused", () => {
    const { call, data } = routedStream(undefined, { bodyMode: "streamed", tokenizeBody: read });
    expect(lbEndpoint(call.written[0])).toBe(ENDPOINT);
    data(chunk('{"model":"m","pro', false));
    data(chunk('mpt":"hi"}', true));
    expect(kinds(call.written)).toEqual(["request_headers", "request_body", "request_body"]);
    expect(call.written.map(status)).toEqual([undefined, undefined, undefined]);
    expect(call.written.slice(1)).toEqual([{ request_body: { response: {} } }, { request_body: { response: {} } }]);
  });

  test("buffered-partial: a body cut at Envoy's buffer limit is routed by load on the body's answer, not refused as malformed", () => {
    const { call, data } = routedStream(undefined, { bodyMode: "buffered-partial", tokenizeBody: read });
    expect(kinds(call.written)).toEqual(["request_headers"]); // CONTINUE: the body is awaited
    data(chunk('{"model":"m","prompt":"a long prom', false));
    expect(kinds(call.written)).toEqual(["request_headers", "request_body"]);
    expect(lbEndpoint(call.written[1])).toBe(ENDPOINT);
  });

  test("response chunks are answered as the response mode takes them: streamed_response under full duplex alone, CONTINUE otherwise", () => {
    type BodyAnswer = { response_body?: { response?: { body_mutation?: { streamed_response?: unknown } } } };
    const answers = (bodyMode: ExtProcDeps["bodyMode"], responseBodyMode: ExtProcDeps["bodyMode"]) => {
      const { call, data } = routedStream(undefined, { bodyMode, responseBodyMode, tokenizeBody: read });
      data({ request: "request_body", request_body: { body: enc.encode('{"model":"m","prompt":"hi"}'), end_of_stream: true } });
      data({ request: "response_headers", response_headers: { headers: { headers: [] } } });
      data({ request: "response_body", response_body: { body: enc.encode('{"choices":[]}'), end_of_stream: true } });
      const last = call.written.at(-1) as BodyAnswer;
      expect(last.response_body).toBeDefined();
      return last.response_body?.response?.body_mutation?.streamed_response !== undefined ? "streamed_response" : "continue";
    };
    expect(answers("full-duplex", "streamed")).toBe("continue");
    expect(answers("full-duplex", "buffered")).toBe("continue");
    expect(answers("buffered", "full-duplex")).toBe("streamed_response");
    // auto follows the request's mode.
    expect(answers("full-duplex", "auto")).toBe("streamed_response");
    expect(answers("buffered", "auto")).toBe("continue");
  });
});

test("configured model names keep their own labels after a flood of invented ones fills the bound: the served model, its adapters, the rewrite rules' models", async () => {
  const metrics = createMetrics();
  const bodyBudget = new BodyBudget(1 << 20);
  let ruleNames: readonly string[] = [];
  let model = "";
  let handle: ((call: never) => void) | undefined;
  const routeOne = (name: string) => {
    model = name;
    const stream = routedStream("FULL_DUPLEX_STREAMED", {
      metrics, bodyBudget, servedModels: ["served", "adapter"], rewriteModelNames: () => ruleNames, modelLabelsMax: 10,
      tokenizeBody: (req) => ({ fields: { kind: "none", model }, tokens: new Uint32Array(0), body: req.body, rewritten: false }),
    }, { handle });
    handle = stream.handle;
    stream.data({ request: "request_body", request_body: { body: new TextEncoder().encode("{}"), end_of_stream: true } });
  };
  for (let i = 0; i < 10; i++) routeOne(`invented-${i}`);
  ruleNames = ["canary"]; // the watch brought a rule rewriting to "canary"
  for (const name of ["served", "adapter", "canary", "late-invented"]) routeOne(name);
  const labels = (await metrics.registry.getSingleMetric("llm_d_epp_request_total")!.get()).values.map((v) => v.labels.model_name);
  expect(labels).toContain("served");
  expect(labels).toContain("adapter");
  expect(labels).toContain("canary");
  expect(labels).not.toContain("late-invented");
  expect(labels).toContain("other");
});
