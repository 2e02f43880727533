// An InferencePool with several targetPorts (vLLM's external DP load balancing: the API server on
// targetPorts[r] serves rank r, which publishes KV events on the KV port + r), and GAIE's subset hint
// matched by pod IP. Kubernetes mode against the fake API server, ext_proc over TLS.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { startMockWorker } from "@kv-epp/mock-worker";
import { startFakeKubeApi, waitFor, type FakeKubeApi, LOOPBACK } from "@kv-epp/testkit";
import { parseConfig } from "../src/config.ts";
import type { ProcessingRequest } from "../src/extproc/messages.ts";
import { startEpp, type EppHandle } from "../src/main.ts";
import { FakeWorkerEvents, HOST, body, extProcClient, headers, postJson, quietLog, setHeader, tokens, type Resp } from "./helpers.ts";

const KV_PORT = 15570;
const POD_A = `${LOOPBACK}.4.61`;
const POD_B = `${LOOPBACK}.4.62`;
let api: FakeKubeApi;
let epp: EppHandle;
let ranks: FakeWorkerEvents[];
let client: ReturnType<typeof extProcClient>;
const prompt = tokens(64, 17); // 4 blocks, held by pod A's rank 1 only

function pod(name: string, ip: string, app = "vllm") {
  return {
    apiVersion: "v1",
    kind: "Pod",
    metadata: { name, namespace: "llm", labels: { app } },
    status: { phase: "Running", podIP: ip, conditions: [{ type: "Ready", status: "True" }] },
  } as never;
}

/** An InferencePool of pods labelled app=<app> on target ports 8000 and 8001. */
function twoPortPool(name: string, app: string) {
  return {
    apiVersion: "inference.networking.k8s.io/v1",
    kind: "InferencePool",
    metadata: { name, namespace: "llm" },
    spec: { selector: { matchLabels: { app } }, targetPorts: [{ number: 8000 }, { number: 8001 }], endpointPickerRef: { name: "dynamo-epp", port: { number: 9002 } } },
  } as never;
}

beforeAll(async () => {
  api = await startFakeKubeApi({ host: HOST, port: 0 });
  api.upsert(twoPortPool("pool", "vllm"));
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

test("a hint is a list or one comma-separated string (GAIE's lightweight EPP); other values are as if absent; an empty list is a 503; non-string items are skipped", async () => {
  expect((await route({ onHeaders: { stringValue: `${POD_B}:8000` } })).endpoint).toStartWith(`${POD_B}:`);
  expect((await route({ onHeaders: { stringValue: ` ${POD_B}:8001 , 10.9.9.9:8000` } })).endpoint).toStartWith(`${POD_B}:`);
  expect((await route({ onHeaders: { numberValue: 1 } as unknown as Hint })).endpoint).toBe(`${POD_A}:8001`);
  expect((await route({ onHeaders: list(`${POD_B}:8000,10.9.9.9:8000`) })).endpoint).toStartWith(`${POD_B}:`);
  expect((await route({ onHeaders: { stringValue: " , " } })).status).toBe("ServiceUnavailable");
  expect((await route({ onHeaders: list() })).status).toBe("ServiceUnavailable");
  expect((await route({ onHeaders: { listValue: { values: [{ numberValue: 1 }, { stringValue: `${POD_B}:8000` }] } } })).endpoint).toStartWith(`${POD_B}:`);
});

test("a hint carried by the body message (not the headers) is the one applied", async () => {
  expect((await route({ onBody: list(`${POD_B}:8000`) })).endpoint).toStartWith(`${POD_B}:`);
  expect((await route({ onHeaders: list(`${POD_B}:8000`), onBody: list(`${POD_A}:8001`) })).endpoint).toBe(`${POD_A}:8001`);
});

test("each target port is scraped as its own endpoint: a queue on one rank's API server steers requests to the other rank's port", async () => {
  const ip = `${LOOPBACK}.4.63`;
  const worker = await startMockWorker({
    listen: ip, port: 8000, rankPorts: true, dpSize: 2, kvEvents: `tcp://${ip}:${KV_PORT + 10}`, blockSize: 16, maxNumSeqs: 1, stepBaseMs: 50, logLevel: "silent",
  });
  const kube = await startFakeKubeApi({ host: HOST, port: 0 });
  kube.upsert(twoPortPool("ports", "queued"));
  kube.upsert(pod("queued-0", ip, "queued"));
  const cfg = parseConfig(
    ["--pool-name", "ports", "--model", "test-model", "--block-size", "16", "--listen", HOST, "--kv-events-port", String(KV_PORT + 10), "--queue-threshold", "1",
      "--grpc-port", "0", "--grpc-health-port", "0", "--metrics-port", "0", "--replica-agg-port", "0", "--subscribe-wait-ms", "1000", "--selection-port", "0", "--scrape-interval-ms", "50"],
    { POD_NAMESPACE: "llm" },
  );
  const e = await startEpp(cfg, { log: quietLog, kubeConfig: kube.kubeConfig });
  const aborts: AbortController[] = [];
  try {
    await e.ready;
    const select = async () => (await postJson(`http://${HOST}:${e.ports.selection}/select`, { token_ids: tokens(32, 900 + Math.floor(Math.random() * 1e6)) })).body.endpoint as string;
    // Three long requests on one API server: one runs, two wait (vLLM's num_requests_waiting on that server's /metrics only).
    const queueOn = (port: number) => {
      for (let i = 0; i < 3; i++) {
        const a = new AbortController();
        aborts.push(a);
        void fetch(`http://${ip}:${port}/v1/completions`, { method: "POST", signal: a.signal, headers: { "content-type": "application/json" }, body: JSON.stringify({ prompt: tokens(20, port * 10 + i), max_tokens: 2000 }) }).catch(() => {});
      }
    };
    const drain = () => {
      for (const a of aborts.splice(0)) a.abort();
    };
    for (const [busy, free] of [[8001, 8000], [8000, 8001]] as const) {
      queueOn(busy);
      // Once the busy server's queue is scraped, every pick goes to the other port (over the threshold is skipped).
      await waitFor(async () => {
        const picks = await Promise.all(Array.from({ length: 8 }, select));
        return picks.every((p) => p === `${ip}:${free}`);
      }, { message: `picks avoid the queued server on port ${busy}` });
      // Not a lucky draw: with both queues seen as equal, 24 picks in a row would not all land on one port.
      expect(new Set(await Promise.all(Array.from({ length: 24 }, select)))).toEqual(new Set([`${ip}:${free}`]));
      drain();
      await waitFor(async () => {
        const picks = new Set(await Promise.all(Array.from({ length: 16 }, select)));
        return picks.has(`${ip}:${busy}`);
      }, { message: `port ${busy} is picked again once its queue drained` });
    }
  } finally {
    for (const a of aborts) a.abort();
    await e.stop({ graceMs: 200 });
    await worker.close();
    await kube.close();
  }
});
