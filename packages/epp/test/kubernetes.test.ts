// Kubernetes mode against the fake API server: the InferencePool's selector and target port, and a pod
// informer keeping the workers (Running + IP + Ready) as pods appear, become ready, and go away.
import { afterAll, describe, expect, test } from "bun:test";
import { startFakeKubeApi, waitFor, LOOPBACK } from "@kv-epp/testkit";
import { ruleTarget } from "@kv-epp/tokenizer";
import { parseConfig } from "../src/config.ts";
import { startEpp } from "../src/main.ts";
import { startMockWorker } from "@kv-epp/mock-worker";
import { KV_EVENTS_ENDPOINT_ANNOTATION, podKvSource, podRole, startPoolWorkers } from "../src/workers/kubernetes.ts";
import { FakeWorkerEvents, HOST, MODEL, body, extProcClient, headers, postJson, quietLog, scrapeMetric, setHeader, tokens } from "./helpers.ts";

/** No rules: every lookup misses. */
const NO_RULES = { exact: new Map() };

// Not the default 5557: a stray process bound to *:5557 on a shared machine would block the bind.
const KV_PORT = 15558;
const cleanups: (() => unknown)[] = [];
afterAll(async () => {
  for (const c of cleanups.reverse()) await c();
});

function pod(name: string, ip: string | undefined, state: "pending" | "ready" | "unready", labels = { app: "vllm" }) {
  return {
    apiVersion: "v1",
    kind: "Pod",
    metadata: { name, namespace: "llm", labels },
    status:
      state === "pending"
        ? { phase: "Pending" }
        : { phase: "Running", podIP: ip, conditions: [{ type: "Ready", status: state === "ready" ? "True" : "False" }] },
  };
}

async function fakeApi() {
  const api = await startFakeKubeApi({ host: HOST, port: 0 });
  cleanups.push(() => api.close());
  return api;
}

/** An EPP following InferencePool "pool" in llm through `api` (these flags on top), ready. */
async function poolEpp(api: Awaited<ReturnType<typeof fakeApi>>, flags: string[] = []) {
  const cfg = parseConfig(
    ["--pool-name", "pool", "--listen", HOST, "--kv-events-port", String(KV_PORT), "--grpc-port", "0", "--grpc-health-port", "0", "--metrics-port", "0", "--replica-agg-port", "0", "--subscribe-wait-ms", "200", "--selection-port", "0", "--scrape-interval-ms", "0", ...flags],
    { POD_NAMESPACE: "llm" },
  );
  const epp = await startEpp(cfg, { log: quietLog, kubeConfig: api.kubeConfig });
  cleanups.push(() => epp.stop({ graceMs: 200 }));
  await epp.ready;
  return epp;
}

function inferencePool(name: string) {
  return {
    apiVersion: "inference.networking.k8s.io/v1",
    kind: "InferencePool",
    metadata: { name, namespace: "llm" },
    spec: { selector: { matchLabels: { app: "vllm" } }, targetPorts: [{ number: 8000 }], endpointPickerRef: { name: "dynamo-epp", port: { number: 9002 } } },
  } as never;
}

test("pods selected by the InferencePool become workers when ready and leave when they go away", async () => {
  const api = await fakeApi();
  api.upsert(inferencePool("pool"));
  const ev = [await FakeWorkerEvents.start(`${LOOPBACK}.4.51`, KV_PORT), await FakeWorkerEvents.start(`${LOOPBACK}.4.52`, KV_PORT)];
  cleanups.push(() => Promise.all(ev.map((e) => e.close())));

  const cfg = parseConfig(
    ["--pool-name", "pool", "--model", "test-model", "--block-size", "16", "--listen", HOST, "--kv-events-port", String(KV_PORT),
      "--grpc-port", "0", "--grpc-health-port", "0", "--metrics-port", "0", "--replica-agg-port", "0", "--subscribe-wait-ms", "1000", "--selection-port", "0", "--scrape-interval-ms", "0"],
    { POD_NAMESPACE: "llm" },
  );
  const epp = await startEpp(cfg, { log: quietLog, kubeConfig: api.kubeConfig });
  cleanups.push(() => epp.stop({ graceMs: 500 }));
  await epp.ready;
  const workers = async () =>
    ((await (await fetch(`http://${HOST}:${epp.ports.selection}/workers`)).json()) as { worker_id: string; address: string; connected: boolean }[])
      .map((w) => `${w.worker_id}@${w.address}`)
      .sort();

  api.upsert(pod("vllm-0", undefined, "pending") as never);
  api.upsert(pod("other", `${LOOPBACK}.4.59`, "ready", { app: "not-vllm" } as never) as never);
  api.upsert(pod("vllm-1", `${LOOPBACK}.4.52`, "unready") as never);
  api.upsert(pod("vllm-0", `${LOOPBACK}.4.51`, "ready") as never);
  await waitFor(async () => (await workers()).join() === `vllm-0@${LOOPBACK}.4.51:8000`, { message: "only the ready pod is a worker" });

  api.upsert(pod("vllm-1", `${LOOPBACK}.4.52`, "ready") as never);
  await waitFor(async () => (await workers()).length === 2, { message: "vllm-1 became ready" });
  await waitFor(() => ev.every((e) => e.pub.subscriberCount === 1), { message: "listeners on tcp://<podIP>:<kv port>" });
  // llm-d's pool gauges are named by the InferencePool.
  const readyEndpoints = () => scrapeMetric(`http://${HOST}:${epp.ports.metrics}`, 'llm_d_epp_ready_endpoints{name="pool"}');
  expect(await readyEndpoints()).toBe(2);

  const prompt = tokens(64, 5);
  const score = async () => (await postJson(`http://${HOST}:${epp.ports.selection}/score`, { token_ids: prompt })).body.scores;
  await ev[1]!.storeUntil(prompt, async () => (await score())["vllm-1"]?.["0"] === 4);
  const sel = await postJson(`http://${HOST}:${epp.ports.selection}/select`, { token_ids: prompt });
  expect(sel.body.endpoint).toBe(`${LOOPBACK}.4.52:8000`);

  // Not ready any more: removed from the workers and from the index, its listener closed.
  api.upsert(pod("vllm-1", `${LOOPBACK}.4.52`, "unready") as never);
  await waitFor(async () => (await workers()).join() === `vllm-0@${LOOPBACK}.4.51:8000`, { message: "vllm-1 left" });
  expect(await score()).toEqual({});
  expect(await readyEndpoints()).toBe(1);
  await waitFor(() => ev[1]!.pub.subscriberCount === 0, { message: "vllm-1's listener closed" });

  api.remove("Pod", "llm", "vllm-0");
  await waitFor(async () => (await workers()).length === 0, { message: "deleted pod left" });
  const none = await postJson(`http://${HOST}:${epp.ports.selection}/select`, { token_ids: prompt });
  expect(none.status).toBe(503);
});

test("an InferencePool created after the EPP started is waited for; readiness follows", async () => {
  const api = await fakeApi();
  const cfg = parseConfig(
    ["--pool-name", "late", "--listen", HOST, "--grpc-port", "0", "--grpc-health-port", "0", "--metrics-port", "0", "--replica-agg-port", "0", "--subscribe-wait-ms", "1000", "--selection-port", "0", "--scrape-interval-ms", "0"],
    { POD_NAMESPACE: "llm" },
  );
  const epp = await startEpp(cfg, { log: quietLog, kubeConfig: api.kubeConfig });
  cleanups.push(() => epp.stop({ graceMs: 200 }));
  await waitFor(() => api.requests.some((r) => r.plural === "inferencepools"), { message: "pools listed" });
  await Bun.sleep(200); // a stretch with no pool: still not ready
  expect(epp.health.ready).toBe(false);
  api.upsert(inferencePool("late"));
  expect((await epp.ready).kind).toBe("recovery_disabled");
  expect(epp.health.ready).toBe(true);
});

test("a deleted InferencePool clears the workers: NOT_SERVING and 503 until it is created again", async () => {
  const api = await fakeApi();
  api.upsert(inferencePool("pool"));
  api.upsert(pod("vllm-0", `${LOOPBACK}.4.56`, "ready") as never);
  const epp = await poolEpp(api);
  const select = async () => (await postJson(`http://${HOST}:${epp.ports.selection}/select`, { token_ids: tokens(32, 3) })).status;
  expect([epp.health.ready, await select()]).toEqual([true, 200]);

  api.remove("InferencePool", "llm", "pool");
  await waitFor(() => !epp.health.ready, { message: "NOT_SERVING once the pool is gone" });
  expect([epp.workers.specs().length, await select()]).toEqual([0, 503]);

  api.upsert(inferencePool("pool"));
  await waitFor(() => epp.health.ready, { message: "SERVING again with the pool back" });
  expect([epp.workers.specs().map((s) => s.id), await select()]).toEqual([["vllm-0"], 200]);
});

test("the pool's InferenceObjectives give the objectives' priorities over --objective-priorities, which keeps the names they do not give; InferenceModelRewrites are followed too", async () => {
  const api = await fakeApi();
  api.upsert(inferencePool("pool"));
  const objective = (name: string, priority: number) =>
    ({ apiVersion: "llm-d.ai/v1alpha2", kind: "InferenceObjective", metadata: { name, namespace: "llm" }, spec: { priority, poolRef: { name: "pool" } } }) as never;
  api.upsert(objective("chat", 10));
  const epp = await poolEpp(api, ["--objective-priorities", "chat=1,batch=-1"]);
  await waitFor(() => epp.workers.objectives.current().get("chat") === 10, { message: "chat from its InferenceObjective" });
  expect(epp.workers.objectives.current().get("batch")).toBe(-1);
  api.upsert(objective("batch", 3));
  await waitFor(() => epp.workers.objectives.current().get("batch") === 3, { message: "batch created" });
  api.remove("InferenceObjective", "llm", "chat");
  await waitFor(() => epp.workers.objectives.current().get("chat") === 1, { message: "chat back to the option's" });
  // InferenceModelRewrites are followed beside them.
  api.upsert({
    apiVersion: "llm-d.ai/v1alpha2", kind: "InferenceModelRewrite", metadata: { name: "canary", namespace: "llm" },
    spec: { poolRef: { name: "pool" }, rules: [{ matches: [{ model: { value: "chat" } }], targets: [{ modelRewrite: "chat-v2" }] }] },
  } as never);
  await waitFor(() => ruleTarget(epp.workers.modelRewrites.rules() ?? NO_RULES, "chat")?.target === "chat-v2", { message: "the rewrite followed" });
});

test("an InferenceModelRewrite for the body's model sends the request as its target, scored in its identity, over the header's rewrite; the response names the client's model; a rule without targets is refused; deleted, the header's rewrite is back", async () => {
  const api = await fakeApi();
  api.upsert(inferencePool("pool"));
  const ip = `${LOOPBACK}.4.174`;
  const ev = await FakeWorkerEvents.start(ip, KV_PORT);
  cleanups.push(() => ev.close());
  api.upsert(pod("vllm-0", ip, "ready") as never);
  const epp = await poolEpp(api, ["--model", MODEL, "--lora-adapters", "my-adapter"]);
  const prompt = tokens(64, 9); // 4 blocks, stored in the base model's identity
  await ev.storeUntil(prompt, async () => (await postJson(`http://${HOST}:${epp.ports.selection}/score`, { token_ids: prompt })).body.scores["vllm-0"]?.["0"] === 4);
  const client = extProcClient(epp.ports.grpc);
  cleanups.push(() => client.close());
  const enc = new TextEncoder();
  const text = (b: Uint8Array | undefined) => Buffer.from(b ?? []).toString();

  /** A full-duplex request whose body names `model`: the blocks its pick found, the model its body went upstream naming, the one its response names. */
  const ask = async (model: string, rewriteHeader?: string) => {
    const s = client.open();
    const h = headers("/v1/completions", false, { protocol_config: { request_body_mode: "FULL_DUPLEX_STREAMED", response_body_mode: "FULL_DUPLEX_STREAMED" } });
    const extra = rewriteHeader ? [["x-kv-epp-explain", "1"], ["x-gateway-model-name-rewrite", rewriteHeader]] : [["x-kv-epp-explain", "1"]];
    h.request_headers!.headers!.headers!.push(...extra.map(([key, v]) => ({ key: key!, raw_value: enc.encode(v) })));
    s.send(h);
    s.send(body({ model, prompt, max_tokens: 1 }));
    const route = await s.next();
    if (route.immediate_response) {
      s.end();
      return { refused: route.immediate_response.status?.code };
    }
    const overlap = /chosen: \S+ \S+ overlap=(\d+\/\d+)/.exec(setHeader(route.request_headers?.response, "x-kv-epp-decision") ?? "")?.[1];
    const upstream = JSON.parse(text((await s.next()).request_body?.response?.body_mutation?.streamed_response?.body)).model;
    s.send({ response_headers: { headers: { headers: [{ key: ":status", raw_value: enc.encode("200") }] } } });
    await s.next();
    s.send({ response_body: { body: enc.encode(JSON.stringify({ model: upstream, choices: [] })), end_of_stream: true } });
    const answered = JSON.parse(text((await s.next()).response_body?.response?.body_mutation?.streamed_response?.body)).model;
    s.end();
    return { overlap, upstream, answered };
  };
  const rewrite = (name: string, rules: unknown[]) =>
    api.upsert({ apiVersion: "llm-d.ai/v1alpha2", kind: "InferenceModelRewrite", metadata: { name, namespace: "llm", creationTimestamp: "2026-01-01T00:00:00Z" }, spec: { poolRef: { name: "pool" }, rules } } as never);
  const series = (result: string) => scrapeMetric(`http://${HOST}:${epp.ports.metrics}`, `dynamo_epp_model_rewrites_total{result="${result}"}`);

  /** /select's dry run for a body naming `model`: the blocks its pick found (or the refusal's status). */
  const selectOverlap = async (model: string) => {
    const r = await postJson(`http://${HOST}:${epp.ports.selection}/select`, { model, token_ids: prompt });
    return r.status === 200 ? r.body.overlap_blocks : r.status;
  };
  // No rule: "alias" is no model this EPP knows, scored as the base model's blocks.
  expect(await ask("alias")).toEqual({ overlap: "4/4", upstream: "alias", answered: "alias" });
  expect(await selectOverlap("alias")).toBe(4);
  rewrite("canary", [{ matches: [{ model: { value: "alias" } }], targets: [{ modelRewrite: "my-adapter", weight: 1 }] }]);
  rewrite("retired", [{ matches: [{ model: { value: "old" } }], targets: [] }]);
  await waitFor(() => ruleTarget(epp.workers.modelRewrites.rules() ?? NO_RULES, "alias")?.target === "my-adapter" && ruleTarget(epp.workers.modelRewrites.rules() ?? NO_RULES, "old") !== undefined, { message: "the rules watched" });
  // The adapter's identity: the base model's blocks are not its.
  expect(await ask("alias")).toEqual({ overlap: "0/4", upstream: "my-adapter", answered: "alias" });
  expect(await ask("alias", MODEL)).toEqual({ overlap: "0/4", upstream: "my-adapter", answered: "alias" });
  // A model no rule names: the header's rewrite.
  expect(await ask("other", MODEL)).toEqual({ overlap: "4/4", upstream: MODEL, answered: "other" });
  expect(await ask("old", MODEL)).toEqual({ refused: "BadRequest" });
  // /select reads its body with the same rules.
  expect([await selectOverlap("alias"), await selectOverlap("old")]).toEqual([0, 400]);

  api.remove("InferenceModelRewrite", "llm", "canary");
  await waitFor(() => ruleTarget(epp.workers.modelRewrites.rules() ?? NO_RULES, "alias") === undefined, { message: "the rule deleted" });
  expect(await ask("alias", MODEL)).toEqual({ overlap: "4/4", upstream: MODEL, answered: "alias" });
  expect(await ask("alias")).toEqual({ overlap: "4/4", upstream: "alias", answered: "alias" });
  expect(await selectOverlap("alias")).toBe(4);
  expect([await series("rule_rewritten"), await series("rule_no_targets"), await series("rewritten")]).toEqual([2, 1, 2]);
});

test("a watched InferenceObjective's priority is what ext_proc sheds by", async () => {
  const api = await fakeApi();
  api.upsert(inferencePool("pool"));
  api.upsert(pod("vllm-0", `${LOOPBACK}.4.57`, "ready") as never);
  // --max-inflight 1: a sheddable request (priority < 0) is refused from 80% of it, so at once; others are routed.
  const epp = await poolEpp(api, ["--max-inflight", "1"]);
  const client = extProcClient(epp.ports.grpc);
  cleanups.push(() => client.close());
  const ask = async () => {
    const s = client.open();
    const h = headers();
    h.request_headers!.headers!.headers!.push({ key: "x-gateway-inference-objective", raw_value: new TextEncoder().encode("batch") });
    s.send(h);
    s.send(body({ prompt: tokens(32, 4) }));
    const r = await s.next();
    s.end();
    return r.response;
  };
  expect(await ask()).toBe("request_headers"); // "batch" named nowhere: standard, routed
  await waitFor(() => epp.load.inflight === 0, { message: "released" });
  api.upsert({ apiVersion: "llm-d.ai/v1alpha2", kind: "InferenceObjective", metadata: { name: "batch", namespace: "llm" }, spec: { priority: -1, poolRef: { name: "pool" } } } as never);
  await waitFor(() => epp.workers.objectives.current().get("batch") === -1, { message: "batch watched" });
  expect(await ask()).toBe("immediate_response");
});

test("with --peer-service, a replica recovers from the serving peer its EndpointSlice lists, never itself", async () => {
  const api = await fakeApi();
  api.upsert(inferencePool("pool"));
  const ev = await FakeWorkerEvents.start(`${LOOPBACK}.4.53`, KV_PORT);
  cleanups.push(() => ev.close());
  api.upsert(pod("vllm-0", `${LOOPBACK}.4.53`, "ready") as never);
  const replica = async (ip: string) => {
    const cfg = parseConfig(
      ["--pool-name", "pool", "--model", "test-model", "--listen", ip, "--kv-events-port", String(KV_PORT),
        "--grpc-port", "0", "--grpc-health-port", "0", "--metrics-port", "0", "--replica-agg-port", "0", "--subscribe-wait-ms", "1000", "--selection-port", "9093", "--scrape-interval-ms", "0"],
      { POD_NAMESPACE: "llm", POD_IP: ip, DYN_EPP_PEER_SERVICE: "dynamo-epp-peer" },
    );
    const epp = await startEpp(cfg, { log: quietLog, kubeConfig: api.kubeConfig });
    cleanups.push(() => epp.stop({ graceMs: 200 }));
    return epp;
  };
  const endpoint = (ip: string, ready: boolean) => ({ addresses: [ip], conditions: { ready, serving: ready, terminating: false } });
  const slice = (eps: object[]) =>
    api.upsert({
      apiVersion: "discovery.k8s.io/v1",
      kind: "EndpointSlice",
      metadata: { name: "dynamo-epp-peer-abc", namespace: "llm", labels: { "kubernetes.io/service-name": "dynamo-epp-peer" } },
      addressType: "IPv4",
      ports: [{ name: "selection-http", port: 9093, protocol: "TCP" }],
      endpoints: eps,
    } as never);

  // A: the only endpoint in the slice is itself (not ready yet) -> empty bootstrap.
  slice([endpoint(`${LOOPBACK}.4.71`, false)]);
  const a = await replica(`${LOOPBACK}.4.71`);
  expect((await a.ready).kind).toBe("empty_bootstrap");
  await waitFor(() => ev.pub.subscriberCount === 1);
  const prompt = tokens(48, 12);
  await ev.storeUntil(prompt, async () => (await postJson(`http://${LOOPBACK}.4.71:9093/score`, { token_ids: prompt })).body.scores["vllm-0"]?.["0"] === 3);

  // B: A is now ready in the slice; B itself (not ready) is listed too and must be skipped.
  slice([endpoint(`${LOOPBACK}.4.71`, true), endpoint(`${LOOPBACK}.4.72`, false)]);
  const b = await replica(`${LOOPBACK}.4.72`);
  const outcome = await b.ready;
  expect(outcome).toMatchObject({ kind: "recovered", peer: `${LOOPBACK}.4.71:9093` });
  expect((await postJson(`http://${LOOPBACK}.4.72:9093/score`, { token_ids: prompt })).body.scores["vllm-0"]?.["0"]).toBe(3);
});

test("a changed InferencePool selector moves the worker set to the newly selected pods", async () => {
  const api = await fakeApi();
  api.upsert(inferencePool("pool"));
  api.upsert(pod("vllm-0", `${LOOPBACK}.4.54`, "ready") as never);
  api.upsert(pod("next-0", `${LOOPBACK}.4.55`, "ready", { app: "next" } as never) as never);
  const epp = await poolEpp(api);
  const ids = async () => ((await (await fetch(`http://${HOST}:${epp.ports.selection}/workers`)).json()) as { worker_id: string; address: string }[]).map((w) => `${w.worker_id}@${w.address}`);
  expect(await ids()).toEqual([`vllm-0@${LOOPBACK}.4.54:8000`]);
  api.upsert({ ...(inferencePool("pool") as object), spec: { selector: { matchLabels: { app: "next" } }, targetPorts: [{ number: 8100 }] } } as never);
  await waitFor(async () => (await ids()).join() === `next-0@${LOOPBACK}.4.55:8100`, { message: "workers follow the new selector and port" });
});

test("the kv-events-endpoint annotation follows vLLM's rule: a pod that connects its PUBs gets a bound port + rank, a wildcard one is dialled at its port", async () => {
  const api = await fakeApi();
  api.upsert(inferencePool("pool"));
  const annotated = (name: string, ip: string, endpoint: string) => {
    const p = pod(name, ip, "ready");
    return { ...p, metadata: { ...p.metadata, annotations: { [KV_EVENTS_ENDPOINT_ANNOTATION]: endpoint } } } as never;
  };
  // vllm-c's engine was started with endpoint tcp://<EPP>:25910 (it connects); vllm-w's with tcp://*:25920 (it binds).
  api.upsert(annotated("vllm-c", `${LOOPBACK}.4.57`, `tcp://${HOST}:25910`));
  api.upsert(annotated("vllm-w", `${LOOPBACK}.4.58`, "tcp://*:25920"));
  const common = { port: 8000, dpSize: 2, blockSize: 16, speed: 0, logLevel: "silent" as const };
  const workers = {
    "vllm-c": await startMockWorker({ ...common, listen: `${LOOPBACK}.4.57`, kvEvents: `tcp://${HOST}:25910`, kvEventsConnect: true }),
    "vllm-w": await startMockWorker({ ...common, listen: `${LOOPBACK}.4.58`, kvEvents: `tcp://${LOOPBACK}.4.58:25920` }),
  };
  cleanups.push(() => Promise.all(Object.values(workers).map((w) => w.close())));
  const cfg = parseConfig(
    ["--pool-name", "pool", "--model", "test-model", "--block-size", "16", "--dp-size", "2", "--listen", HOST, "--kv-events-port", String(KV_PORT),
      "--grpc-port", "0", "--grpc-health-port", "0", "--metrics-port", "0", "--replica-agg-port", "0", "--subscribe-wait-ms", "1000", "--selection-port", "0", "--scrape-interval-ms", "0"],
    { POD_NAMESPACE: "llm" },
  );
  const epp = await startEpp(cfg, { log: quietLog, kubeConfig: api.kubeConfig });
  cleanups.push(() => epp.stop({ graceMs: 200 }));
  await epp.ready;
  type Row = { worker_id: string; dp_rank: number; blocks: number; connected: boolean };
  const rows = async () => (await (await fetch(`http://${HOST}:${epp.ports.selection}/workers`)).json()) as Row[];
  await waitFor(async () => (await rows()).length === 4 && (await rows()).every((r) => r.connected), { message: "all four ranks connected" });

  for (const [name, w] of Object.entries(workers))
    for (let n = 0; n < 4; n++) {
      const r = await fetch(`${w.url}/v1/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ prompt: tokens(64, 700 + n + (name === "vllm-c" ? 0 : 50)), max_tokens: 1 }) });
      expect(r.status).toBe(200);
    }
  // Every rank of both pods is indexed exactly as its cache holds it, each rank on its own port.
  for (const [name, w] of Object.entries(workers))
    for (const rank of w.ranks) {
      expect(rank.cache.residentHashes().size).toBeGreaterThan(0);
      await waitFor(async () => (await rows()).find((r) => r.worker_id === name && r.dp_rank === rank.rank)?.blocks === rank.cache.residentHashes().size, {
        message: `${name} rank ${rank.rank} indexed as cached`,
      });
    }
});

test("podKvSource: no annotation dials the pod at --kv-events-port; a bad one keeps that default and says why", () => {
  const withAnnotation = (v?: string) => {
    const p = pod("p", "10.0.0.9", "ready") as { metadata: Record<string, unknown> };
    return (v === undefined ? p : { ...p, metadata: { ...p.metadata, annotations: { [KV_EVENTS_ENDPOINT_ANNOTATION]: v } } }) as never;
  };
  expect(podKvSource(withAnnotation(), 5557)).toEqual({ kvEvents: "tcp://10.0.0.9:5557", kvBind: false });
  expect(podKvSource(withAnnotation("tcp://*:6000"), 5557)).toEqual({ kvEvents: "tcp://10.0.0.9:6000", kvBind: false });
  expect(podKvSource(withAnnotation("tcp://0.0.0.0:6000"), 5557)).toEqual({ kvEvents: "tcp://10.0.0.9:6000", kvBind: false });
  expect(podKvSource(withAnnotation("tcp://10.0.0.2:6000"), 5557)).toEqual({ kvEvents: "tcp://10.0.0.2:6000", kvBind: true });
  expect(podKvSource(withAnnotation("tcp://dynamo-epp.llm.svc:6000"), 5557)).toEqual({ kvEvents: "tcp://0.0.0.0:6000", kvBind: true });
  for (const bad of ["ipc:///tmp/kv", "tcp://10.0.0.2:0", "nonsense"])
    expect(podKvSource(withAnnotation(bad), 5557)).toMatchObject({ kvEvents: "tcp://10.0.0.9:5557", kvBind: false, invalid: expect.any(String) });
});

test("llm-d's role label makes a pod a prefill or decode worker: the pair names the labelled pods, and a relabelled pod changes sets, not its blocks", async () => {
  const api = await fakeApi();
  api.upsert(inferencePool("pool"));
  const ev = [await FakeWorkerEvents.start("127.0.35.53", KV_PORT), await FakeWorkerEvents.start("127.0.35.54", KV_PORT)];
  cleanups.push(() => Promise.all(ev.map((e) => e.close())));
  const cfg = parseConfig(
    ["--pool-name", "pool", "--model", "test-model", "--block-size", "16", "--listen", HOST, "--kv-events-port", String(KV_PORT), "--pd-threshold-tokens", "32",
      "--grpc-port", "0", "--grpc-health-port", "0", "--metrics-port", "0", "--replica-agg-port", "0", "--subscribe-wait-ms", "1000", "--selection-port", "0", "--scrape-interval-ms", "0"],
    { POD_NAMESPACE: "llm" },
  );
  const epp = await startEpp(cfg, { log: quietLog, kubeConfig: api.kubeConfig });
  cleanups.push(() => epp.stop({ graceMs: 500 }));
  await epp.ready;
  const labelled = (name: string, ip: string, role: string) => pod(name, ip, "ready", { app: "vllm", "llm-d.ai/role": role } as never) as never;
  api.upsert(labelled("vllm-p", "127.0.35.53", "prefill"));
  api.upsert(labelled("vllm-d", "127.0.35.54", "decode"));
  const roles = async () =>
    Object.fromEntries(((await (await fetch(`http://${HOST}:${epp.ports.selection}/workers`)).json()) as { worker_id: string; role: string | null }[]).map((w) => [w.worker_id, w.role]));
  await waitFor(async () => JSON.stringify(await roles()) === JSON.stringify({ "vllm-p": "prefill", "vllm-d": "decode" }), { message: "both pods, with their roles" });
  const prompt = tokens(128, 9);
  await ev[0]!.storeUntil(prompt, async () => (await postJson(`http://${HOST}:${epp.ports.selection}/score`, { token_ids: prompt })).body.scores["vllm-p"]?.["0"] === 8);
  const select = async () => (await postJson(`http://${HOST}:${epp.ports.selection}/select`, { token_ids: prompt })).body;
  const sel = await select();
  expect(sel.endpoint).toBe("127.0.35.54:8000");
  expect(sel.pd).toEqual({ disaggregated: true, reason: "uncached_over_threshold", uncached_tokens: 128, threshold_tokens: 32, prefill: { endpoint: "127.0.35.53:8000", worker_id: "vllm-p", dp_rank: 0, overlap_blocks: 8 } });

  // Relabelled prefill-decode (both): still named as the prefill worker of requests sent to the other pod.
  api.upsert(labelled("vllm-p", "127.0.35.53", "prefill-decode"));
  await waitFor(async () => (await roles())["vllm-p"] === "both", { message: "relabelled both" });
  // Now a destination too, and it holds the prompt: it prefills locally.
  expect(await select()).toMatchObject({ endpoint: "127.0.35.53:8000", pd: { disaggregated: false, reason: "below_threshold", prefill: null } });
  // An encode role is not one this EPP routes by: no role, a destination, and no prefill pod is left.
  api.upsert(labelled("vllm-p", "127.0.35.53", "encode"));
  await waitFor(async () => (await roles())["vllm-p"] === null, { message: "encode label ignored" });
  const plain = await select();
  expect(plain.endpoint).toBe("127.0.35.53:8000");
  expect(plain.pd).toBeUndefined();
});

test("podRole: llm-d's label values, its deprecated both, and anything else ignored with a reason", () => {
  const withRole = (v?: string) => pod("p", "10.0.0.9", "ready", (v === undefined ? { app: "vllm" } : { app: "vllm", "llm-d.ai/role": v }) as never) as never;
  expect(podRole(withRole())).toEqual({});
  expect(podRole(withRole("prefill"))).toEqual({ role: "prefill" });
  expect(podRole(withRole("decode"))).toEqual({ role: "decode" });
  expect(podRole(withRole("prefill-decode"))).toEqual({ role: "both" });
  expect(podRole(withRole("both"))).toEqual({ role: "both" });
  for (const other of ["encode", "encode-prefill", "Prefill", ""]) expect(podRole(withRole(other))).toMatchObject({ invalid: expect.any(String) });
  expect(podRole(withRole("encode")).role).toBeUndefined();
});

describe("startPoolWorkers", () => {
  const pool = (port: number) =>
    ({ ...(inferencePool("pool") as object), spec: { selector: { matchLabels: { app: "vllm" } }, targetPorts: [{ number: port }] } }) as never;
  const start = (api: Awaited<ReturnType<typeof fakeApi>>, onWorkers: (ids: string[]) => void, onError: () => void = () => {}) =>
    startPoolWorkers({
      kubeConfig: api.kubeConfig,
      poolName: "pool",
      namespace: "llm",
      kvEventsPort: KV_PORT,
      dpSize: 1,
      log: quietLog,
      onWorkers: (specs) => onWorkers(specs.map((s) => `${s.id}@${s.address}`)),
      onError,
    });

  test("a failed pod list publishes no worker set (unknown is not empty); the first set comes from a list that succeeded", async () => {
    let denied = 0;
    const api = await startFakeKubeApi({
      host: HOST,
      port: 0,
      authorize: (r) => !(r.plural === "pods" && r.verb === "list" && denied++ === 0),
    });
    cleanups.push(() => api.close());
    api.upsert(pool(8000));
    api.upsert(pod("vllm-0", "10.0.0.1", "ready") as never);
    api.upsert(pod("vllm-1", "10.0.0.2", "ready") as never);
    const sets: string[][] = [];
    const src = await start(api, (ids) => sets.push(ids));
    cleanups.push(() => src.stop());
    expect(denied).toBeGreaterThanOrEqual(2); // the first list failed, a later one succeeded
    expect(sets.length).toBeGreaterThan(0);
    expect(sets.every((s) => s.length > 0)).toBe(true);
    expect(sets.at(-1)!.sort()).toEqual(["vllm-0@10.0.0.1:8000", "vllm-1@10.0.0.2:8000"]);
  });

  test("a pool change replaces the pod informer: the old one stops for good and is not counted as an error", async () => {
    const api = await fakeApi();
    api.upsert(pool(8000));
    api.upsert(pod("vllm-0", "10.0.0.1", "ready") as never);
    let last: string[] = [];
    let errors = 0;
    const src = await start(api, (ids) => (last = ids), () => errors++);
    cleanups.push(() => src.stop());
    const podWatches = () => api.requests.filter((r) => r.plural === "pods" && r.verb === "watch").length;
    await waitFor(() => podWatches() === 1, { message: "pod watch open" });
    for (let i = 1; i <= 2; i++) {
      api.upsert(pool(8000 + i));
      await waitFor(() => last.join() === `vllm-0@10.0.0.1:${8000 + i}`, { message: "workers follow the port" });
    }
    await waitFor(() => podWatches() >= 3, { message: "the current informer's watch open" });
    // A stopped informer that came back would open its watch after its 1 s restart pause: a window past it.
    await Bun.sleep(1500);
    expect(podWatches()).toBe(3);
    expect(errors).toBe(0);
  });
});
