// GAIE's conformance-suite hooks through real ext_proc (gRPC over TLS), behind --conformance-test-hooks:
// the test-epp-endpoint-selection header steers a request to the pods (ip) and endpoints (ip:port) it
// names, and the response headers echo the endpoint the gateway reports served the request and the one
// picked. Off by default: the header then steers nothing and nothing is echoed.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import type { ProcessingRequest } from "../src/extproc/messages.ts";
import type { EppHandle } from "../src/main.ts";
import { body, extProcClient, headers, setHeader, startTestEpp, type ExtProcStream, type Resp } from "./helpers.ts";
import { LOOPBACK, LOOPBACK_PATTERN } from "@kv-epp/testkit";

const [A, B, C, D] = [`${LOOPBACK}.4.166`, `${LOOPBACK}.4.167`, `${LOOPBACK}.4.168`, `${LOOPBACK}.4.171`];
const workers = [
  ...[A, B, C].map((ip, i) => ({ id: `w${i}`, address: `${ip}:8000`, kvEvents: `tcp://${ip}:5557` })),
  // A pod of two data-parallel ranks, each its own API server (the suite's DP pool has three).
  { id: "dp", address: [`${D}:3000`, `${D}:3002`], kvEvents: `tcp://${D}:5557` },
];
const enc = new TextEncoder();

let on: EppHandle;
let off: EppHandle;
let onClient: ReturnType<typeof extProcClient>;
let offClient: ReturnType<typeof extProcClient>;
const open: ExtProcStream[] = [];

beforeAll(async () => {
  [on, off] = await Promise.all([startTestEpp(workers, { flags: ["--conformance-test-hooks"] }), startTestEpp(workers)]);
  onClient = extProcClient(on.ports.grpc);
  offClient = extProcClient(off.ports.grpc);
});
afterAll(async () => {
  for (const s of open) s.end();
  onClient?.close();
  offClient?.close();
  await Promise.all([on?.stop({ graceMs: 100 }), off?.stop({ graceMs: 100 })]);
});

const withHint = (ips: string[]): Partial<ProcessingRequest> => ({
  metadata_context: { filter_metadata: { "envoy.lb.subset_hint": { fields: { "x-gateway-destination-endpoint-subset": { listValue: { values: ips.map((stringValue) => ({ stringValue })) } } } } } },
});

/** Routes a request with the selection header (full duplex: the route, then the body handed back); the stream stays open. */
async function route(client: ReturnType<typeof extProcClient>, selection: string | undefined, extra: Partial<ProcessingRequest> = {}): Promise<{ s: ExtProcStream; endpoint?: string; status?: unknown }> {
  const s = client.open();
  open.push(s);
  const h = headers("/v1/completions", false, extra);
  if (selection !== undefined) h.request_headers!.headers!.headers!.push({ key: "test-epp-endpoint-selection", raw_value: enc.encode(selection) });
  s.send(h);
  s.send(body({ model: "conformance-fake-model", prompt: "Write as if you were a critic: San Francisco" }));
  const r: Resp = await s.next();
  if (r.immediate_response) return { s, status: r.immediate_response.status?.code };
  expect((await s.next()).request_body?.response?.body_mutation?.streamed_response?.end_of_stream).toBe(true);
  return { s, endpoint: setHeader(r.request_headers?.response, "x-gateway-destination-endpoint") };
}

describe("--conformance-test-hooks", () => {
  test("the selection header keeps every request on what it names: a pod by its IP, an endpoint by ip:port", async () => {
    for (const pod of [A, B, C]) {
      for (let i = 0; i < 3; i++) expect((await route(onClient, pod)).endpoint).toBe(`${pod}:8000`);
      expect((await route(onClient, `${pod}:8000`)).endpoint).toBe(`${pod}:8000`);
    }
    for (const pair of [` ${A} ,${C}:8000`, `${B},${C}`])
      for (let i = 0; i < 4; i++) expect(pair).toContain((await route(onClient, pair)).endpoint!.split(":")[0]!);
    // The data-parallel pod: its IP allows either rank's server, ip:port pins one.
    for (let i = 0; i < 4; i++) expect((await route(onClient, `${D}:3002`)).endpoint).toBe(`${D}:3002`);
    for (let i = 0; i < 4; i++) expect((await route(onClient, `${A},${D}:3000`)).endpoint).toMatch(new RegExp(`^(${A}:8000|${D}:3000)$`));
    for (let i = 0; i < 4; i++) expect((await route(onClient, D)).endpoint).toMatch(new RegExp(`^${D}:300[02]$`));
  });

  test("the header wins over the gateway's subset hint; one naming no known pod leaves every endpoint a candidate", async () => {
    expect((await route(onClient, C, withHint([A]))).endpoint).toBe(`${C}:8000`);
    expect((await route(onClient, "256.256.256.256")).endpoint).toMatch(new RegExp(`^${LOOPBACK_PATTERN}\\.4\\.(16[678]:8000|171:300[02])$`));
    expect((await route(onClient, `${B}:9999`)).endpoint).toMatch(new RegExp(`^${LOOPBACK_PATTERN}\\.4\\.(16[678]:8000|171:300[02])$`));
    // No header: the subset hint applies as always.
    expect((await route(onClient, undefined, withHint([A]))).endpoint).toBe(`${A}:8000`);
  });

  test("the response headers echo the endpoint the gateway reports served the request, and the one picked", async () => {
    const { s, endpoint } = await route(onClient, B);
    s.send({
      response_headers: { headers: { headers: [{ key: ":status", raw_value: enc.encode("200") }] } },
      metadata_context: { filter_metadata: { "envoy.lb": { fields: { "x-gateway-destination-endpoint-served": { stringValue: `${B}:8000` } } } } },
    });
    const common = (await s.next()).response_headers?.response;
    expect(setHeader(common, "x-conformance-test-served-endpoint")).toBe(`${B}:8000`);
    expect(setHeader(common, "x-conformance-test-selected-endpoint")).toBe(endpoint!);

    // A gateway that does not report what served the request fails the suite's check, with lwepp's words.
    const other = await route(onClient, A);
    other.s.send({ response_headers: { headers: { headers: [{ key: ":status", raw_value: enc.encode("200") }] } } });
    expect(setHeader((await other.s.next()).response_headers?.response, "x-conformance-test-served-endpoint")).toBe("fail: missing envoy lb metadata");
  });
});

describe("without the flag (the default)", () => {
  test("the selection header steers nothing (the subset hint does) and nothing is echoed", async () => {
    const { s, endpoint } = await route(offClient, B, withHint([A]));
    expect(endpoint).toBe(`${A}:8000`);
    s.send({
      response_headers: { headers: { headers: [{ key: ":status", raw_value: enc.encode("200") }] } },
      metadata_context: { filter_metadata: { "envoy.lb": { fields: { "x-gateway-destination-endpoint-served": { stringValue: `${B}:8000` } } } } },
    });
    const r = await s.next();
    expect(r.response_headers).toBeDefined();
    expect(setHeader(r.response_headers?.response, "x-conformance-test-served-endpoint")).toBeUndefined();
  });
});
