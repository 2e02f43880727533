// Prefill/decode disaggregation end to end: two EPP replicas (replica-agg on, each the other's static
// peer) over a static pool of two prefill and two decode workers, whose KV events come from publishers
// in the test and whose /metrics are tiny HTTP servers (so a worker can die). The test plays the
// gateway over real ext_proc streams: the answer's destination is a decode worker and, when the decider
// disaggregates, `x-prefiller-host-port` names the prefill worker.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { LOOPBACK, waitFor } from "@kv-epp/testkit";
import type { EppHandle } from "../src/main.ts";
import { body, extProcClient, FakeWorkerEvents, headers, postJson, setHeader, startTestEpp, tokens, type Resp } from "./helpers.ts";

// Fixed peer ports on addresses of their own, so each replica can name the other before it starts.
const A_HOST = `${LOOPBACK}.35.2`;
const B_HOST = `${LOOPBACK}.35.3`;
const WORKERS = [
  { id: "prefill-1", ip: `${LOOPBACK}.35.11`, role: "prefill" },
  { id: "prefill-2", ip: `${LOOPBACK}.35.12`, role: "prefill" },
  { id: "decode-1", ip: `${LOOPBACK}.35.13`, role: "decode" },
  { id: "decode-2", ip: `${LOOPBACK}.35.14`, role: "decode" },
] as const;
type WorkerId = (typeof WORKERS)[number]["id"];
const addressOf = (id: WorkerId) => `${WORKERS.find((w) => w.id === id)!.ip}:8000`;
const THRESHOLD = 64; // tokens: 4 blocks

const events = new Map<WorkerId, FakeWorkerEvents>();
const metricsServers = new Map<WorkerId, ReturnType<typeof Bun.serve>>();
let a: EppHandle;
let b: EppHandle;
const clients: ReturnType<typeof extProcClient>[] = [];

function replica(host: string, peer: string) {
  return startTestEpp(
    WORKERS.map((w) => ({ id: w.id, address: `${w.ip}:8000`, kvEvents: events.get(w.id)!.endpoint, role: w.role, metrics: `http://${w.ip}:8000/metrics` })),
    {
      host,
      peers: [`http://${peer}:9093`],
      flags: [
        "--selection-port", "9093", "--replica-agg-port", "9092", "--replica-agg-heartbeat-ms", "200", "--replica-agg-timeout-ms", "1000",
        "--pd-threshold-tokens", String(THRESHOLD),
        // No home share: which decode worker is picked then depends on overlap and load alone, the same on both replicas.
        "--latency-away-weight", "0",
        "--scrape-interval-ms", "100",
      ],
    },
  );
}

const blocksOf = async (host: string, id: WorkerId, ids: number[]) =>
  ((await postJson(`http://${host}:9093/score`, { token_ids: ids })).body as { scores: Record<string, Record<string, number>> }).scores[id]?.["0"] ?? 0;

/** `id` publishes the first `n` blocks of `ids` until replica `host` has indexed them. */
const store = (id: WorkerId, ids: number[], n: number, host = A_HOST) =>
  events.get(id)!.storeUntil(ids.slice(0, n * 16), async () => (await blocksOf(host, id, ids)) >= n);

beforeAll(async () => {
  for (const w of WORKERS) {
    events.set(w.id, await FakeWorkerEvents.start());
    metricsServers.set(w.id, Bun.serve({ hostname: w.ip, port: 8000, fetch: () => new Response("# no figures\n") }));
  }
  a = await replica(A_HOST, B_HOST);
  clients.push(extProcClient(a.ports.grpc, A_HOST));
  await waitFor(() => [...events.values()].every((e) => e.pub.subscriberCount === 1), { message: "A subscribed to every worker" });
}, 60_000);

afterAll(async () => {
  for (const c of clients) c.close();
  for (const e of [a, b]) await e?.stop({ graceMs: 500 });
  for (const s of metricsServers.values()) s.stop(true);
  for (const e of events.values()) await e.close();
});

type Routed = { destination?: string; prefiller?: string; prefillRank?: string; decision?: string; removed: string[]; stream: ReturnType<ReturnType<typeof extProcClient>["open"]> };

/** One request through a replica's ext_proc (full duplex); its stream stays open, so its load stays held. */
async function route(client: ReturnType<typeof extProcClient>, prompt: number[], extraHeaders: [string, string][] = [], path?: string): Promise<Routed> {
  const s = client.open();
  const h = headers(path);
  for (const [key, v] of [["x-kv-epp-explain", "1"], ...extraHeaders]) h.request_headers!.headers!.headers!.push({ key: key!, raw_value: new TextEncoder().encode(v) });
  s.send(h);
  s.send(body({ model: "test-model", prompt, max_tokens: 4, stream: true }));
  const answer = (await s.next(10_000)).request_headers?.response;
  await s.next(10_000); // the body handed back
  const removed = (answer as { header_mutation?: { remove_headers?: string[] } } | undefined)?.header_mutation?.remove_headers ?? [];
  return {
    destination: setHeader(answer, "x-gateway-destination-endpoint"),
    prefiller: setHeader(answer, "x-prefiller-host-port"),
    prefillRank: setHeader(answer, "x-kv-epp-prefill-data-parallel-rank"),
    decision: setHeader(answer, "x-kv-epp-decision"),
    removed,
    stream: s,
  };
}

const enc = new TextEncoder();
/** The decode worker's answer as the gateway passes it to ext_proc: headers, then (after the remote prefill) the first bytes, then the end. */
async function respond(r: Routed, part: "headers" | "first_byte" | "end"): Promise<Resp | undefined> {
  if (part === "headers") r.stream.send({ response_headers: { headers: { headers: [{ key: ":status", raw_value: enc.encode("200") }, { key: "content-type", raw_value: enc.encode("text/event-stream") }] } } });
  else r.stream.send({ response_body: { body: enc.encode(part === "end" ? "data: [DONE]\n\n" : 'data: {"choices":[{"text":"x"}]}\n\n'), end_of_stream: part === "end" } });
  return r.stream.next(10_000);
}

type WorkerRow = { worker_id: string; role: string | null; active_requests: number; sibling_requests: number; active_prefill_blocks: number; sibling_prefill_blocks: number; routable: boolean };
const workersOf = async (host: string) => (await (await fetch(`http://${host}:9093/workers`)).json()) as WorkerRow[];
const row = async (host: string, id: WorkerId) => (await workersOf(host)).find((w) => w.worker_id === id)!;

/**
 * Cancels the request's stream and waits until neither replica counts it: a request still in flight
 * would lend its blocks to the next one of the same prompt as pending on its decode worker.
 */
async function end(r: Routed): Promise<void> {
  r.stream.call.cancel();
  await waitFor(async () => {
    for (const host of [A_HOST, B_HOST]) {
      const rows = await fetch(`http://${host}:9093/workers`).then((res) => (res.ok ? (res.json() as Promise<WorkerRow[]>) : []), () => []);
      if (rows.some((w) => w.active_requests + w.sibling_requests > 0)) return false;
    }
    return true;
  }, { message: "the request left both replicas" });
}

// 40 blocks (640 tokens) each, distinct per seed.
const long = (seed: number) => tokens(640, seed);

describe("the pair through ext_proc", () => {
  test("GET /workers shows each worker's role", async () => {
    const rows = await workersOf(A_HOST);
    expect(Object.fromEntries(rows.map((r) => [r.worker_id, r.role]))).toEqual({ "prefill-1": "prefill", "prefill-2": "prefill", "decode-1": "decode", "decode-2": "decode" });
  });

  test("a long prompt goes to a decode worker, with the prefill worker holding its prefix named in x-prefiller-host-port", async () => {
    const prompt = long(1);
    await store("prefill-2", prompt, 32);
    const r = await route(clients[0]!, prompt);
    expect([addressOf("decode-1"), addressOf("decode-2")]).toContain(r.destination!);
    expect(r.prefiller).toBe(addressOf("prefill-2"));
    // one rank behind each server: no prefill rank header, and none a client sent gets through
    expect(r.prefillRank).toBeUndefined();
    expect(r.removed).toEqual(["x-data-parallel-rank", "x-override-routed-dp-rank", "x-override-disagg-prefill-dp-rank", "x-kv-epp-prefill-data-parallel-rank"]);
    expect(r.decision).toMatch(/^chosen: worker=decode-\d .*; pd: disaggregated reason=uncached_over_threshold uncached_tokens=640 threshold_tokens=64; prefill: worker=prefill-2 dp_rank=0 overlap=32\/40 /);
    await end(r);
  });

  test("a short prompt, or one the decode worker mostly holds, is not disaggregated, and a client's own x-prefiller-host-port is removed", async () => {
    const short = await route(clients[0]!, tokens(48, 2), [["x-prefiller-host-port", "169.254.169.254:80"]]);
    expect(short.prefiller).toBeUndefined();
    expect(short.removed).toEqual(["x-data-parallel-rank", "x-override-routed-dp-rank", "x-override-disagg-prefill-dp-rank", "x-prefiller-host-port", "x-kv-epp-prefill-data-parallel-rank"]);
    expect(short.decision).toMatch(/; pd: local reason=below_threshold uncached_tokens=48 threshold_tokens=64$/);
    await end(short);

    const prompt = long(3);
    await store("decode-1", prompt, 38);
    const cached = await route(clients[0]!, prompt);
    expect(cached.destination).toBe(addressOf("decode-1"));
    expect(cached.prefiller).toBeUndefined();
    expect(cached.decision).toMatch(/; pd: local reason=below_threshold uncached_tokens=32 /);
    await end(cached);
  });

  test("a path the sidecar passes through whole names no prefill worker and books no prefill load there", async () => {
    const prompt = long(5);
    await store("prefill-2", prompt, 32);
    // vLLM's render endpoint: the decode worker's sidecar sends it on whole, so a remote prefill would never run.
    const r = await route(clients[0]!, prompt, [["x-prefiller-host-port", addressOf("prefill-2")]], "/v1/completions/render");
    expect([addressOf("decode-1"), addressOf("decode-2")]).toContain(r.destination!);
    expect(r.prefiller).toBeUndefined();
    expect(r.removed).toContain("x-prefiller-host-port");
    expect(r.decision).toMatch(/; pd: local reason=path_not_split uncached_tokens=640 threshold_tokens=64$/);
    const decode = WORKERS.find((w) => r.destination === `${w.ip}:8000`)!.id;
    expect(await row(A_HOST, decode)).toMatchObject({ active_requests: 1, active_prefill_blocks: 40 });
    for (const id of ["prefill-1", "prefill-2"] as const) expect(await row(A_HOST, id)).toMatchObject({ active_requests: 0, active_prefill_blocks: 0 });
    await end(r);
  });

  test("a split path under a gateway prefix and with a query is disaggregated: ext_proc sees the path before the route's rewrite", async () => {
    const prompt = long(6);
    await store("prefill-1", prompt, 32);
    const r = await route(clients[0]!, prompt, [], "/llm/v1/completions?tenant=a");
    expect([addressOf("decode-1"), addressOf("decode-2")]).toContain(r.destination!);
    expect(r.prefiller).toBe(addressOf("prefill-1"));
    expect(r.decision).toMatch(/; pd: disaggregated reason=uncached_over_threshold uncached_tokens=640 threshold_tokens=64; prefill: worker=prefill-1 /);
    await end(r);
  });
});

describe("recovery and load across replicas", () => {
  test("a replica that recovers from its peer (roles from its own worker discovery) picks the same pairs", async () => {
    // Held before B starts: B learns them only from A's dump.
    const prompts = [long(11), long(12), long(13)];
    await store("prefill-1", prompts[0]!, 30);
    await store("decode-2", prompts[0]!, 6);
    await store("prefill-2", prompts[1]!, 20);
    await store("decode-1", prompts[1]!, 10);
    await store("prefill-1", prompts[2]!, 12);
    await store("decode-1", prompts[2]!, 38); // mostly cached on the decode worker: local
    b = await replica(B_HOST, A_HOST);
    expect((await b.ready).kind).toBe("recovered");
    clients.push(extProcClient(b.ports.grpc, B_HOST));
    expect((await workersOf(B_HOST)).map((r) => r.role)).toEqual(["prefill", "prefill", "decode", "decode"]);
    for (const p of prompts) {
      const onA = await route(clients[0]!, p);
      await end(onA);
      const onB = await route(clients[1]!, p);
      await end(onB);
      expect({ destination: onB.destination, prefiller: onB.prefiller }).toEqual({ destination: onA.destination, prefiller: onA.prefiller });
    }
    const pairs = [];
    for (const p of prompts) {
      const r = await route(clients[1]!, p);
      await end(r);
      pairs.push([r.destination, r.prefiller]);
    }
    expect(pairs).toEqual([
      [addressOf("decode-2"), addressOf("prefill-1")],
      [addressOf("decode-1"), addressOf("prefill-2")],
      [addressOf("decode-1"), undefined],
    ]);
  }, 60_000);

  test("prefill load is released at the first response byte and decode load at the end, on both replicas", async () => {
    await waitFor(async () => (await row(A_HOST, "prefill-1")).active_requests + (await row(A_HOST, "decode-1")).active_requests === 0, { message: "earlier requests ended" });
    await waitFor(async () => (await fetch(`http://${B_HOST}:9093/workers`)).ok && (await row(B_HOST, "prefill-1")).sibling_requests === 0, { message: "B follows A" });
    const prompt = long(21);
    await store("prefill-2", prompt, 16);
    const r = await route(clients[0]!, prompt);
    expect(r.prefiller).toBe(addressOf("prefill-2"));
    const decode = WORKERS.find((w) => r.destination === `${w.ip}:8000`)!.id;
    const held = async (id: WorkerId) => {
      const [own, peer] = [await row(A_HOST, id), await row(B_HOST, id)];
      return { a: own.active_requests, b: peer.sibling_requests, aPrefill: own.active_prefill_blocks, bPrefill: peer.sibling_prefill_blocks };
    };
    await waitFor(async () => (await held("prefill-2")).b === 1 && (await held(decode)).b === 1, { message: "B hears of both leases" });
    expect(await held("prefill-2")).toEqual({ a: 1, b: 1, aPrefill: 24, bPrefill: 24 });
    expect(await held(decode)).toEqual({ a: 1, b: 1, aPrefill: 0, bPrefill: 0 });
    await respond(r, "headers");
    expect((await held("prefill-2")).a).toBe(1); // headers alone: the sidecar may still be prefilling
    await respond(r, "first_byte");
    await waitFor(async () => (await held("prefill-2")).a === 0 && (await held("prefill-2")).b === 0, { message: "prefill released on both replicas" });
    expect(await held(decode)).toEqual({ a: 1, b: 1, aPrefill: 0, bPrefill: 0 });
    await respond(r, "end");
    await waitFor(async () => (await held(decode)).a === 0 && (await held(decode)).b === 0, { message: "decode released on both replicas" });
  }, 30_000);

  test("a prefill worker that dies is never named again", async () => {
    const prompt = long(31);
    await store("prefill-1", prompt, 30);
    const before = await route(clients[0]!, prompt);
    expect(before.prefiller).toBe(addressOf("prefill-1"));
    await end(before);
    // The pod is gone: its server stops answering, its KV publisher closes.
    metricsServers.get("prefill-1")!.stop(true);
    await events.get("prefill-1")!.close();
    for (const host of [A_HOST, B_HOST]) await waitFor(async () => !(await row(host, "prefill-1")).routable, { message: `${host} took prefill-1 out`, timeoutMs: 10_000 });
    for (const [i, client] of clients.entries())
      for (let n = 0; n < 6; n++) {
        const r = await route(client, n % 2 === 0 ? prompt : long(40 + 10 * i + n));
        expect(r.prefiller).toBe(addressOf("prefill-2"));
        await end(r);
      }
  }, 30_000);
});

describe("the prefill rank behind a server that fronts several", () => {
  test("x-prefiller-host-port names the server and x-kv-epp-prefill-data-parallel-rank the rank; x-data-parallel-rank stays the destination's", async () => {
    // One prefill worker with two ranks behind one API server (vLLM's internal DP load balancing: global
    // ranks in the header), rank r publishing on the KV port + r; one decode worker with two ranks likewise.
    const ip = `${LOOPBACK}.35.21`;
    const decodeIp = `${LOOPBACK}.35.22`;
    const prefillRanks = [await FakeWorkerEvents.start(ip, 25557, 0), await FakeWorkerEvents.start(ip, 25558, 1)];
    const decodeRanks = [await FakeWorkerEvents.start(decodeIp, 25557, 0), await FakeWorkerEvents.start(decodeIp, 25558, 1)];
    const epp = await startTestEpp(
      [
        { id: "prefill-dp", address: `${ip}:8000`, kvEvents: `tcp://${ip}:25557`, dpSize: 2, role: "prefill" },
        { id: "decode-dp", address: `${decodeIp}:8000`, kvEvents: `tcp://${decodeIp}:25557`, dpSize: 2, role: "decode" },
      ],
      { host: `${LOOPBACK}.35.4`, flags: ["--pd-threshold-tokens", String(THRESHOLD)] },
    );
    const client = extProcClient(epp.ports.grpc, `${LOOPBACK}.35.4`);
    try {
      await waitFor(() => [...prefillRanks, ...decodeRanks].every((e) => e.pub.subscriberCount === 1), { message: "every rank subscribed" });
      const prompt = long(51);
      const score = async () => ((await postJson(`http://${LOOPBACK}.35.4:${epp.ports.selection}/score`, { token_ids: prompt })).body as { scores: Record<string, Record<string, number>> }).scores;
      await prefillRanks[1]!.storeUntil(prompt.slice(0, 24 * 16), async () => (await score())["prefill-dp"]?.["1"] === 24);
      await decodeRanks[1]!.storeUntil(prompt.slice(0, 2 * 16), async () => (await score())["decode-dp"]?.["1"] === 2);
      const s = client.open();
      s.send(headers());
      s.send(body({ model: "test-model", prompt, max_tokens: 4 }));
      const answer = (await s.next(10_000)).request_headers?.response;
      expect(setHeader(answer, "x-gateway-destination-endpoint")).toBe(`${decodeIp}:8000`);
      expect(setHeader(answer, "x-data-parallel-rank")).toBe("1");
      expect(setHeader(answer, "x-prefiller-host-port")).toBe(`${ip}:8000`);
      expect(setHeader(answer, "x-kv-epp-prefill-data-parallel-rank")).toBe("1");
      s.call.cancel();
    } finally {
      client.close();
      await epp.stop({ graceMs: 500 });
      for (const e of [...prefillRanks, ...decodeRanks]) await e.close();
    }
  }, 30_000);
});

