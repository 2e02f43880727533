// x-data-parallel-rank in each of vLLM's DP load-balancing modes, through real ext_proc over gRPC.
// The header indexes the engines of the API server the request goes to (core_client.py:
// core_engines[data_parallel_rank]): under internal LB the head server holds every rank and numbers
// them globally; under hybrid LB each node's server numbers its own ranks from 0; under external LB a
// server has one engine and takes no other rank. Then end to end with a mock worker run as a hybrid
// node, which refuses a global rank as vLLM does.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { startMockWorker, type MockWorker } from "@kv-epp/mock-worker";
import { startFakeKubeApi, waitFor, LOOPBACK } from "@kv-epp/testkit";
import { parseConfig } from "../src/config.ts";
import { startEpp, type EppHandle } from "../src/main.ts";
import { DP_LB_ANNOTATION, DP_START_RANK_ANNOTATION } from "../src/workers/kubernetes.ts";
import { BLOCK, FakeWorkerEvents, HOST, body, extProcClient, headers, postJson, quietLog, setHeader, startTestEpp, tokens } from "./helpers.ts";

const HEAD = `${LOOPBACK}.4.161`; // internal LB: the head node's API server, in front of global ranks 2 and 3
const NODE = `${LOOPBACK}.4.162`; // hybrid LB: the second node's own API server, ranks 2 and 3
const SOLO = `${LOOPBACK}.4.163`; // external LB: the API server of rank 2 alone
const MOCK = `${LOOPBACK}.4.164`;
const KV = 5557;

let epp: EppHandle;
let client: ReturnType<typeof extProcClient>;
const publishers: FakeWorkerEvents[] = [];
const cleanups: (() => Promise<unknown>)[] = [];

beforeAll(async () => {
  for (const [ip, rank] of [[HEAD, 2], [HEAD, 3], [NODE, 2], [NODE, 3], [SOLO, 2]] as const) publishers.push(await FakeWorkerEvents.start(ip, KV + rank, rank));
  epp = await startTestEpp([
    { id: "head", address: `${HEAD}:8000`, kvEvents: `tcp://${HEAD}:${KV}`, dpSize: 2, dpStartRank: 2 },
    { id: "node", address: `${NODE}:8000`, kvEvents: `tcp://${NODE}:${KV}`, dpSize: 2, dpStartRank: 2, dpLb: "hybrid" },
    { id: "solo", address: `${SOLO}:8000`, kvEvents: `tcp://${SOLO}:${KV}`, dpSize: 1, dpStartRank: 2, dpLb: "external" },
  ]);
  client = extProcClient(epp.ports.grpc);
});
afterAll(async () => {
  client?.close();
  for (const f of cleanups.reverse()) await f().catch(() => {});
  await epp?.stop({ graceMs: 100 });
  await Promise.all(publishers.map((p) => p.close()));
});

const score = async (e: EppHandle, p: number[]) => (await postJson(`http://${HOST}:${e.ports.selection}/score`, { token_ids: p })).body.scores;

/** Routes a completions body over ext_proc (full duplex): the destination and the rank header it sets. */
async function route(c: ReturnType<typeof extProcClient>, prompt: number[]): Promise<{ endpoint?: string; rank?: string }> {
  const s = c.open();
  s.send(headers());
  s.send(body({ model: "test-model", prompt }));
  const r = await s.next();
  s.end();
  const common = r.request_headers?.response;
  return { endpoint: setHeader(common, "x-gateway-destination-endpoint"), rank: setHeader(common, "x-data-parallel-rank") };
}

/** Stores `prompt` on one publisher's rank until the EPP holds it there, then routes it. */
async function routeHeldBy(worker: string, pub: FakeWorkerEvents, seed: number) {
  const prompt = tokens(BLOCK * 4, seed);
  await pub.storeUntil(prompt, async () => (await score(epp, prompt))[worker]?.[String(pub.dpRank)] === 4);
  return route(client, prompt);
}

test("internal LB: the head server numbers ranks globally, so global rank 3 is header 3", async () => {
  expect(await routeHeldBy("head", publishers[1]!, 8101)).toEqual({ endpoint: `${HEAD}:8000`, rank: "3" });
  expect(await routeHeldBy("head", publishers[0]!, 8102)).toEqual({ endpoint: `${HEAD}:8000`, rank: "2" });
});

test("hybrid LB: a node's server numbers its own ranks from 0, so global rank 3 at start rank 2 is header 1", async () => {
  expect(await routeHeldBy("node", publishers[3]!, 8201)).toEqual({ endpoint: `${NODE}:8000`, rank: "1" });
  expect(await routeHeldBy("node", publishers[2]!, 8202)).toEqual({ endpoint: `${NODE}:8000`, rank: "0" });
});

test("external LB: a server of one engine gets no rank header, whatever its global rank", async () => {
  expect(await routeHeldBy("solo", publishers[4]!, 8301)).toEqual({ endpoint: `${SOLO}:8000`, rank: undefined });
});

test("end to end with a hybrid-LB mock node: the header the EPP sets reaches the engine it scored, where the global rank is refused", async () => {
  let w: MockWorker | undefined;
  w = await startMockWorker({
    listen: MOCK, port: 0, kvEvents: `tcp://${MOCK}:${KV}`, speed: 0, blockSize: BLOCK, logLevel: "silent",
    dpSize: 2, dataParallelStartRank: 2, dataParallelHybridLb: true,
  });
  cleanups.push(() => w!.close());
  const address = new URL(w.url).host;
  const e = await startTestEpp([{ id: "wide-ep-1", address, kvEvents: `tcp://${MOCK}:${KV}`, dpSize: 2, dpStartRank: 2, dpLb: "hybrid" }]);
  cleanups.push(() => e.stop({ graceMs: 100 }));
  const c = extProcClient(e.ports.grpc);
  cleanups.push(async () => c.close());
  const send = (prompt: number[], rank?: string) =>
    fetch(`${w!.url}/v1/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", ...(rank === undefined ? {} : { "x-data-parallel-rank": rank }) },
      body: JSON.stringify({ model: "test-model", prompt, max_tokens: 1 }),
    });
  // The node's second engine (global rank 3, its own rank 1) computes a prompt; its KV events say rank 3.
  let prompt: number[] = [];
  await waitFor(async () => {
    prompt = tokens(BLOCK * 4, 8400 + Math.floor(Math.random() * 1e6));
    expect((await send(prompt, "1")).status).toBe(200);
    await Bun.sleep(20);
    return (await score(e, prompt))["wide-ep-1"]?.["3"] === 4;
  }, { message: "the prompt indexed under global rank 3" });
  const routed = await route(c, prompt);
  expect(routed).toEqual({ endpoint: address, rank: "1" });
  // Forwarded as the gateway would: the engine the EPP scored answers from its cache (all blocks but
  // the last, which vLLM recomputes to produce the first token).
  const res = await send(prompt, routed.rank);
  expect(res.status).toBe(200);
  expect(((await res.json()) as { usage: { prompt_tokens_details: { cached_tokens: number } | null } }).usage.prompt_tokens_details?.cached_tokens).toBe(BLOCK * 3);
  expect(w.ranks[0]!.cache.usedBlocks).toBe(0);
  // The global rank, which this server does not number, is refused as vLLM's input processor refuses it.
  expect((await send(prompt, "3")).status).toBe(400);
});

test("Kubernetes: a pod's annotations say its start rank and LB mode; a later start rank without a mode is a hybrid node", async () => {
  const [WIDE, HEADED] = [`${LOOPBACK}.4.169`, `${LOOPBACK}.4.170`];
  const api = await startFakeKubeApi({ host: HOST, port: 0 });
  cleanups.push(() => api.close());
  api.upsert({
    apiVersion: "inference.networking.k8s.io/v1", kind: "InferencePool", metadata: { name: "pool", namespace: "llm" },
    spec: { selector: { matchLabels: { app: "vllm" } }, targetPorts: [{ number: 8000 }], endpointPickerRef: { name: "dynamo-epp", port: { number: 9002 } } },
  } as never);
  const pubs = [await FakeWorkerEvents.start(WIDE, KV + 3, 3), await FakeWorkerEvents.start(HEADED, KV + 3, 3)];
  cleanups.push(() => Promise.all(pubs.map((p) => p.close())));
  const cfg = parseConfig(
    ["--pool-name", "pool", "--model", "test-model", "--block-size", String(BLOCK), "--listen", HOST, "--kv-events-port", String(KV), "--dp-size", "2",
      "--grpc-port", "0", "--grpc-health-port", "0", "--metrics-port", "0", "--replica-agg-port", "0", "--subscribe-wait-ms", "1000", "--selection-port", "0", "--scrape-interval-ms", "0"],
    { POD_NAMESPACE: "llm" },
  );
  const e = await startEpp(cfg, { log: quietLog, kubeConfig: api.kubeConfig });
  cleanups.push(() => e.stop({ graceMs: 100 }));
  await e.ready;
  const pod = (name: string, ip: string, annotations: Record<string, string>) => ({
    apiVersion: "v1", kind: "Pod", metadata: { name, namespace: "llm", labels: { app: "vllm" }, annotations },
    status: { phase: "Running", podIP: ip, conditions: [{ type: "Ready", status: "True" }] },
  }) as never;
  api.upsert(pod("wide-ep-1", WIDE, { [DP_START_RANK_ANNOTATION]: "2" }));
  api.upsert(pod("headed", HEADED, { [DP_START_RANK_ANNOTATION]: "2", [DP_LB_ANNOTATION]: "internal" }));
  const c = extProcClient(e.ports.grpc);
  cleanups.push(async () => c.close());
  for (const [name, pub, ip, header] of [["wide-ep-1", pubs[0]!, WIDE, "1"], ["headed", pubs[1]!, HEADED, "3"]] as const) {
    const prompt = tokens(BLOCK * 4, name.length * 1000 + 8500);
    await pub.storeUntil(prompt, async () => (await score(e, prompt))[name]?.["3"] === 4);
    expect(await route(c, prompt)).toEqual({ endpoint: `${ip}:8000`, rank: header });
  }
});
