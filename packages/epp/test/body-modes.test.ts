// Every ext_proc body mode as Envoy sends it (over TLS): a BUFFERED_PARTIAL body cut at the buffer
// limit, a BUFFERED request's headers answered without a client's rank headers, GRPC mode refused at stream start, headers then trailers with no body in full duplex,
// streamed chunks within 62,000 bytes, a stream without protocol_config (Envoy < 1.34), and a
// gateway that sends no response bodies.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { waitFor, LOOPBACK } from "@kv-epp/testkit";
import type { ProcessingRequest } from "../src/extproc/messages.ts";
import type { EppHandle } from "../src/main.ts";
import { FakeWorkerEvents, HOST, body, capturingLog, extProcClient, headers, scrapeMetric, setHeader, startTestEpp, tokens, type Resp } from "./helpers.ts";

const W = `${LOOPBACK}.4.71:8000`;
let ev: FakeWorkerEvents;
let epp: EppHandle;
let client: ReturnType<typeof extProcClient>;
const captured = capturingLog();
const metric = async (series: string) => (await scrapeMetric(`http://${HOST}:${epp.ports.metrics}`, series)) ?? 0;
const enc = new TextEncoder();

beforeAll(async () => {
  ev = await FakeWorkerEvents.start();
  epp = await startTestEpp([{ id: "w", address: W, kvEvents: ev.endpoint }], { log: captured.log });
  client = extProcClient(epp.ports.grpc);
});
afterAll(async () => {
  client.close();
  await epp.stop({ graceMs: 200 });
  await ev.close();
});

const mode = (request_body_mode: string, response_body_mode = "NONE"): Partial<ProcessingRequest> => ({
  protocol_config: { request_body_mode, response_body_mode } as ProcessingRequest["protocol_config"],
});
const destination = (r: Resp, phase: "request_headers" | "request_body") => setHeader(r[phase]?.response, "x-gateway-destination-endpoint");

test("BUFFERED_PARTIAL: a body cut at the buffer limit (end_of_stream false, not JSON yet) is routed by load, counted, never a 400", async () => {
  const before = await metric("dynamo_epp_ext_proc_partial_bodies_total");
  const s = client.open();
  s.send(headers("/v1/completions", false, mode("BUFFERED_PARTIAL")));
  expect((await s.next()).response).toBe("request_headers"); // CONTINUE
  const whole = JSON.stringify({ prompt: tokens(4000, 9) });
  s.send({ request_body: { body: enc.encode(whole.slice(0, 1000)), end_of_stream: false } });
  const r = await s.next();
  expect(r.immediate_response).toBeUndefined();
  expect(destination(r, "request_body")).toBe(W);
  expect(await metric("dynamo_epp_ext_proc_partial_bodies_total")).toBe(before + 1);
  s.end();
});

test("BUFFERED: the headers' CONTINUE removes a client's own rank headers (a route on a trailers answer could not), the body's answer routes", async () => {
  const s = client.open();
  const h = headers("/v1/completions", false, mode("BUFFERED"));
  const rankHeaders = ["x-data-parallel-rank", "x-override-routed-dp-rank", "x-override-disagg-prefill-dp-rank"];
  for (const key of rankHeaders) h.request_headers!.headers!.headers!.push({ key, raw_value: enc.encode("3") });
  s.send(h);
  const cont = await s.next();
  expect(cont.response).toBe("request_headers");
  expect(cont.request_headers?.response?.header_mutation?.remove_headers).toEqual(rankHeaders);
  s.send({ request_body: { body: enc.encode(JSON.stringify({ prompt: tokens(64, 11) })), end_of_stream: true } });
  expect(destination(await s.next(), "request_body")).toBe(W);
  s.end();
});

test("GRPC body mode is refused at stream start with UNIMPLEMENTED saying which modes to configure", async () => {
  const before = await metric('dynamo_epp_ext_proc_rejected_messages_total{reason="grpc_body_mode"}');
  const s = client.open();
  s.send(headers("/v1/completions", false, mode("GRPC", "GRPC")));
  const err = (await s.next().catch((e: unknown) => e)) as { code?: number; details?: string };
  expect(err.code).toBe(12);
  expect(err.details).toContain("GRPC is not supported");
  expect(err.details).toContain("FULL_DUPLEX_STREAMED");
  expect(await metric('dynamo_epp_ext_proc_rejected_messages_total{reason="grpc_body_mode"}')).toBe(before + 1);
});

test("full duplex, headers then trailers and no body: the route, then the trailers' answer, and no empty body chunk", async () => {
  const s = client.open();
  s.send(headers("/v1/completions", false, mode("FULL_DUPLEX_STREAMED")));
  s.send({ request_trailers: { trailers: { headers: [{ key: "x-t", raw_value: enc.encode("1") }] } } });
  const first = await s.next();
  expect(destination(first, "request_headers")).toBe(W);
  expect((await s.next()).response).toBe("request_trailers");
  s.send({ response_headers: { headers: { headers: [{ key: ":status", raw_value: enc.encode("200") }] }, end_of_stream: true } });
  expect((await s.next()).response).toBe("response_headers");
  expect(s.pending).toBe(0);
  s.end();
});

test("full duplex: a large body is handed back in chunks of at most 62,000 bytes that add up to it", async () => {
  const json = enc.encode(JSON.stringify({ prompt: tokens(40_000, 4) })); // ~240 KB
  const s = client.open();
  s.send(headers("/v1/completions", false, mode("FULL_DUPLEX_STREAMED")));
  for (let off = 0; off < json.length; off += 100_000) s.send({ request_body: { body: json.subarray(off, off + 100_000), end_of_stream: off + 100_000 >= json.length } });
  expect(destination(await s.next(), "request_headers")).toBe(W);
  const chunks: Buffer[] = [];
  for (;;) {
    const c = (await s.next()).request_body?.response?.body_mutation?.streamed_response;
    chunks.push(Buffer.from(c?.body ?? []));
    if (c?.end_of_stream) break;
  }
  expect(Math.max(...chunks.map((c) => c.length))).toBeLessThanOrEqual(62_000);
  expect(Buffer.concat(chunks).equals(Buffer.from(json))).toBe(true);
  s.end();
});

test("without protocol_config (Envoy < 1.34) one warning says which modes are assumed and the flags that set them", async () => {
  for (let i = 0; i < 3; i++) {
    const s = client.open();
    s.send(headers());
    s.send(body({ prompt: tokens(32, i) }));
    expect(destination(await s.next(), "request_headers")).toBe(W);
    s.end();
  }
  const warnings = captured.lines.filter((l) => String(l.msg).includes("no protocol_config"));
  expect(warnings).toHaveLength(1);
  expect(warnings[0]!.msg).toContain("FULL_DUPLEX_STREAMED");
  expect(warnings[0]!.msg).toContain("--body-mode");
  expect(warnings[0]!.msg).toContain("--response-body-mode");
});

test("a gateway that sends no response bodies: the load is held until the stream ends, then released and counted", async () => {
  const before = await metric("dynamo_epp_released_without_response_body_total");
  const s = client.open();
  s.send(headers("/v1/completions", false, mode("FULL_DUPLEX_STREAMED", "NONE")));
  s.send(body({ prompt: tokens(64, 77) }));
  expect(destination(await s.next(), "request_headers")).toBe(W);
  s.send({ response_headers: { headers: { headers: [{ key: ":status", raw_value: enc.encode("200") }] }, end_of_stream: false } });
  await s.next();
  expect(epp.load.inflight).toBe(1); // response headers alone do not end it
  s.end(); // Envoy closes the stream when the response is over
  await waitFor(() => epp.load.inflight === 0, { message: "released at the stream's end" });
  expect(await metric("dynamo_epp_released_without_response_body_total")).toBe(before + 1);
});
