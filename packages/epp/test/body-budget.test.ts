// The process-wide budget on request bodies held across ext_proc streams (--ext-proc-buffer-max-bytes),
// through real full-duplex streams (TLS) against an in-process EPP: a stream whose next chunk would pass
// it is routed by load at once and its body passes through whole and in order; every way a stream drops
// its body gives the bytes back.
import { afterAll, beforeAll, expect, test } from "bun:test";
import http2 from "node:http2";
import { EXPLANATION_HEADER } from "@kv-epp/routing";
import { waitFor, LOOPBACK } from "@kv-epp/testkit";
import type { ProcessingRequest } from "../src/extproc/messages.ts";
import type { EppHandle } from "../src/main.ts";
import { FakeWorkerEvents, HOST, extProcClient, headers, rawExtProcSession, scrapeMetric, setHeader, startTestEpp, tokens, type ExtProcStream } from "./helpers.ts";

const W = `${LOOPBACK}.4.181:8000`;
const BUDGET = 100_000;
const OVERFLOWS = "dynamo_epp_ext_proc_buffer_overflows_total";
let ev: FakeWorkerEvents;
let epp: EppHandle;
let client: ReturnType<typeof extProcClient>;
const enc = new TextEncoder();

beforeAll(async () => {
  ev = await FakeWorkerEvents.start();
  epp = await startTestEpp([{ id: "w", address: W, kvEvents: ev.endpoint }], { flags: ["--ext-proc-buffer-max-bytes", String(BUDGET), "--explain"] });
  client = extProcClient(epp.ports.grpc);
});
afterAll(async () => {
  client.close();
  await epp.stop({ graceMs: 200 });
  await ev.close();
});

const scrape = (series: string) => scrapeMetric(`http://${HOST}:${epp.ports.metrics}`, series);
const buffered = () => scrape("dynamo_epp_ext_proc_buffered_bytes");
const DUPLEX = { protocol_config: { request_body_mode: "FULL_DUPLEX_STREAMED", response_body_mode: "NONE" } } as Partial<ProcessingRequest>;
/** A completion body of ~6 bytes per token. */
const bodyOf = (n: number, seed: number) => enc.encode(JSON.stringify({ prompt: tokens(n, seed) }));
const chunk = (b: Uint8Array, eos: boolean): ProcessingRequest => ({ request_body: { body: b, end_of_stream: eos } });

function open(): ExtProcStream {
  const s = client.open();
  s.send(headers("/v1/completions", false, DUPLEX));
  return s;
}

/** The route a full-duplex stream answers on its headers: destination and explanation. */
async function route(s: ExtProcStream): Promise<{ endpoint?: string; explanation?: string }> {
  const r = (await s.next()).request_headers?.response;
  return { endpoint: setHeader(r, "x-gateway-destination-endpoint"), explanation: setHeader(r, EXPLANATION_HEADER) };
}

/** The body chunks a full-duplex stream hands back, joined, up to the one that ends it. */
async function handedBack(s: ExtProcStream): Promise<Buffer> {
  const parts: Buffer[] = [];
  for (;;) {
    const c = (await s.next()).request_body?.response?.body_mutation?.streamed_response;
    parts.push(Buffer.from(c?.body ?? []));
    if (c?.end_of_stream) return Buffer.concat(parts);
  }
}

/** A raw ext_proc call, for messages a gRPC client always sends whole: their parts written as they should arrive. */
function rawCall(session: http2.ClientHttp2Session): http2.ClientHttp2Stream {
  const r = session.request({ ":method": "POST", ":path": "/envoy.service.ext_proc.v3.ExternalProcessor/Process", "content-type": "application/grpc", te: "trailers" });
  r.on("error", () => {});
  return r;
}

/** A gRPC frame header announcing an `n`-byte message. */
const frameHead = (n: number) => Buffer.from([0, n >>> 24, (n >>> 16) & 255, (n >>> 8) & 255, n & 255]);

test("two streams whose bodies together pass the budget: the second is routed by load at once and its body handed back whole, in order; counted", async () => {
  const before = (await scrape(OVERFLOWS)) ?? 0;
  const bodyA = bodyOf(12_000, 1);
  const bodyB = bodyOf(12_000, 2);
  expect(Math.min(bodyA.length, bodyB.length)).toBeGreaterThan(60_000);
  const a = open();
  a.send(chunk(bodyA.subarray(0, 60_000), false));
  await waitFor(async () => (await buffered()) === 60_000, { message: "A's first chunk held" });
  const b = open();
  b.send(chunk(bodyB.subarray(0, 30_000), false));
  await waitFor(async () => (await buffered()) === 90_000, { message: "B's first chunk held" });
  b.send(chunk(bodyB.subarray(30_000, 60_000), false)); // 120,000 would be held: over the budget

  // Routed before its body has ended, on no tokens (0 blocks), and what it had is handed back at once.
  const rb = await route(b);
  expect(rb.endpoint).toBe(W);
  expect(rb.explanation).toContain("overlap=0/0 ");
  b.send(chunk(bodyB.subarray(60_000), true)); // the rest passes through
  expect((await handedBack(b)).equals(Buffer.from(bodyB))).toBe(true);
  expect(await scrape(OVERFLOWS)).toBe(before + 1);
  expect(await buffered()).toBe(60_000); // A's alone

  // A, within the budget, is routed on its tokens once its body ends.
  a.send(chunk(bodyA.subarray(60_000), true));
  const ra = await route(a);
  expect(ra.endpoint).toBe(W);
  expect(ra.explanation).toMatch(/overlap=0\/[1-9]\d* /);
  expect((await handedBack(a)).equals(Buffer.from(bodyA))).toBe(true);
  expect(await buffered()).toBe(0);
  a.end();
  b.end();
});

test("every way a stream drops its body gives the bytes back: after streams reset, half-closed, rejected, overflowed and routed, none is held", async () => {
  const before = (await scrape(OVERFLOWS)) ?? 0;
  const streams: ExtProcStream[] = [];
  const bodies: Uint8Array[] = [];
  for (let i = 0; i < 24; i++) {
    const whole = bodyOf(5_000, 100 + i);
    bodies.push(whole);
    const s = open();
    s.send(chunk(whole.subarray(0, 20_000), false));
    streams.push(s);
  }
  // Five fit the budget exactly; the other 19 overflowed, whichever order they came in.
  await waitFor(async () => (await buffered()) === BUDGET && (await scrape(OVERFLOWS)) === before + 19, { message: "budget full, the rest overflowed" });
  streams.forEach((s, i) => {
    if (i % 4 === 0) return s.call.cancel(); // reset midway
    if (i % 4 === 1) return s.end(); // half-closed before the body's end
    if (i % 4 === 2) s.send(headers("/v1/completions", false, DUPLEX)); // a held one is rejected (unexpected)
    else s.send(chunk(bodies[i]!.subarray(20_000), true)); // routed, or passed through
    s.end();
  });
  await waitFor(async () => (await buffered()) === 0, { message: "every body's bytes given back" });
  // Nothing left that takes budget: a new body is held, then handed back whole.
  const s = open();
  const whole = bodyOf(5_000, 200);
  s.send(chunk(whole, true));
  expect((await route(s)).explanation).not.toContain("overlap=0/0 ");
  expect((await handedBack(s)).equals(Buffer.from(whole))).toBe(true);
  expect(await buffered()).toBe(0);
  s.end();
});

test("a body larger than the budget, alone, is held and routed on its tokens: a bound below a body's size does not refuse it forever", async () => {
  const before = (await scrape(OVERFLOWS)) ?? 0;
  const whole = bodyOf(25_000, 300);
  expect(whole.length).toBeGreaterThan(BUDGET);
  const s = open();
  s.send(chunk(whole.subarray(0, 60_000), false));
  s.send(chunk(whole.subarray(60_000), true));
  expect((await route(s)).explanation).toMatch(/overlap=0\/[1-9]\d* /);
  expect((await handedBack(s)).equals(Buffer.from(whole))).toBe(true);
  expect(await scrape(OVERFLOWS)).toBe(before);
  expect(await buffered()).toBe(0);
  s.end();
});

test("a body whose model must be rewritten is not passed on unheld over the budget: refused as overload (429), its bytes given back", async () => {
  const a = open();
  a.send(chunk(bodyOf(12_000, 7).subarray(0, 60_000), false));
  await waitFor(async () => (await buffered()) === 60_000, { message: "A's first chunk held" });
  const b = client.open();
  const h = headers("/v1/completions", false, DUPLEX);
  h.request_headers!.headers!.headers!.push({ key: "x-gateway-model-name-rewrite", raw_value: enc.encode("served-as") });
  b.send(h);
  b.send(chunk(bodyOf(12_000, 8).subarray(0, 60_000), false)); // 120,000 would be held
  const r = await b.next();
  expect(r.immediate_response?.status?.code).toBe("TooManyRequests"); // envoy.type.v3.StatusCode 429
  expect(await buffered()).toBe(60_000); // A's alone
  a.call.cancel();
  await waitFor(async () => (await buffered()) === 0, { message: "A's bytes given back on reset" });
  b.end();
});

/**
 * `bytes` counted, and for each of `calls` the 16 KiB block it copies small frames into while it keeps one (how the
 * client's writes were cut into frames decides whether it does).
 */
const within = (counted: number, bytes: number, calls: number) => counted >= bytes && counted <= bytes + calls * 16 * 1024;

test("the part of a gRPC message still arriving counts against the budget: past it, a second stream's call fails with RESOURCE_EXHAUSTED, counted; a reset gives the bytes back", async () => {
  const rejected = 'dynamo_epp_ext_proc_rejected_messages_total{reason="budget"}';
  const before = (await scrape(rejected)) ?? 0;
  const session = rawExtProcSession(epp.ports.grpc);
  const stream = () => rawCall(session);
  // A message of 150,000 bytes claimed, 120,000 of them sent: more than the budget, counted while it arrives.
  const a = stream();
  a.write(frameHead(150_000));
  a.write(Buffer.alloc(120_000));
  await waitFor(async () => within((await buffered()) ?? -1, 120_000, 1), { message: "A's partial message counted" });
  const b = stream();
  const bStatus = new Promise((resolve) => b.on("trailers", (t) => resolve(t["grpc-status"])));
  b.write(frameHead(150_000));
  b.write(Buffer.alloc(1_000));
  expect(await bStatus).toBe("8"); // RESOURCE_EXHAUSTED
  expect(await scrape(rejected)).toBe(before + 1);
  a.close(http2.constants.NGHTTP2_CANCEL);
  await waitFor(async () => (await buffered()) === 0, { message: "every byte given back" });
  session.destroy();
});

test("bodies held up to the budget do not fail the streams whose messages are still arriving: only arriving parts are weighed against it", async () => {
  const rejected = 'dynamo_epp_ext_proc_rejected_messages_total{reason="budget"}';
  const before = (await scrape(rejected)) ?? 0;
  const holder = open();
  holder.send(chunk(bodyOf(20_000, 11).subarray(0, BUDGET), false)); // the whole budget, held for a route
  await waitFor(async () => (await buffered()) === BUDGET, { message: "the budget held by a body" });
  const session = rawExtProcSession(epp.ports.grpc);
  const stream = () => rawCall(session);
  // Two messages arriving at once, neither whole: both counted, neither failed (a failed one would be given back).
  const c = stream();
  c.write(frameHead(50_000));
  c.write(Buffer.alloc(10_000));
  const d = stream();
  d.write(frameHead(50_000));
  d.write(Buffer.alloc(10_000));
  await waitFor(async () => within((await buffered()) ?? -1, BUDGET + 20_000, 2), { message: "both parts counted beside the held body" });
  expect(await scrape(rejected)).toBe(before);
  c.close(http2.constants.NGHTTP2_CANCEL);
  d.close(http2.constants.NGHTTP2_CANCEL);
  holder.call.cancel();
  await waitFor(async () => (await buffered()) === 0, { message: "every byte given back" });
  session.destroy();
});
