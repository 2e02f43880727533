// An InferencePool with several targetPorts (vLLM's external DP load balancing: the API server on
// targetPorts[r] serves rank r, which publishes KV events on the KV port + r), and GAIE's subset hint
// matched by pod IP. Kubernetes mode against the fake API server, ext_proc over TLS.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { startFakeKubeApi, waitFor, type FakeKubeApi } from "@kv-epp/testkit";
import { parseConfig } from "../src/config.ts";
import type { ProcessingRequest } from "../src/extproc/messages.ts";
import { startEpp, type EppHandle } from "../src/main.ts";
import { FakeWorkerEvents, HOST, body, extProcClient, headers, postJson, quietLog, setHeader, tokens, type Resp } from "./helpers.ts";

const KV_PORT = 15570;
const POD_A = "127.0.4.61";
const POD_B = "127.0.4.62";
let api: FakeKubeApi;
let epp: EppHandle;
let ranks: FakeWorkerEvents[];
let client: ReturnType<typeof extProcClient>;
const prompt = tokens(64, 17); // 4 blocks, held by pod A's rank 1 only

function pod(name: string, ip: string) {
  return {
    apiVersion: "v1",
    kind: "Pod",
    metadata: { name, namespace: "llm", labels: { app: "vllm" } },
    status: { phase: "Running", podIP: ip, conditions: [{ type: "Ready", status: "True" }] },
  } as never;
}

beforeAll(async () => {
  api = await startFakeKubeApi({ host: HOST, port: 0 });
  api.upsert({
    apiVersion: "inference.networking.k8s.io/v1",
    kind: "InferencePool",
    metadata: { name: "pool", namespace: "llm" },
    spec: { selector: { matchLabels: { app: "vllm" } }, targetPorts: [{ number: 8000 }, { number: 8001 }], endpointPickerRef: { name: "dynamo-epp", port: { number: 9002 } } },
  } as never);
  ranks = [await FakeWorkerEvents.start(POD_A, KV_PORT, 0), await FakeWorkerEvents.start(POD_A, KV_PORT + 1, 1)];
  const cfg = parseConfig(
    ["--pool-name", "pool", "--model", "test-model", "--block-size", "16", "--listen", HOST, "--kv-events-port", String(KV_PORT),
      "--grpc-port", "0", "--grpc-health-port", "0", "--metrics-port", "0", "--replica-agg-port", "0", "--subscribe-wait-ms", "1000", "--selection-port", "0", "--scrape-interval-ms", "0"],
    { POD_NAMESPACE: "llm" },
  );
  epp = await startEpp(cfg, { log: quietLog, kubeConfig: api.kubeConfig });
  await epp.ready;
  api.upsert(pod("vllm-a", POD_A));
  api.upsert(pod("vllm-b", POD_B));
  await waitFor(() => ranks.every((r) => r.pub.subscriberCount === 1), { message: "a listener on the KV port + rank for each rank" });
  const score = async () => (await postJson(`http://${HOST}:${epp.ports.selection}/score`, { token_ids: prompt })).body.scores;
  await ranks[1]!.storeUntil(prompt, async () => (await score())["vllm-a"]?.["1"] === 4);
  client = extProcClient(epp.ports.grpc);
});
afterAll(async () => {
  client?.close();
  await epp?.stop({ graceMs: 200 });
  await Promise.all(ranks.map((r) => r.close()));
  await api?.close();
});

type Hint = { listValue: { values: { stringValue?: string; numberValue?: number }[] } } | { stringValue: string };
const withHint = (hint: Hint): Partial<ProcessingRequest> => ({
  metadata_context: { filter_metadata: { "envoy.lb.subset_hint": { fields: { "x-gateway-destination-endpoint-subset": hint as never } } } },
});
const list = (...eps: string[]): Hint => ({ listValue: { values: eps.map((stringValue) => ({ stringValue })) } });

/** Routes the prompt (full duplex over TLS): the destination, the rank header, or the immediate status. */
async function route(o: { onHeaders?: Hint; onBody?: Hint } = {}): Promise<{ endpoint?: string; rank?: string; status?: string | number }> {
  const s = client.open();
  s.send(headers("/v1/completions", false, o.onHeaders ? withHint(o.onHeaders) : {}));
  s.send({ ...body({ model: "test-model", prompt }), ...(o.onBody ? withHint(o.onBody) : {}) });
  const r: Resp = await s.next();
  s.end();
  if (r.immediate_response) return { status: r.immediate_response.status?.code };
  const common = r.request_headers?.response;
  return { endpoint: setHeader(common, "x-gateway-destination-endpoint"), rank: setHeader(common, "x-data-parallel-rank") };
}

test("every target port is an endpoint: each rank is listed at its own port, with its KV port at base + rank", async () => {
  const rows = (await (await fetch(`http://${HOST}:${epp.ports.selection}/workers`)).json()) as { worker_id: string; dp_rank: number; address: string; kv_events: string; connected: boolean }[];
  const a = rows.filter((w) => w.worker_id === "vllm-a").map((w) => [w.dp_rank, w.address, w.kv_events, w.connected]);
  expect(a).toEqual([
    [0, `${POD_A}:8000`, `tcp://${POD_A}:${KV_PORT}`, true],
    [1, `${POD_A}:8001`, `tcp://${POD_A}:${KV_PORT + 1}`, true],
  ]);
  expect(rows.filter((w) => w.worker_id === "vllm-b").map((w) => w.address)).toEqual([`${POD_B}:8000`, `${POD_B}:8001`]);
});

test("a prefix held by rank 1 routes to that rank's own port, with no rank header (its server serves it alone)", async () => {
  expect(await route()).toEqual({ endpoint: `${POD_A}:8001`, rank: undefined });
});

test("the subset hint matches by pod IP: naming a pod under any port makes all its endpoints eligible", async () => {
  expect((await route({ onHeaders: list(`${POD_A}:8000`) })).endpoint).toBe(`${POD_A}:8001`);
  expect((await route({ onHeaders: list(`${POD_B}:8001`) })).endpoint).toStartWith(`${POD_B}:`);
});

test("a hint that is not a list is as if absent; an empty list is a 503; non-string items are skipped", async () => {
  expect((await route({ onHeaders: { stringValue: `${POD_B}:8000` } })).endpoint).toBe(`${POD_A}:8001`);
  expect((await route({ onHeaders: list() })).status).toBe("ServiceUnavailable");
  expect((await route({ onHeaders: { listValue: { values: [{ numberValue: 1 }, { stringValue: `${POD_B}:8000` }] } } })).endpoint).toStartWith(`${POD_B}:`);
});

test("a hint carried by the body message (not the headers) is the one applied", async () => {
  expect((await route({ onBody: list(`${POD_B}:8000`) })).endpoint).toStartWith(`${POD_B}:`);
  expect((await route({ onHeaders: list(`${POD_B}:8000`), onBody: list(`${POD_A}:8001`) })).endpoint).toBe(`${POD_A}:8001`);
});
