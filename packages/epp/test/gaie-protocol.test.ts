// GAIE's endpoint picker protocol beyond the route (docs/proposals/004-endpoint-picker-protocol) and
// its request headers, over TLS: the served endpoint reported on the response path moves the load,
// --fallback-endpoints names next-best distinct endpoints, x-gateway-model-name-rewrite picks the
// identity scored, x-gateway-inference-objective sheds sheddable requests first, and
// x-gateway-inference-fairness-id is counted per id (bounded).
import { afterAll, beforeAll, expect, test } from "bun:test";
import { waitFor, LOOPBACK } from "@kv-epp/testkit";
import type { ProcessingRequest } from "../src/extproc/messages.ts";
import type { EppHandle } from "../src/main.ts";
import { workerKeyOf } from "@kv-epp/protocol";
import { FakeWorkerEvents, HOST, MODEL, body, extProcClient, headers, immediateHeader, lbMetadata, postJson, scrapeMetric, setHeader, startTestEpp, tokens, type ExtProcStream, type Resp } from "./helpers.ts";

const A = `${LOOPBACK}.4.81:8000`;
const B = `${LOOPBACK}.4.82:8000`;
const C = `${LOOPBACK}.4.83:8000`;
const enc = new TextEncoder();
let evs: FakeWorkerEvents[];
let epp: EppHandle;
let client: ReturnType<typeof extProcClient>;
const prefix = tokens(64, 31); // 4 blocks, held by A (base model identity)
const metric = async (series: string) => (await scrapeMetric(`http://${HOST}:${epp.ports.metrics}`, series)) ?? 0;

beforeAll(async () => {
  evs = await Promise.all([0, 1, 2].map(() => FakeWorkerEvents.start()));
  epp = await startTestEpp(
    [A, B, C].map((address, i) => ({ id: `w${i}`, address, kvEvents: evs[i]!.endpoint })),
    { flags: ["--fallback-endpoints", "2", "--max-inflight", "5", "--objective-priorities", "batch=-1,chat=5", "--lora-adapters", "my-adapter", "--emit-endpoint-scores"] },
  );
  await evs[0]!.storeUntil(prefix, async () => (await postJson(`http://${HOST}:${epp.ports.selection}/score`, { token_ids: prefix })).body.scores["w0"]?.["0"] === 4);
  client = extProcClient(epp.ports.grpc);
});
afterAll(async () => {
  client?.close();
  await epp?.stop({ graceMs: 200 });
  await Promise.all(evs.map((e) => e.close()));
});

const header = (key: string, value: string) => ({ key, raw_value: enc.encode(value) });
function requestHeaders(extra: [string, string][]): ProcessingRequest {
  const h = headers();
  h.request_headers!.headers!.headers!.push(...extra.map(([k, v]) => header(k, v)));
  return h;
}

/** A routed request held open (its load counted) until `finish`. */
async function open(json: unknown, extra: [string, string][] = []): Promise<{ s: ExtProcStream; first: Resp }> {
  const s = client.open();
  s.send(requestHeaders(extra));
  s.send(body(json));
  return { s, first: await s.next() };
}
/** The next answer for `phase`, past the request body chunks full duplex hands back first. */
async function answerFor(s: ExtProcStream, phase: string): Promise<Resp> {
  for (;;) {
    const r = await s.next();
    if (r.response === phase) return r;
  }
}
const destination = (r: Resp) => setHeader(r.request_headers?.response, "x-gateway-destination-endpoint");
/** envoy.lb x-gateway-destination-endpoint-scores as endpoint -> score (undefined when absent). */
function lbScores(r: Resp): Record<string, number> | undefined {
  const v = r.dynamic_metadata?.fields?.["envoy.lb"]?.structValue?.fields?.["x-gateway-destination-endpoint-scores"]?.structValue?.fields;
  return v && Object.fromEntries(Object.entries(v).map(([e, s]) => [e, s.numberValue!]));
}

test("--fallback-endpoints: the pick, then next-best distinct endpoints, in the header and envoy.lb alike", async () => {
  const { s, first } = await open({ prompt: prefix });
  const list = destination(first)!.split(",");
  expect(list[0]).toBe(A);
  expect(new Set(list).size).toBe(3);
  expect(list.slice(1).sort()).toEqual([B, C]);
  expect(lbMetadata(first)).toBe(destination(first));
  s.end();
  await waitFor(() => epp.load.inflight === 0, { message: "released" });
});

test("--emit-endpoint-scores: every scored endpoint's score beside the destination in envoy.lb, the pick's the highest; absent without the flag", async () => {
  const { s, first } = await open({ prompt: prefix });
  const scores = lbScores(first)!;
  expect(Object.keys(scores).sort()).toEqual([A, B, C]);
  expect(Object.values(scores).every(Number.isFinite)).toBe(true);
  expect(Math.max(...Object.values(scores))).toBe(scores[A]!);
  expect(destination(first)!.split(",")[0]).toBe(A);
  s.end();
  await waitFor(() => epp.load.inflight === 0, { message: "released" });

  const plain = await startTestEpp([{ id: "w", address: A, kvEvents: evs[0]!.endpoint }]);
  const c = extProcClient(plain.ports.grpc);
  try {
    const p = c.open();
    p.send(headers());
    p.send(body({ prompt: prefix }));
    const r = await p.next();
    expect(lbMetadata(r)).toBe(A);
    expect(lbScores(r)).toBeUndefined();
    p.end();
  } finally {
    c.close();
    await plain.stop({ graceMs: 200 });
  }
});

test("the served endpoint reported on the response path moves the request's load there, counted, and its response is compared with what was predicted for that endpoint", async () => {
  const before = await metric('dynamo_epp_served_elsewhere_total{result="moved"}');
  const { s, first } = await open({ prompt: prefix });
  expect(destination(first)!.split(",")[0]).toBe(A);
  await waitFor(() => epp.load.of(workerKeyOf("w0", 0)).blocks === 4, { message: "load on the pick" });
  s.send({
    response_headers: { headers: { headers: [header(":status", "200")] }, end_of_stream: false },
    metadata_context: { filter_metadata: { "envoy.lb": { fields: { "x-gateway-destination-endpoint-served": { stringValue: B } } } } },
  });
  await answerFor(s, "response_headers");
  expect(epp.load.of(workerKeyOf("w0", 0)).blocks).toBe(0);
  expect(epp.load.of(workerKeyOf("w1", 0)).blocks).toBe(4);
  expect(await metric('dynamo_epp_served_elsewhere_total{result="moved"}')).toBe(before + 1);
  // B, which holds none of the prompt, reports what it found: a correct prediction for B, nothing for A.
  const usage = enc.encode(JSON.stringify({ choices: [], usage: { prompt_tokens: 64, completion_tokens: 1, prompt_tokens_details: { cached_tokens: 0 } } }));
  s.send({ response_body: { body: usage, end_of_stream: true } });
  await answerFor(s, "response_body");
  await waitFor(async () => (await metric('dynamo_epp_cached_tokens_predictions_total{worker="w1",dp_rank="0"}')) === 1, { message: "the response compared with B's prediction" });
  expect(await metric('dynamo_epp_cached_tokens_predictions_total{worker="w0",dp_rank="0"}')).toBe(0);
  expect(await metric('dynamo_epp_cached_tokens_mispredictions_total{worker="w1",dp_rank="0"}')).toBe(0);
  s.end();
  await waitFor(() => epp.load.inflight === 0 && epp.load.of(workerKeyOf("w1", 0)).blocks === 0, { message: "released where it was served" });
});

test("x-gateway-model-name-rewrite names the identity scored: an adapter's blocks are not the base model's", async () => {
  const explain: [string, string] = ["x-kv-epp-explain", "1"];
  const asAdapter = await open({ model: "my-adapter", prompt: prefix }, [explain]);
  expect(setHeader(asAdapter.first.request_headers?.response, "x-kv-epp-decision")).toContain("overlap=0/4");
  asAdapter.s.end();
  const rewritten = await open({ model: "my-adapter", prompt: prefix }, [explain, ["x-gateway-model-name-rewrite", MODEL]]);
  expect(destination(rewritten.first)!.split(",")[0]).toBe(A);
  expect(setHeader(rewritten.first.request_headers?.response, "x-kv-epp-decision")).toContain("overlap=4/4");
  rewritten.s.end();
  await waitFor(() => epp.load.inflight === 0, { message: "released" });
});

test("under --max-inflight, sheddable objectives get their 429 first; the others are routed until the cap", async () => {
  const held: ExtProcStream[] = [];
  for (let i = 0; i < 4; i++) held.push((await open({ prompt: tokens(32, 100 + i) })).s); // 4 of 5 in flight
  const sheddable = await open({ prompt: tokens(32, 200) }, [["x-gateway-inference-objective", "batch"]]);
  expect(sheddable.first.immediate_response?.status?.code).toBe("TooManyRequests");
  expect(immediateHeader(sheddable.first, "x-llm-d-request-dropped-reason")).toBe("rejected-saturated");
  expect(await metric('dynamo_epp_shed_total{class="sheddable"}')).toBe(1);
  const chat = await open({ prompt: tokens(32, 201) }, [["x-gateway-inference-objective", "chat"]]);
  expect(destination(chat.first)).toBeDefined(); // the 5th slot is not sheddable traffic's
  held.push(chat.s);
  const standard = await open({ prompt: tokens(32, 202) });
  expect(standard.first.immediate_response?.status?.code).toBe("TooManyRequests"); // at the cap: every class
  expect(await metric('dynamo_epp_shed_total{class="standard"}')).toBe(1);
  for (const s of held) s.end();
  await waitFor(() => epp.load.inflight === 0, { message: "released" });
});

test("with a critical objective configured, standard requests get their 429 before critical ones: the top 10% of the cap is kept for critical traffic", async () => {
  const shedStandard = await metric('dynamo_epp_shed_total{class="standard"}');
  const held: ExtProcStream[] = [];
  for (let i = 0; i < 4; i++) held.push((await open({ prompt: tokens(32, 300 + i) })).s); // 4 of 5: 90% of the cap
  const standard = await open({ prompt: tokens(32, 310) });
  expect(standard.first.immediate_response?.status?.code).toBe("TooManyRequests");
  expect(await metric('dynamo_epp_shed_total{class="standard"}')).toBe(shedStandard + 1);
  const critical = await open({ prompt: tokens(32, 311) }, [["x-gateway-inference-objective", "chat"]]);
  expect(destination(critical.first)).toBeDefined();
  held.push(critical.s);
  const another = await open({ prompt: tokens(32, 312) }, [["x-gateway-inference-objective", "chat"]]);
  expect(another.first.immediate_response?.status?.code).toBe("TooManyRequests"); // the cap binds critical traffic too
  for (const s of held) s.end();
  await waitFor(() => epp.load.inflight === 0, { message: "released" });
});

test("x-gateway-inference-fairness-id is counted per id, default-flow when absent, at most 64 ids then other", async () => {
  const base = await metric('dynamo_epp_fairness_requests_total{fairness_id="default-flow"}');
  for (let i = 0; i < 70; i++) {
    const { s } = await open({ prompt: tokens(16, i) }, [["x-gateway-inference-fairness-id", `tenant-${i}`]]);
    s.end();
  }
  (await open({ prompt: tokens(16, 1) })).s.end();
  const text = await (await fetch(`http://${HOST}:${epp.ports.metrics}/metrics`)).text();
  const ids = [...text.matchAll(/^dynamo_epp_fairness_requests_total\{fairness_id="([^"]+)"\}/gm)].map((m) => m[1]);
  expect(ids.length).toBeLessThanOrEqual(65);
  expect(ids).toContain("tenant-0");
  expect(await metric('dynamo_epp_fairness_requests_total{fairness_id="other"}')).toBeGreaterThan(0);
  expect(await metric('dynamo_epp_fairness_requests_total{fairness_id="default-flow"}')).toBeGreaterThan(base);
  await waitFor(() => epp.load.inflight === 0, { message: "released" });
});
