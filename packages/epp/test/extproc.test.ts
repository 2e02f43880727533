// Full ext_proc streams against an in-process EPP whose workers' KV events come from real publishers.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { createPreprocessor } from "@kv-epp/tokenizer";
import { workerKeyOf } from "@kv-epp/protocol";
import { waitFor, LOOPBACK } from "@kv-epp/testkit";
import { loadProtos } from "../src/extproc/protos.ts";
import type { EppHandle } from "../src/main.ts";
import {
  FakeWorkerEvents,
  HOST,
  body,
  extProcClient,
  headers,
  immediateHeader,
  lbMetadata,
  postJson,
  rawExtProcSession,
  scrapeMetric,
  setHeader,
  startTestEpp,
  type Resp,
  tokens,
} from "./helpers.ts";

const A = `${LOOPBACK}.4.11:8000`;
const B = `${LOOPBACK}.4.12:8000`;

let evA: FakeWorkerEvents;
let evB: FakeWorkerEvents;
let epp: EppHandle;
let client: ReturnType<typeof extProcClient>;
const promptA = tokens(96, 1); // 6 blocks held by A
const chatMessages = [
  { role: "system", content: "You are terse." },
  { role: "user", content: "Explain KV caches in one long sentence, please, with some detail about prefixes." },
];

async function overlap(ids: number[]): Promise<Record<string, Record<string, number>>> {
  const r = await postJson(`http://${HOST}:${epp.ports.selection}/score`, { token_ids: ids });
  return r.body.scores;
}

async function inflight(): Promise<number> {
  return (await scrapeMetric(`http://${HOST}:${epp.ports.metrics}`, "dynamo_epp_inflight_requests")) ?? NaN;
}

beforeAll(async () => {
  evA = await FakeWorkerEvents.start();
  evB = await FakeWorkerEvents.start();
  epp = await startTestEpp([
    { id: "worker-a", address: A, kvEvents: evA.endpoint },
    { id: "worker-b", address: B, kvEvents: evB.endpoint },
  ]);
  await waitFor(() => evA.pub.subscriberCount > 0 && evB.pub.subscriberCount > 0, { message: "listeners connected" });
  await evA.storeUntil(promptA, async () => (await overlap(promptA))["worker-a"]?.["0"] === 6);
  // B holds the chat prompt as the byte-level fallback tokenizes it (the EPP has no tokenizer dir).
  const chat = Array.from(createPreprocessor({}).encodeChat(chatMessages));
  await evB.storeUntil(chat, async () => (await overlap(chat))["worker-b"]?.["0"] === Math.floor(chat.length / 16));
  client = extProcClient(epp.ports.grpc);
});

afterAll(async () => {
  client?.close();
  await epp?.stop({ graceMs: 1000 });
  await evA?.close();
  await evB?.close();
});

describe("ext_proc", () => {
  test("a completion with token ids routes to the worker holding its prefix (full duplex)", async () => {
    const s = client.open();
    const req = { model: "test-model", prompt: [...promptA, ...tokens(40, 99)], max_tokens: 4 };
    s.send({ ...headers(), protocol_config: { request_body_mode: "FULL_DUPLEX_STREAMED", response_body_mode: "FULL_DUPLEX_STREAMED" } });
    s.send(body(req));
    const h = await s.next();
    expect(h.response).toBe("request_headers");
    expect(setHeader(h.request_headers?.response, "x-gateway-destination-endpoint")).toBe(A);
    expect(h.request_headers?.response?.clear_route_cache).toBe(true);
    expect(lbMetadata(h)).toBe(A);
    const b = await s.next();
    expect(b.response).toBe("request_body");
    const streamed = b.request_body?.response?.body_mutation?.streamed_response;
    expect(streamed?.end_of_stream).toBe(true);
    expect(JSON.parse(Buffer.from(streamed!.body!).toString())).toEqual(req);
    s.end();
  });

  test("buffered mode answers headers with CONTINUE and routes on the body response", async () => {
    const s = client.open();
    s.send({ ...headers(), protocol_config: { request_body_mode: "BUFFERED" } });
    const h = await s.next();
    expect(h.response).toBe("request_headers");
    // CONTINUE, only a client's own rank headers removed (body-modes.test.ts): no route on it.
    expect(h.request_headers?.response?.header_mutation?.set_headers).toBeUndefined();
    s.send(body({ prompt: promptA }));
    const b = await s.next();
    expect(b.response).toBe("request_body");
    expect(setHeader(b.request_body?.response, "x-gateway-destination-endpoint")).toBe(A);
    expect(b.request_body?.response?.clear_route_cache).toBe(true);
    expect(lbMetadata(b)).toBe(A);
    s.end();
  });

  test("buffered mode with request trailers: the one body message (end_of_stream false) gets the route, the trailers a CONTINUE", async () => {
    const s = client.open();
    s.send({ ...headers(), protocol_config: { request_body_mode: "BUFFERED" } });
    expect((await s.next()).response).toBe("request_headers");
    s.send(body({ prompt: promptA }, false));
    const b = await s.next();
    expect(b.response).toBe("request_body");
    expect(setHeader(b.request_body?.response, "x-gateway-destination-endpoint")).toBe(A);
    s.send({ request_trailers: { trailers: { headers: [] } } });
    expect((await s.next()).response).toBe("request_trailers");
    s.end();
  });

  test("body modes that route before any body (NONE, STREAMED) get the route on the headers response, by load", async () => {
    // NONE is proto3's zero value: a protocol_config that names no request body mode.
    for (const protocol_config of [{}, { request_body_mode: "STREAMED" as const }]) {
      const s = client.open();
      s.send({ ...headers(), protocol_config });
      const h = await s.next();
      expect(h.response).toBe("request_headers");
      expect([A, B]).toContain(setHeader(h.request_headers?.response, "x-gateway-destination-endpoint")!);
      if (protocol_config.request_body_mode === "STREAMED") {
        s.send(body({ prompt: promptA }, false));
        const c = await s.next();
        expect(c.response).toBe("request_body");
        expect(c.request_body?.response?.header_mutation).toBeUndefined();
      }
      s.end();
    }
  });

  test("a body streamed in chunks is accumulated until end_of_stream and handed back whole", async () => {
    const s = client.open();
    const text = JSON.stringify({ prompt: promptA, stream: true });
    const cuts = [0, 7, 50, 51, text.length];
    s.send({ ...headers(), protocol_config: { request_body_mode: "FULL_DUPLEX_STREAMED" } });
    for (let i = 0; i + 1 < cuts.length; i++) s.send(body(text.slice(cuts[i], cuts[i + 1]), i + 2 === cuts.length));
    const h = await s.next();
    expect(setHeader(h.request_headers?.response, "x-gateway-destination-endpoint")).toBe(A);
    let echoed = "";
    for (;;) {
      const r = await s.next();
      const sr = r.request_body?.response?.body_mutation?.streamed_response;
      echoed += Buffer.from(sr?.body ?? []).toString();
      if (sr?.end_of_stream) break;
    }
    expect(echoed).toBe(text);
    s.end();
  });

  /** A stream opened with a gRPC request's headers (vLLM's gRPC API), whose answer must carry the route. */
  const grpcRouted = async (contentType: string, mode: "FULL_DUPLEX_STREAMED" | "BUFFERED") => {
    const s = client.open();
    s.send({ ...headers("/vllm.grpc.engine.VllmEngine/Generate", false, {}, contentType), protocol_config: { request_body_mode: mode } });
    const h = await s.next();
    expect(setHeader(h.request_headers?.response, "x-gateway-destination-endpoint")).toBeDefined();
    return s;
  };

  test("a gRPC request (vLLM's gRPC API) is routed by load on its headers, its protobuf body passed through unread", async () => {
    const s = await grpcRouted("application/grpc", "FULL_DUPLEX_STREAMED");
    // A length-prefixed protobuf message: JSON it is not, and no 400 comes of it.
    const frame = new Uint8Array([0, 0, 0, 0, 3, 0x0a, 0x01, 0x41]);
    s.send({ request_body: { body: frame, end_of_stream: true } });
    const b = await s.next();
    expect(b.immediate_response).toBeUndefined();
    const sr = b.request_body?.response?.body_mutation?.streamed_response;
    expect([...(sr?.body ?? [])]).toEqual([...frame]);
    expect(sr?.end_of_stream).toBe(true);
    s.end();
  });

  test("in buffered mode too, a gRPC request's headers answer carries the route and its body gets a CONTINUE", async () => {
    const s = await grpcRouted("application/grpc+proto", "BUFFERED");
    s.send({ request_body: { body: new Uint8Array([0, 0, 0, 0, 1, 0x08]), end_of_stream: true } });
    const b = await s.next();
    expect(b.immediate_response).toBeUndefined();
    expect(b.request_body).toBeDefined();
    expect(b.request_body?.response?.body_mutation).toBeUndefined();
    s.end();
  });

  test("a buffered body larger than gRPC's 4 MiB default message size is routed", async () => {
    const s = client.open();
    const big = [...promptA, ...Array.from({ length: 700_000 }, (_, i) => i % 50000)];
    s.send({ ...headers(), protocol_config: { request_body_mode: "BUFFERED" } });
    await s.next();
    s.send(body({ prompt: big }));
    const b = await s.next(15_000);
    expect(setHeader(b.request_body?.response, "x-gateway-destination-endpoint")).toBe(A);
    s.end();
  });

  test("a body ended by request trailers (no end_of_stream) is routed, then the trailers answered", async () => {
    const s = client.open();
    s.send({ ...headers(), protocol_config: { request_body_mode: "FULL_DUPLEX_STREAMED" } });
    s.send(body({ prompt: promptA }, false));
    s.send({ request_trailers: { trailers: { headers: [] } } });
    const h = await s.next();
    expect(setHeader(h.request_headers?.response, "x-gateway-destination-endpoint")).toBe(A);
    const b = await s.next();
    expect(b.request_body?.response?.body_mutation?.streamed_response?.end_of_stream).toBeFalsy();
    expect((await s.next()).response).toBe("request_trailers");
    s.end();
  });

  test("a chat request is tokenized and routed to the worker holding its rendered prompt", async () => {
    const s = client.open();
    s.send(headers("/v1/chat/completions"));
    s.send(body({ model: "test-model", messages: chatMessages }));
    const h = await s.next();
    expect(setHeader(h.request_headers?.response, "x-gateway-destination-endpoint")).toBe(B);
    s.end();
  });

  test("a /v1/responses request (instructions + input) is routed by the chat vLLM renders from it", async () => {
    const s = client.open();
    const h0 = headers("/v1/responses");
    h0.request_headers!.headers!.headers!.push({ key: "x-kv-epp-explain", raw_value: new TextEncoder().encode("1") });
    s.send(h0);
    s.send(body({ model: "test-model", instructions: chatMessages[0]!.content, input: chatMessages[1]!.content }));
    const h = await s.next();
    expect(setHeader(h.request_headers?.response, "x-gateway-destination-endpoint")).toBe(B);
    const blocks = Math.floor(createPreprocessor({}).encodeChat(chatMessages).length / 16);
    expect(setHeader(h.request_headers?.response, "x-kv-epp-decision")).toContain(`overlap=${blocks}/${blocks}`);
    s.end();
  });

  test("a /v1/messages request (Anthropic's system and content blocks) is routed by the chat vLLM converts it to, salted by its cache_salt", async () => {
    const messages = (salt: object, path = "/v1/messages") => {
      const h0 = headers(path);
      h0.request_headers!.headers!.headers!.push({ key: "x-kv-epp-explain", raw_value: new TextEncoder().encode("1") });
      const s = client.open();
      s.send(h0);
      s.send(body({
        model: "test-model", max_tokens: 64, ...salt,
        system: [{ type: "text", text: "x-anthropic-billing-header: cc_version=1;" }, { type: "text", text: chatMessages[0]!.content }],
        messages: [{ role: "user", content: [{ type: "text", text: chatMessages[1]!.content }] }],
      }));
      return s;
    };
    const blocks = Math.floor(createPreprocessor({}).encodeChat(chatMessages).length / 16);
    // Claude Code's query, and a gateway prefix the route rewrites away after ext_proc: the same Messages body.
    for (const path of ["/v1/messages", "/llm/v1/messages?beta=true"]) {
      const s = messages({}, path);
      const h = await s.next();
      expect(setHeader(h.request_headers?.response, "x-gateway-destination-endpoint")).toBe(B);
      expect(setHeader(h.request_headers?.response, "x-kv-epp-decision")).toContain(`overlap=${blocks}/${blocks}`);
      s.end();
    }
    // vLLM's Messages request passes its cache_salt to the chat, so its blocks are no unsalted chat's.
    const salted = messages({ cache_salt: "tenant-a" });
    const decision = setHeader((await salted.next()).request_headers?.response, "x-kv-epp-decision");
    expect(decision).toMatch(new RegExp(`chosen: [^;]* overlap=0/${blocks} `));
    salted.end();
  });

  test("the subset hint (a list of ip:port) restricts candidates", async () => {
    for (const hint of [{ listValue: { values: [{ stringValue: B }] } }, { listValue: { values: [{ stringValue: B }, { stringValue: `${LOOPBACK}.4.99:1` }] } }]) {
      const s = client.open();
      s.send({
        ...headers(),
        metadata_context: { filter_metadata: { "envoy.lb.subset_hint": { fields: { "x-gateway-destination-endpoint-subset": hint } } } },
      });
      s.send(body({ prompt: promptA }));
      const h = await s.next();
      expect(setHeader(h.request_headers?.response, "x-gateway-destination-endpoint")).toBe(B);
      s.end();
    }
  });

  test("a subset naming no known pod, or none at all, gets an ImmediateResponse 503", async () => {
    for (const values of [[{ stringValue: `${LOOPBACK}.4.99:8000` }], []]) {
      const s = client.open();
      s.send({
        ...headers(),
        metadata_context: { filter_metadata: { "envoy.lb.subset_hint": { fields: { "x-gateway-destination-endpoint-subset": { listValue: { values } } } } } },
      });
      s.send(body({ prompt: promptA }));
      const r = await s.next();
      expect(r.response).toBe("immediate_response");
      expect(r.immediate_response?.status?.code).toBe("ServiceUnavailable");
      // llm-d's reason header, so a client or gateway can tell a refusal from a model server's error.
      expect(immediateHeader(r, "x-llm-d-request-dropped-reason")).toBe("rejected-no-endpoints");
      s.end();
    }
  });

  test("malformed JSON gets a 400 and the same stream then serves a good request", async () => {
    const s = client.open();
    s.send(headers());
    s.send(body("{not json"));
    const bad = await s.next();
    expect(bad.response).toBe("immediate_response");
    expect(bad.immediate_response?.status?.code).toBe("BadRequest");
    expect(immediateHeader(bad, "x-llm-d-request-dropped-reason")).toBeUndefined();
    s.send(headers());
    s.send(body({ prompt: "not token ids but text", model: "test-model" }));
    const good = await s.next();
    expect(good.response).toBe("request_headers");
    expect([A, B]).toContain(setHeader(good.request_headers?.response, "x-gateway-destination-endpoint")!);
    s.end();
  });

  test("a request's load is held until its response ends, and released when a stream breaks", async () => {
    const before = await inflight();
    const s = client.open();
    s.send({ ...headers(), protocol_config: { request_body_mode: "FULL_DUPLEX_STREAMED", response_body_mode: "FULL_DUPLEX_STREAMED" } });
    s.send(body({ prompt: promptA }));
    await s.next();
    await s.next();
    expect(await inflight()).toBe(before + 1);
    s.send({ response_headers: { headers: { headers: [{ key: ":status", raw_value: new TextEncoder().encode("200") }] } } });
    expect((await s.next()).response).toBe("response_headers");
    s.send({ response_body: { body: new TextEncoder().encode("data: {}\n\n"), end_of_stream: false } });
    const chunk = await s.next();
    expect(Buffer.from(chunk.response_body?.response?.body_mutation?.streamed_response?.body ?? []).toString()).toBe("data: {}\n\n");
    expect(await inflight()).toBe(before + 1);
    s.send({ response_body: { body: new Uint8Array(0), end_of_stream: true } });
    await s.next();
    expect(await inflight()).toBe(before);

    const broken = client.open();
    broken.send(headers());
    broken.send(body({ prompt: promptA }));
    await broken.next();
    expect(await inflight()).toBe(before + 1);
    broken.call.cancel();
    await waitFor(async () => (await inflight()) === before, { message: "load released on cancel" });
  });

  test("a request's prefill counts as ahead on its worker until its first response byte, or twice its predicted TTFT when none comes", async () => {
    const prefill = () => epp.load.of(workerKeyOf("worker-a", 0)).prefillBlocks + epp.load.of(workerKeyOf("worker-b", 0)).prefillBlocks;
    const before = prefill();
    const requests = await inflight();
    // Nothing cached anywhere: all of its 8 blocks are to prefill.
    const fresh = tokens(128, 77);
    const streamed = client.open();
    streamed.send({ ...headers(), protocol_config: { request_body_mode: "FULL_DUPLEX_STREAMED", response_body_mode: "FULL_DUPLEX_STREAMED" } });
    streamed.send(body({ prompt: fresh }));
    await streamed.next();
    await streamed.next();
    expect(prefill()).toBe(before + 8);
    streamed.send({ response_headers: { headers: { headers: [{ key: ":status", raw_value: new TextEncoder().encode("200") }] } } });
    await streamed.next();
    streamed.send({ response_body: { body: new TextEncoder().encode("data: {}\n\n"), end_of_stream: false } });
    await streamed.next();
    expect(prefill()).toBe(before);
    // A response that shows nothing until it ends (not streamed): the deadline ends its prefill.
    const silent = client.open();
    silent.send({ ...headers(), protocol_config: { request_body_mode: "FULL_DUPLEX_STREAMED", response_body_mode: "FULL_DUPLEX_STREAMED" } });
    silent.send(body({ prompt: tokens(128, 78) }));
    await silent.next();
    await silent.next();
    expect(prefill()).toBe(before + 8);
    await waitFor(() => prefill() === before, { message: "the prefill deadline" });
    expect(await inflight()).toBe(requests + 2); // both requests are still in flight
    streamed.call.cancel();
    silent.call.cancel();
    await waitFor(async () => (await inflight()) === requests, { message: "load released on cancel" });
  });

  test("a routed request whose stream then fails (a message that does not parse) releases its load", async () => {
    const before = await inflight();
    const method = loadProtos().extProc.service.Process!;
    const frame = (b: Uint8Array) => {
      const out = Buffer.alloc(5 + b.length);
      out.writeUInt32BE(b.length, 1);
      out.set(b, 5);
      return out;
    };
    const session = rawExtProcSession(epp.ports.grpc);
    const req = session.request({ ":method": "POST", ":path": method.path, "content-type": "application/grpc", te: "trailers" });
    let status: string | undefined;
    req.on("data", () => {});
    req.on("trailers", (t) => (status = t["grpc-status"] as string));
    req.on("error", () => {});
    req.write(frame(method.requestSerialize(headers())));
    req.write(frame(method.requestSerialize(body({ prompt: promptA }))));
    await waitFor(async () => (await inflight()) === before + 1, { message: "routed" });
    req.write(frame(Uint8Array.from([0xff, 0xff, 0xff]))); // a truncated varint: not a ProcessingRequest
    await waitFor(() => status !== undefined, { message: "call failed" });
    expect(status).toBe("13");
    await waitFor(async () => (await inflight()) === before, { message: "load released" });
    session.destroy();
  });

  test("an empty ProcessingRequest (no request case), also as a stream's last bytes, ends that stream with INVALID_ARGUMENT, counted", async () => {
    const metricsUrl = `http://${HOST}:${epp.ports.metrics}`;
    const series = 'dynamo_epp_ext_proc_rejected_messages_total{reason="no_request"}';
    const counted = (await scrapeMetric(metricsUrl, series)) ?? 0;
    const before = await inflight();
    const method = loadProtos().extProc.service.Process!;
    const session = rawExtProcSession(epp.ports.grpc);
    const statusOf = (...writes: Buffer[]) =>
      new Promise<string | undefined>((resolve) => {
        const req = session.request({ ":method": "POST", ":path": method.path, "content-type": "application/grpc", te: "trailers" });
        let status: string | undefined;
        req.on("data", () => {});
        req.on("trailers", (t) => (status = t["grpc-status"] as string));
        req.on("error", () => {});
        req.on("close", () => resolve(status));
        for (const w of writes.slice(0, -1)) req.write(w);
        req.end(writes.at(-1));
      });
    const empty = Buffer.from([0, 0, 0, 0, 0]);
    const routed = Buffer.from(method.requestSerialize(headers("/v1/completions", true))); // routed on the headers
    const withHeader = Buffer.concat([Buffer.from([0, 0, 0, 0, 0]), routed]);
    withHeader.writeUInt32BE(routed.length, 1);
    // Alone and last; after a request that holds load (released).
    expect(await statusOf(empty)).toBe("3");
    expect(await statusOf(withHeader, empty)).toBe("3");
    session.destroy();
    expect(await scrapeMetric(metricsUrl, series)).toBe(counted + 2);
    expect(await inflight()).toBe(before);
    const s = client.open();
    s.send(headers());
    s.send(body({ prompt: promptA }));
    expect(setHeader((await s.next()).request_headers?.response, "x-gateway-destination-endpoint")).toBe(A);
    s.end();
  });

  test("routed load spreads requests nobody holds across workers", async () => {
    // Distinct prompts of one size: nobody holds them, none shares a prefix with another in flight
    // (identical ones would: test/inflight-prefix.test.ts), so only load decides.
    const seen = new Set<string>();
    const streams = [];
    for (let i = 0; i < 4; i++) {
      const s = client.open();
      s.send(headers());
      s.send(body({ prompt: tokens(64, 4242 + i) }));
      seen.add(setHeader((await s.next()).request_headers?.response, "x-gateway-destination-endpoint")!);
      streams.push(s); // kept open: their load stays on the chosen workers
    }
    expect(seen).toEqual(new Set([A, B]));
    for (const s of streams) s.end();
  });
});

describe("ext_proc shedding and empty pools", () => {
  test("no workers: ImmediateResponse 503", async () => {
    const empty = await startTestEpp([]);
    const c = extProcClient(empty.ports.grpc);
    try {
      const s = c.open();
      s.send(headers());
      s.send(body({ prompt: [1, 2, 3] }));
      const r = await s.next();
      expect(r.immediate_response?.status?.code).toBe("ServiceUnavailable");
      s.end();
    } finally {
      c.close();
      await empty.stop({ graceMs: 500 });
    }
  });

  test("a worker with several data-parallel ranks gets the chosen rank in x-data-parallel-rank", async () => {
    const dp = await startTestEpp([{ id: "dp", address: `${LOOPBACK}.4.23:8000`, kvEvents: `tcp://${LOOPBACK}.4.23:1`, dpSize: 2 }]);
    const c = extProcClient(dp.ports.grpc);
    try {
      const ranks = new Set<string>();
      for (let i = 0; i < 12 && ranks.size < 2; i++) {
        const s = c.open();
        s.send(headers());
        s.send(body({ prompt: tokens(32, 700 + i) }));
        const h = await s.next();
        expect(setHeader(h.request_headers?.response, "x-gateway-destination-endpoint")).toBe(`${LOOPBACK}.4.23:8000`);
        ranks.add(setHeader(h.request_headers?.response, "x-data-parallel-rank")!);
      }
      expect([...ranks].sort()).toEqual(["0", "1"]);
    } finally {
      c.close();
      await dp.stop({ graceMs: 0 });
    }
  });

  test("a client's own x-data-parallel-rank is removed when the pick names no rank, and overridden when it does; SGLang's rank overrides always removed", async () => {
    const rankOf = (r: Resp | undefined) => setHeader(r?.request_headers?.response, "x-data-parallel-rank");
    const removedOf = (r: Resp | undefined) => r?.request_headers?.response?.header_mutation?.remove_headers ?? [];
    const withRank = () => {
      const h = headers();
      h.request_headers!.headers!.headers!.push({ key: "x-data-parallel-rank", raw_value: new TextEncoder().encode("7") });
      return h;
    };
    const single = await startTestEpp([{ id: "one", address: `${LOOPBACK}.4.24:8000`, kvEvents: `tcp://${LOOPBACK}.4.24:1` }]);
    const dp = await startTestEpp([{ id: "dp", address: `${LOOPBACK}.4.25:8000`, kvEvents: `tcp://${LOOPBACK}.4.25:1`, dpSize: 2 }]);
    const clients = [extProcClient(single.ports.grpc), extProcClient(dp.ports.grpc)];
    try {
      const answers: (Resp | undefined)[] = [];
      for (const c of clients) {
        const s = c.open();
        s.send(withRank());
        s.send(body({ prompt: tokens(32, 900) }));
        answers.push(await s.next());
      }
      expect(rankOf(answers[0])).toBeUndefined();
      expect(removedOf(answers[0])).toContain("x-data-parallel-rank");
      expect(["0", "1"]).toContain(rankOf(answers[1])!);
      expect(removedOf(answers[1])).not.toContain("x-data-parallel-rank");
      // SGLang's header overrides of its rank and of its prefill server's go either way: only the pick names a rank.
      for (const a of answers) expect(removedOf(a)).toEqual(expect.arrayContaining(["x-override-routed-dp-rank", "x-override-disagg-prefill-dp-rank"]));
    } finally {
      for (const c of clients) c.close();
      await single.stop({ graceMs: 0 });
      await dp.stop({ graceMs: 0 });
    }
  });

  test("above --max-inflight requests are shed with 429", async () => {
    const capped = await startTestEpp([{ id: "w", address: A, kvEvents: `tcp://${LOOPBACK}.4.11:1` }], { flags: ["--max-inflight", "1"] });
    const c = extProcClient(capped.ports.grpc);
    try {
      const first = c.open();
      first.send(headers());
      first.send(body({ prompt: [1, 2, 3] }));
      expect(setHeader((await first.next()).request_headers?.response, "x-gateway-destination-endpoint")).toBe(A);
      const second = c.open();
      second.send(headers());
      second.send(body({ prompt: [1, 2, 3] }));
      expect((await second.next()).immediate_response?.status?.code).toBe("TooManyRequests");
      first.end();
      second.end();
    } finally {
      c.close();
      await capped.stop({ graceMs: 500 });
    }
  });
});
