// In-flight prefixes through the real ext_proc server and picker: a request sharing a long prefix with
// one still in flight goes where that one went, before any worker has published the blocks.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { waitFor, LOOPBACK } from "@kv-epp/testkit";
import type { EppHandle } from "../src/main.ts";
import { FakeWorkerEvents, HOST, body, extProcClient, headers, scrapeMetric, setHeader, startTestEpp, tokens } from "./helpers.ts";

const A = `${LOOPBACK}.4.11:8000`;
const B = `${LOOPBACK}.4.12:8000`;

let evA: FakeWorkerEvents;
let evB: FakeWorkerEvents;
const epps: EppHandle[] = [];

async function epp(inflightPrefix: boolean): Promise<EppHandle> {
  const e = await startTestEpp(
    [
      { id: "worker-a", address: A, kvEvents: evA.endpoint },
      { id: "worker-b", address: B, kvEvents: evB.endpoint },
    ],
    { flags: ["--inflight-prefix", String(inflightPrefix)] },
  );
  epps.push(e);
  return e;
}

beforeAll(async () => {
  evA = await FakeWorkerEvents.start();
  evB = await FakeWorkerEvents.start();
});

afterAll(async () => {
  for (const e of epps) await e.stop({ graceMs: 1000 });
  await evA?.close();
  await evB?.close();
});

// 32 shared blocks (no worker holds them), then two blocks of each request's own.
const shared = tokens(32 * 16, 777);
const first = [...shared, ...tokens(32, 1)];
const second = [...shared, ...tokens(32, 2)];

/** Sends the request and returns where it was routed; the stream stays open, so the request stays in flight. */
async function route(client: ReturnType<typeof extProcClient>, prompt: number[]) {
  const s = client.open();
  s.send(headers());
  s.send(body({ prompt }));
  const endpoint = setHeader((await s.next()).request_headers?.response, "x-gateway-destination-endpoint");
  await s.next(); // the body handed back
  return { endpoint, stream: s };
}

describe("in-flight prefixes", () => {
  test("with them, a request sharing a long prefix with one still in flight lands on the same worker; the prefix leaves when both end", async () => {
    const e = await epp(true);
    const client = extProcClient(e.ports.grpc);
    const metrics = `http://${HOST}:${e.ports.metrics}`;
    const a = await route(client, first);
    expect(await scrapeMetric(metrics, "dynamo_epp_inflight_prefix_blocks")).toBe(34);
    const b = await route(client, second);
    expect([A, B]).toContain(a.endpoint!);
    expect(b.endpoint).toBe(a.endpoint);
    expect(await scrapeMetric(metrics, "dynamo_epp_inflight_prefix_blocks")).toBe(68);
    a.stream.call.cancel();
    b.stream.call.cancel();
    await waitFor(async () => (await scrapeMetric(metrics, "dynamo_epp_inflight_prefix_blocks")) === 0, { message: "prefixes left with their requests" });
    expect(await scrapeMetric(metrics, "dynamo_epp_inflight_requests")).toBe(0);
    client.close();
  });

  test("without them (--inflight-prefix false), the second request sees no overlap anywhere and load sends it to the other worker", async () => {
    const e = await epp(false);
    const client = extProcClient(e.ports.grpc);
    const a = await route(client, first);
    const b = await route(client, second);
    expect(new Set([a.endpoint, b.endpoint])).toEqual(new Set([A, B]));
    expect(await scrapeMetric(`http://${HOST}:${e.ports.metrics}`, "dynamo_epp_inflight_prefix_blocks")).toBe(0);
    a.stream.call.cancel();
    b.stream.call.cancel();
    client.close();
  });
});
