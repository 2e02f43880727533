import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import pino from "pino";
import { freePort, LOOPBACK, waitFor } from "@kv-epp/testkit";
import { concurrentLegs, type ConcurrentLegs } from "./concurrent-legs.ts";
import { createMetrics } from "./metrics.ts";

// Both legs at once against real servers: a prefill worker that never answers (it holds its KV for a decode that
// is not coming), and decode workers that fail, answer, or stream.

const H = `${LOOPBACK}.2.120`;
let prefillCut = 0;
let prefillSeen = 0;
let servers: ReturnType<typeof Bun.serve>[] = [];
let prefillUrl: string, decodeBase: string;

beforeAll(() => {
  const prefill = Bun.serve({
    hostname: H, port: 0, idleTimeout: 0,
    fetch: (req) => {
      prefillSeen++;
      req.signal.addEventListener("abort", () => prefillCut++);
      return new Promise<Response>(() => {}); // never answers
    },
  });
  const decode = Bun.serve({
    hostname: H, port: 0, idleTimeout: 0,
    fetch: (req) => {
      if (new URL(req.url).pathname === "/fails") return Response.json({ error: { message: "no" } }, { status: 500 });
      return new Response(new ReadableStream({ start: (ctl) => ctl.enqueue(new TextEncoder().encode("data: {}\n\n")) }), { headers: { "content-type": "text/event-stream" } });
    },
  });
  servers = [prefill, decode];
  prefillUrl = `http://${H}:${prefill.port}/v1/completions`;
  decodeBase = `http://${H}:${decode.port}`;
});
afterAll(() => {
  for (const s of servers) void s.stop(true);
});

function legs(decodeUrl: string, signal = new AbortController().signal, closing?: AbortSignal) {
  const metrics = createMetrics();
  const p: ConcurrentLegs = {
    prefillUrl, decodeUrl, prefillBody: "{}", decodeBody: "{}", prefillHeaders: new Headers(), decodeHeaders: new Headers(),
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
});
