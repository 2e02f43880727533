// Kubernetes mode's pool rules that llm-d's router follows too: a pod's active ports, and a deleted
// InferencePool. Against the testkit's fake API server (real HTTP list and watch).
import { describe, expect, test } from "bun:test";
import type { V1Pod } from "@kubernetes/client-node";
import pino from "pino";
import { mergeWorkerSets } from "@kv-epp/intents";
import { rankSources, type WorkerSpec } from "@kv-epp/protocol";
import { waitFor, type FakeKubeApi } from "@kv-epp/testkit";
import { kubeTestScope, NS, quiet } from "./kube-test-scope.ts";
import { ACTIVE_PORTS_ANNOTATION, LEGACY_ACTIVE_PORTS_ANNOTATION, podActivePorts, podWorker, startPoolWorkers } from "./kubernetes.ts";

const scope = kubeTestScope();

const pool = (ports: number[], meta: Record<string, unknown> = {}) =>
  ({
    apiVersion: "inference.networking.k8s.io/v1",
    kind: "InferencePool",
    metadata: { name: "pool", namespace: NS, ...meta },
    spec: { selector: { matchLabels: { app: "vllm" } }, targetPorts: ports.map((number) => ({ number })), endpointPickerRef: { name: "epp", port: { number: 9002 } } },
  }) as never;

const pod = (name: string, ip: string, annotations?: Record<string, string>) =>
  ({
    apiVersion: "v1",
    kind: "Pod",
    metadata: { name, namespace: NS, labels: { app: "vllm" }, ...(annotations ? { annotations } : {}) },
    status: { phase: "Running", podIP: ip, conditions: [{ type: "Ready", status: "True" }] },
  }) as V1Pod;

/** Each worker as `id: address [rank@server ...]`, to compare whole sets. */
const describeSpec = (s: WorkerSpec) => `${s.id}: ${s.address} [${rankSources(s).map((r) => `${r.dpRank}@${s.servers?.find((x) => x.ranks.includes(r.dpRank))?.address ?? s.address}`).join(" ")}]`;

function follow(api: FakeKubeApi, dpSize = 1, log = quiet) {
  const seen = { sets: [] as string[][], presence: [] as boolean[] };
  const started = startPoolWorkers({
    kubeConfig: api.kubeConfig,
    poolName: "pool",
    namespace: NS,
    kvEventsPort: 5557,
    dpSize,
    log,
    onWorkers: (specs) => seen.sets.push(specs.map(describeSpec).sort()),
    onPoolPresence: (present) => seen.presence.push(present),
    onError: () => {},
  });
  void started.then((s) => scope.onCleanup(() => s.stop()));
  return Object.assign(seen, { started, last: () => seen.sets.at(-1)?.join(" | ") });
}

describe("the active-ports annotation (llm-d.ai/active-ports)", () => {
  const ports = [8000, 8001, 8002];
  const active = (annotations?: Record<string, string>) => podActivePorts(pod("p", "10.0.0.1", annotations), ports).ports;

  test("absent: every target port; present: the listed target ports, in the pool's order", () => {
    expect(active()).toEqual(ports);
    expect(active({ [ACTIVE_PORTS_ANNOTATION]: "8002,8000" })).toEqual([8000, 8002]);
    expect(active({ [ACTIVE_PORTS_ANNOTATION]: " 8001 , 8001" })).toEqual([8001]);
  });

  test("parsed as llm-d's Sscanf %d: the leading integer counts, a sign is allowed; zero, negatives, non-numbers and ports outside the pool are skipped", () => {
    expect(active({ [ACTIVE_PORTS_ANNOTATION]: "8000abc,+8001" })).toEqual([8000, 8001]);
    expect(active({ [ACTIVE_PORTS_ANNOTATION]: "08002" })).toEqual([8002]);
    expect(active({ [ACTIVE_PORTS_ANNOTATION]: "x8000,-8001,0,9000,0x1f40" })).toEqual([]);
    const r = podActivePorts(pod("p", "10.0.0.1", { [ACTIVE_PORTS_ANNOTATION]: "8000,9000" }), ports);
    expect(r.invalid).toContain('"9000"');
  });

  test("present but naming no target port, empty included, leaves the pod no port at all", () => {
    expect(active({ [ACTIVE_PORTS_ANNOTATION]: "" })).toEqual([]);
    expect(active({ [ACTIVE_PORTS_ANNOTATION]: "9000" })).toEqual([]);
  });

  test("the older GAIE key is read only when the llm-d key is absent", () => {
    expect(active({ [LEGACY_ACTIVE_PORTS_ANNOTATION]: "8001" })).toEqual([8001]);
    expect(active({ [LEGACY_ACTIVE_PORTS_ANNOTATION]: "8001", [ACTIVE_PORTS_ANNOTATION]: "8002" })).toEqual([8002]);
    expect(active({ [LEGACY_ACTIVE_PORTS_ANNOTATION]: "8001", [ACTIVE_PORTS_ANNOTATION]: "" })).toEqual([]);
  });

  test("an inactive port's ranks leave the worker; the others keep their global ranks, KV ports and servers", () => {
    const p = pod("p", "10.0.0.1", { [ACTIVE_PORTS_ANNOTATION]: "8000,8002" });
    const spec = podWorker(p, { kvEventsPort: 5557, dpSize: 2 }, ports, podActivePorts(p, ports).ports);
    expect(spec.servers).toEqual([{ address: "10.0.0.1:8000", ranks: [0, 1] }, { address: "10.0.0.1:8002", ranks: [4, 5] }]);
    expect(rankSources(spec).map((r) => [r.dpRank, r.kvEvents])).toEqual([
      [0, "tcp://10.0.0.1:5557"], [1, "tcp://10.0.0.1:5558"], [4, "tcp://10.0.0.1:5561"], [5, "tcp://10.0.0.1:5562"],
    ]);
    const second = podWorker(p, { kvEventsPort: 5557, dpSize: 1 }, ports, [8001]);
    expect([second.address, second.metricsUrl, second.dpSize]).toEqual(["10.0.0.1:8001", "http://10.0.0.1:8001/metrics", 1]);
    // All active: the spec is the one without the annotation.
    expect(podWorker(p, { kvEventsPort: 5557, dpSize: 2 }, ports, ports)).toEqual(podWorker(pod("p", "10.0.0.1"), { kvEventsPort: 5557, dpSize: 2 }, ports));
  });

  test("intents stating every rank of the pod do not bring back the ranks behind its inactive ports", () => {
    const p = pod("p", "10.0.0.1", { [ACTIVE_PORTS_ANNOTATION]: "8000,8002" });
    const spec = podWorker(p, { kvEventsPort: 5557, dpSize: 2 }, ports, podActivePorts(p, ports).ports);
    const stated = [{ id: "p", ranks: [0, 1, 2, 3, 4, 5].map((r) => ({ dpRank: r, kvEvents: `tcp://10.0.0.1:${7000 + r}`, topic: "kv", blockSize: 16 })) }];
    const [merged] = mergeWorkerSets([spec], stated, { mode: "kubernetes" }).workers;
    expect(rankSources(merged!).map((r) => [r.dpRank, r.kvEvents])).toEqual([
      [0, "tcp://10.0.0.1:7000"], [1, "tcp://10.0.0.1:7001"], [4, "tcp://10.0.0.1:7004"], [5, "tcp://10.0.0.1:7005"],
    ]);
    expect(merged!.servers).toEqual(spec.servers);
  });

  test("through the pod list-watch: a rank marked inactive gets no endpoint, and a pod with no active port is no worker", async () => {
    const api = await scope.api();
    api.upsert(pool([8000, 8001]));
    api.upsert(pod("a", "10.0.0.1") as never);
    api.upsert(pod("b", "10.0.0.2", { [ACTIVE_PORTS_ANNOTATION]: "8001" }) as never);
    const w = follow(api);
    await w.started;
    expect(w.last()).toBe("a: 10.0.0.1:8000 [0@10.0.0.1:8000 1@10.0.0.1:8001] | b: 10.0.0.2:8001 [1@10.0.0.2:8001]");
    api.upsert(pod("a", "10.0.0.1", { [LEGACY_ACTIVE_PORTS_ANNOTATION]: "9000" }) as never);
    await waitFor(() => w.last() === "b: 10.0.0.2:8001 [1@10.0.0.2:8001]", { message: "a has no active port left" });
    api.upsert(pod("b", "10.0.0.2") as never);
    await waitFor(() => w.last() === "b: 10.0.0.2:8000 [0@10.0.0.2:8000 1@10.0.0.2:8001]", { message: "b's annotation removed" });
  });
});

test("a pod's bad annotation is warned once while the pod stays, and again once it has left and come back (its mark goes with it)", async () => {
  const api = await scope.api();
  api.upsert(pool([8000]));
  const bad = () => pod("a", "10.0.0.1", { [ACTIVE_PORTS_ANNOTATION]: "8000,9000" }) as never;
  api.upsert(bad());
  const lines: string[] = [];
  const w = follow(api, 1, pino({ level: "warn" }, { write: (line: string) => void lines.push(line) }));
  await w.started;
  const warnings = () => lines.filter((l) => l.includes("active-ports")).length;
  expect(warnings()).toBe(1);
  api.upsert(pod("b", "10.0.0.2") as never); // another snapshot with a still there
  await waitFor(() => w.sets.length >= 2, { message: "b added" });
  expect(warnings()).toBe(1);
  api.remove("Pod", NS, "a");
  await waitFor(() => w.last() === "b: 10.0.0.2:8000 [0@10.0.0.2:8000]", { message: "a gone" });
  api.upsert(bad());
  await waitFor(() => w.last()?.startsWith("a:") === true, { message: "a back" });
  expect(warnings()).toBe(2);
});

describe("a deleted InferencePool", () => {
  /** Pod a followed in pool [8000]. */
  const followed = async () => {
    const api = await scope.api();
    api.upsert(pool([8000]));
    api.upsert(pod("a", "10.0.0.1") as never);
    const w = follow(api);
    await w.started;
    return { api, w };
  };

  test("NotFound clears the workers and the presence; created again, it is followed afresh", async () => {
    const { api, w } = await followed();
    expect([w.last(), w.presence]).toEqual(["a: 10.0.0.1:8000 [0@10.0.0.1:8000]", [true]]);
    api.remove("InferencePool", NS, "pool");
    await waitFor(() => w.presence.length === 2, { message: "the deletion seen" });
    expect([w.sets.at(-1), w.presence]).toEqual([[], [true, false]]);
    // The pods' list-watch went with the pool: a pod added meanwhile publishes nothing.
    api.upsert(pod("b", "10.0.0.2") as never);
    await Bun.sleep(100);
    expect(w.sets.at(-1)).toEqual([]);
    api.upsert(pool([8001]));
    await waitFor(() => w.presence.length === 3, { message: "the pool back" });
    expect([w.last(), w.presence]).toEqual(["a: 10.0.0.1:8001 [0@10.0.0.1:8001] | b: 10.0.0.2:8001 [0@10.0.0.2:8001]", [true, false, true]]);
  });

  test("a deletionTimestamp (finalizers still pending) clears the workers as NotFound does", async () => {
    const { api, w } = await followed();
    api.upsert(pool([8000], { deletionTimestamp: new Date().toISOString(), finalizers: ["example.com/hold"] }));
    await waitFor(() => w.presence.length === 2, { message: "the deletion seen" });
    expect([w.sets.at(-1), w.presence]).toEqual([[], [true, false]]);
    api.remove("InferencePool", NS, "pool"); // the finalizer released: nothing more to clear
    await Bun.sleep(100);
    expect(w.presence).toEqual([true, false]);
  });
});
