// x-gateway-model-name-rewrite through real ext_proc (gRPC over TLS): the forwarded body names the
// model the request was scored for, byte for byte the client's body otherwise, with its new
// content-length; the response names the client's model again. In full duplex and buffered modes.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import type { ProcessingRequest } from "../src/extproc/messages.ts";
import type { EppHandle } from "../src/main.ts";
import { body, extProcClient, headers, scrapeMetric, setHeader, startTestEpp, type Resp } from "./helpers.ts";
import { LOOPBACK } from "@kv-epp/testkit";

const IP = `${LOOPBACK}.4.165`;
let epp: EppHandle;
let client: ReturnType<typeof extProcClient>;

beforeAll(async () => {
  epp = await startTestEpp([{ id: "w", address: `${IP}:8000`, kvEvents: `tcp://${IP}:5557` }]);
  client = extProcClient(epp.ports.grpc);
});
afterAll(async () => {
  client?.close();
  await epp?.stop({ graceMs: 100 });
});

const enc = new TextEncoder();
const text = (b: Uint8Array | undefined) => Buffer.from(b ?? []).toString();

/** Request headers naming the model to run as, with the stream's body modes. */
function rewriteHeaders(model: string, modes: ProcessingRequest["protocol_config"]): ProcessingRequest {
  const h = headers("/v1/chat/completions", false, { protocol_config: modes });
  h.request_headers!.headers!.headers!.push({ key: "x-gateway-model-name-rewrite", raw_value: enc.encode(model) });
  return h;
}
const responseHeaders = (extra: [string, string][] = []): ProcessingRequest => ({
  response_headers: { headers: { headers: ([[":status", "200"], ...extra] as [string, string][]).map(([key, v]) => ({ key, raw_value: enc.encode(v) })) } },
});
const responseBody = (chunk: string, eos: boolean): ProcessingRequest => ({ response_body: { body: enc.encode(chunk), end_of_stream: eos } });
const streamed = (r: Resp, phase: "request_body" | "response_body") => r[phase]?.response?.body_mutation?.streamed_response;

// The client's body: the alias it calls the model by, and floats, unicode and spacing a re-serialisation would change.
const CLIENT = '{"messages": [{"role": "user", "content": "héllo \\u00e9"}], "temperature": 1.0,  "model" : "alias", "max_tokens": 5}';
const FORWARDED = '{"messages": [{"role": "user", "content": "héllo \\u00e9"}], "temperature": 1.0,  "model" : "llama-3-8b-lora-7", "max_tokens": 5}';

describe("full duplex", () => {
  test("the body handed back names the rewritten model, other bytes as sent, and content-length is its new length", async () => {
    const s = client.open();
    s.send(rewriteHeaders("llama-3-8b-lora-7", { request_body_mode: "FULL_DUPLEX_STREAMED", response_body_mode: "FULL_DUPLEX_STREAMED" }));
    s.send(body(CLIENT));
    const h = await s.next();
    const route = h.request_headers?.response;
    expect(setHeader(route, "x-gateway-destination-endpoint")).toBe(`${IP}:8000`);
    expect(setHeader(route, "content-length")).toBe(String(enc.encode(FORWARDED).length));
    const b = streamed(await s.next(), "request_body");
    expect(text(b?.body)).toBe(FORWARDED);
    expect(b?.end_of_stream).toBe(true);

    // vLLM answers for the name it was given; the client reads its own, also where a field is split
    // between two chunks.
    s.send(responseHeaders([["content-type", "text/event-stream"]]));
    await s.next();
    const sse = [
      'data: {"id":"c1","object":"chat.completion.chunk","model":"llama-3-8b-lora-7","choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n',
      'data: {"id":"c1","object":"chat.completion.chunk","model":"llama-3-8b-l',
      'ora-7","choices":[]}\n\ndata: [DONE]\n\n',
    ];
    const out: string[] = [];
    for (const [i, chunk] of sse.entries()) {
      s.send(responseBody(chunk, i === sse.length - 1));
      out.push(text(streamed(await s.next(), "response_body")?.body));
    }
    expect(out.join("")).toBe(sse.join("").replaceAll('"model":"llama-3-8b-lora-7"', '"model":"alias"'));
    expect(out[0]).toContain('"model":"alias"');
    s.end();
  });

  test("a body that names no model gets the rewritten one first; one already naming it is forwarded untouched", async () => {
    for (const [sent, forwarded] of [
      ['{"prompt": "x"}', '{"model":"served","prompt": "x"}'],
      ['{"model":"served","prompt":"x"}', '{"model":"served","prompt":"x"}'],
    ]) {
      const s = client.open();
      s.send(rewriteHeaders("served", { request_body_mode: "FULL_DUPLEX_STREAMED" }));
      s.send(body(sent));
      const h = await s.next();
      expect(setHeader(h.request_headers?.response, "content-length")).toBe(String(forwarded!.length));
      expect(text(streamed(await s.next(), "request_body")?.body)).toBe(forwarded!);
      s.end();
    }
  });
});

describe("buffered", () => {
  test("the body answer replaces the body and sets its content-length; the buffered response is mapped back with its own", async () => {
    const s = client.open();
    s.send(rewriteHeaders("llama-3-8b-lora-7", { request_body_mode: "BUFFERED", response_body_mode: "BUFFERED" }));
    expect((await s.next()).request_headers).toBeDefined();
    s.send(body(CLIENT));
    const r = await s.next();
    const common = r.request_body?.response;
    expect(setHeader(common, "x-gateway-destination-endpoint")).toBe(`${IP}:8000`);
    expect(setHeader(common, "content-length")).toBe(String(enc.encode(FORWARDED).length));
    expect(text(common?.body_mutation?.body)).toBe(FORWARDED);

    const answer = '{"id":"cmpl-1","object":"chat.completion","model":"llama-3-8b-lora-7","choices":[],"usage":{"prompt_tokens":9}}';
    s.send(responseHeaders([["content-type", "application/json"], ["content-length", String(answer.length)]]));
    await s.next();
    s.send(responseBody(answer, true));
    const mapped = answer.replace("llama-3-8b-lora-7", "alias");
    const rb = (await s.next()).response_body?.response;
    expect(text(rb?.body_mutation?.body)).toBe(mapped);
    expect(setHeader(rb, "content-length")).toBe(String(mapped.length));
    s.end();
  });

  test("a response chunk naming no served model is answered CONTINUE, not sent back as a mutation", async () => {
    const s = client.open();
    s.send(rewriteHeaders("llama-3-8b-lora-7", { request_body_mode: "BUFFERED", response_body_mode: "STREAMED" }));
    await s.next();
    s.send(body(CLIENT));
    await s.next();
    s.send(responseHeaders([["content-type", "text/event-stream"]]));
    await s.next();
    for (const [i, chunk] of ['data: {"choices":[{"delta":{"content":"hi"}}]}\n\n', "data: [DONE]\n\n"].entries()) {
      s.send(responseBody(chunk, i === 1));
      const r = await s.next();
      expect(r.response).toBe("response_body");
      expect(r.response_body?.response?.body_mutation).toBeFalsy();
    }
    s.end();
  });
});

test("each rewrite is counted by what it did; a body mode that forwards the body before the route cannot rewrite it", async () => {
  const s = client.open();
  s.send(rewriteHeaders("served", { request_body_mode: "STREAMED" }));
  expect(setHeader((await s.next()).request_headers?.response, "x-gateway-destination-endpoint")).toBe(`${IP}:8000`);
  s.end();
  // A request with no body (a GET) has nothing to rewrite: routed, not counted.
  const get = client.open();
  const h = rewriteHeaders("served", { request_body_mode: "FULL_DUPLEX_STREAMED" });
  h.request_headers!.end_of_stream = true;
  get.send(h);
  expect(setHeader((await get.next()).request_headers?.response, "x-gateway-destination-endpoint")).toBe(`${IP}:8000`);
  get.end();
  const series = (result: string) => scrapeMetric(`http://${LOOPBACK}.4.1:${epp.ports.metrics}`, `dynamo_epp_model_rewrites_total{result="${result}"}`);
  expect(await series("rewritten")).toBe(4);
  expect(await series("same_name")).toBe(1);
  expect(await series("body_not_held")).toBe(1);
});
