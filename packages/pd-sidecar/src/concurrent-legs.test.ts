import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import pino from "pino";
import { freePort, LOOPBACK, waitFor } from "@kv-epp/testkit";
import { concurrentLegs, PrefillLegFailed, type ConcurrentLegs } from "./concurrent-legs.ts";
import { createMetrics } from "./metrics.ts";

// Both legs at once against real servers: a prefill worker that never answers (it holds its KV for a decode that
// is not coming) or fails, and decode workers that fail, answer, stream, or wait for KV that never comes.

const H = `${LOOPBACK}.2.120`;
let prefillCut = 0;
let prefillSeen = 0;
let servers: ReturnType<typeof Bun.serve>[] = [];
let prefillUrl: string, decodeBase: string, prefillBase: string;
/** decode requests cut by the sidecar, by path; `/waits` requests still waiting, and the first one's arrival */
const decodeCut: Record<string, number> = {};
let waiting = 0;
let waitArrived = Promise.withResolvers<void>();
/** when the gated prefill answers 503, and the gated decode stream goes on */
type Gate = ReturnType<typeof Promise.withResolvers<void>>;
let gates: { prefill: Gate; decode: Gate };
const enc = (s: string) => new TextEncoder().encode(s);
let listeners: { stop(closeActive?: boolean): void }[] = [];
let headersOnlyUrl: string;
/** the raw decode worker's answers begun, and its connections closed */
let headersSent = 0, headersClosed = 0;

beforeAll(() => {
  const prefill = Bun.serve({
    hostname: H, port: 0, idleTimeout: 0,
    fetch: (req) => {
      prefillSeen++;
      req.signal.addEventListener("abort", () => prefillCut++);
      return new Promise<Response>(() => {}); // never answers
    },
  });
  // A prefill worker that fails: at once, or when the test says.
  const failing = Bun.serve({
    hostname: H, port: 0, idleTimeout: 0,
    fetch: async (req) => {
      const path = new URL(req.url).pathname;
      if (path === "/gated") await gates.prefill.promise;
      // Fails once its decode leg waits, so that the cut is seen.
      if (path === "/after-decode") await waitArrived.promise;
      return Response.json({ error: { message: "overloaded" } }, { status: 503 });
    },
  });
  const decode = Bun.serve({
    hostname: H, port: 0, idleTimeout: 0,
    fetch: (req) => {
      const path = new URL(req.url).pathname;
      req.signal.addEventListener("abort", () => (decodeCut[path] = (decodeCut[path] ?? 0) + 1));
      if (path === "/fails") return Response.json({ error: { message: "no" } }, { status: 500 });
      if (path === "/busy") return Response.json({ error: { message: "too many requests" } }, { status: 429 });
      // Waits for its KV, which never comes: no answer at all.
      if (path === "/waits") {
        // Cut on its way in, the abort event has been and gone.
        if (!req.signal.aborted) {
          waiting++;
          req.signal.addEventListener("abort", () => waiting--);
        }
        waitArrived.resolve();
        return new Promise<Response>(() => {});
      }
      if (path === "/gated") {
        return new Response(new ReadableStream({
          start: async (ctl) => {
            ctl.enqueue(enc("data: 1\n\n"));
            await gates.decode.promise;
            ctl.enqueue(enc("data: 2\n\n"));
            ctl.close();
          },
        }), { headers: { "content-type": "text/event-stream" } });
      }
      return new Response(new ReadableStream({ start: (ctl) => ctl.enqueue(enc("data: {}\n\n")) }), { headers: { "content-type": "text/event-stream" } });
    },
  });
  // A streaming decode worker waiting for its KV: its status line and headers sent, no body byte yet (raw, so
  // nothing can hold the headers back).
  const answered = new WeakSet<object>();
  const headersOnly = Bun.listen({
    hostname: H, port: 0,
    socket: {
      data: (socket) => {
        if (answered.has(socket)) return;
        answered.add(socket);
        socket.write("HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n");
        headersSent++;
      },
      close: () => void headersClosed++,
    },
  });
  servers = [prefill, failing, decode];
  listeners = [headersOnly];
  prefillUrl = `http://${H}:${prefill.port}/v1/completions`;
  prefillBase = `http://${H}:${failing.port}`;
  decodeBase = `http://${H}:${decode.port}`;
  headersOnlyUrl = `http://${H}:${headersOnly.port}/v1/completions`;
});
afterAll(() => {
  for (const s of servers) void s.stop(true);
  for (const l of listeners) l.stop(true);
});

function legs(decodeUrl: string, signal = new AbortController().signal, closing?: AbortSignal, prefill = prefillUrl) {
  const metrics = createMetrics();
  const p: ConcurrentLegs = {
    prefillUrl: prefill, decodeUrl, prefillBody: "{}", decodeBody: "{}", prefillHeaders: new Headers(), decodeHeaders: new Headers(),
    // Longer than any test: a leg cut within it was cut by the decode leg's failure.
    prefillTimeoutMs: 600_000, signal, closing, metrics, log: pino({ level: "silent" }),
  };
  return { p, metrics };
}
const count = async (m: ReturnType<typeof createMetrics>, reason: string) =>
  (await m.registry.getSingleMetric("pd_sidecar_failures_total")!.get()).values.find((v) => v.labels.reason === reason)?.value ?? 0;

describe("concurrentLegs", () => {
  test("a decode worker that answers non-2xx cancels the prefill leg (not counted as the prefill's failure)", async () => {
    const before = prefillCut, seen = prefillSeen;
    const { p, metrics } = legs(`${decodeBase}/fails`);
    const res = await concurrentLegs(p);
    expect(res.status).toBe(500);
    await waitFor(() => prefillSeen > seen, { message: "the prefill leg sent" });
    await waitFor(() => prefillCut > before, { message: "the prefill leg cancelled" });
    expect(await count(metrics, "decode_status")).toBe(1);
    expect(await count(metrics, "prefill_unreachable")).toBe(0);
    expect(await count(metrics, "prefill_timeout")).toBe(0);
  });

  test("a decode worker that cannot be reached cancels the prefill leg", async () => {
    const before = prefillCut, seen = prefillSeen;
    const { p } = legs(`http://${H}:${await freePort(H)}/v1/completions`);
    await expect(concurrentLegs(p)).rejects.toBeDefined();
    await waitFor(() => prefillSeen > seen, { message: "the prefill leg sent" });
    await waitFor(() => prefillCut > before, { message: "the prefill leg cancelled" });
  });

  test("a client that hangs up once the decode leg streams leaves the prefill leg running", async () => {
    const before = prefillCut, seen = prefillSeen;
    const client = new AbortController();
    const { p } = legs(`${decodeBase}/streams`, client.signal);
    const res = await concurrentLegs(p);
    expect(res.status).toBe(200);
    await res.body!.getReader().read();
    await waitFor(() => prefillSeen > seen, { message: "the prefill leg sent" });
    client.abort();
    // A request that does get cancelled is cut within a few event-loop turns; this one's leg is still open after
    // a decode request of its own round-trips.
    const { p: probe } = legs(`${decodeBase}/fails`);
    await concurrentLegs(probe);
    await waitFor(() => prefillCut > before, { message: "the probe's prefill leg cancelled" });
    expect(prefillCut).toBe(before + 1);
  });

  test("the sidecar's close() ends a prefill leg still running in the background, uncounted", async () => {
    const before = prefillCut, seen = prefillSeen;
    const closing = new AbortController();
    const { p, metrics } = legs(`${decodeBase}/streams`, undefined, closing.signal);
    const res = await concurrentLegs(p);
    await res.body!.getReader().read();
    await waitFor(() => prefillSeen > seen, { message: "the prefill leg sent" });
    closing.abort();
    await waitFor(() => prefillCut > before, { message: "the prefill leg ended by close()" });
    expect(await count(metrics, "prefill_unreachable")).toBe(0);
  });

  test("a decode worker that answers 4xx keeps what the connector cached; one that answers 5xx drops it", async () => {
    for (const [path, dropped] of [["/busy", 0], ["/fails", 1]] as const) {
      let calls = 0;
      const { p } = legs(`${decodeBase}${path}`);
      const res = await concurrentLegs({ ...p, onFailure: () => calls++ });
      expect(res.status).toBe(path === "/busy" ? 429 : 500);
      expect(calls).toBe(dropped);
    }
  });
});

describe("concurrentLegs, a prefill leg that fails", () => {
  test("with a 503 while the decode worker waits for its KV: the decode leg is cut, PrefillLegFailed, counted once", async () => {
    const cut = decodeCut["/waits"] ?? 0;
    waitArrived = Promise.withResolvers();
    let calls = 0;
    const { p, metrics } = legs(`${decodeBase}/waits`, undefined, undefined, `${prefillBase}/after-decode`);
    const err = await concurrentLegs({ ...p, onFailure: () => calls++ }).catch((e) => e);
    expect(err).toBeInstanceOf(PrefillLegFailed);
    expect(err.message).toBe(`the prefill leg failed (prefill worker ${new URL(prefillBase).host} answered 503): the decode leg was cancelled`);
    await waitFor(() => (decodeCut["/waits"] ?? 0) > cut, { message: "the decode leg cut" });
    expect(await count(metrics, "prefill_status")).toBe(1);
    expect(await count(metrics, "decode_status")).toBe(0);
    expect(calls).toBe(1);
  });

  test("unreachable: the same, counted as prefill_unreachable", async () => {
    const refused = `${H}:${await freePort(H)}`;
    const { p, metrics } = legs(`${decodeBase}/waits`, undefined, undefined, `http://${refused}/v1/completions`);
    const err = await concurrentLegs(p).catch((e) => e);
    expect(err).toBeInstanceOf(PrefillLegFailed);
    expect(err.message).toContain(`prefill worker ${refused} unreachable`);
    // Refused at once, the decode leg may be cut before it reaches its worker: none is left waiting.
    await waitFor(() => waiting === 0, { message: "no decode leg left waiting" });
    expect(await count(metrics, "prefill_unreachable")).toBe(1);
  });

  test("after the decode worker's headers, before its first body byte: still cut (a streaming decode sends its headers before it has the KV)", async () => {
    gates = { prefill: Promise.withResolvers(), decode: Promise.withResolvers() };
    const [sent, closed] = [headersSent, headersClosed];
    const { p, metrics } = legs(headersOnlyUrl, undefined, undefined, `${prefillBase}/gated`);
    const legsDone = concurrentLegs(p).catch((e) => e);
    await waitFor(() => headersSent > sent, { message: "the decode's headers sent" });
    // The headers are on their way: a request of its own round-trips before the prefill fails.
    await fetch(`${decodeBase}/fails`, { method: "POST" });
    gates.prefill.resolve();
    expect(await legsDone).toBeInstanceOf(PrefillLegFailed);
    await waitFor(() => headersClosed > closed, { message: "the decode connection closed" });
    expect(await count(metrics, "prefill_status")).toBe(1);
  });

  test("once the decode worker answers: its answer goes on to the end, the failure only counted", async () => {
    gates = { prefill: Promise.withResolvers(), decode: Promise.withResolvers() };
    const cut = decodeCut["/gated"] ?? 0;
    const { p, metrics } = legs(`${decodeBase}/gated`, undefined, undefined, `${prefillBase}/gated`);
    const res = await concurrentLegs(p);
    expect(res.status).toBe(200);
    const reader = res.body!.getReader();
    const dec = new TextDecoder();
    let text = dec.decode((await reader.read()).value);
    gates.prefill.resolve();
    await waitFor(async () => (await count(metrics, "prefill_status")) === 1, { message: "the prefill's 503 counted" });
    gates.decode.resolve();
    for (let r = await reader.read(); !r.done; r = await reader.read()) text += dec.decode(r.value);
    expect(text).toBe("data: 1\n\ndata: 2\n\n");
    expect(decodeCut["/gated"] ?? 0).toBe(cut);
  });
});
