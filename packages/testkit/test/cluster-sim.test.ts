import { afterEach, beforeEach, expect, test } from "bun:test";
import { createServer } from "node:net";
import { join } from "node:path";
import { CoreV1Api, DiscoveryV1Api, makeInformer, type V1EndpointSlice } from "@kubernetes/client-node";
import { HealthProbe, killAll, rbacAuthorizerFor, SimCluster, SimDeployment, startFakeKubeApi, waitFor, type FakeKubeApi, type SimPodSpec, LOOPBACK, LOOPBACK_PATTERN } from "../src/index.ts";

const NS = "sim";
const FIXTURE = join(import.meta.dir, "fixtures", "health-server.ts");

let api: FakeKubeApi;
let sim: SimCluster;

beforeEach(async () => {
  api = await startFakeKubeApi({ namespace: NS });
  sim = new SimCluster(api, { namespace: NS, periodMs: 50 });
  // The health fixture binds 9003 on each pod's address: a leftover process holding it fails here,
  // by name, rather than as a pod that never turns ready.
  await sim.assertPortsFree([9003], 6);
});

afterEach(async () => {
  await sim.close();
  await api.close();
  await killAll();
});

function healthPod(name: string, env: Record<string, string> = {}, extra: Partial<SimPodSpec> = {}): SimPodSpec {
  return {
    name,
    labels: { app: "epp" },
    command: () => ({ cmd: process.execPath, args: [FIXTURE], env }),
    readiness: { grpc: { port: 9003, service: "readiness" } },
    ports: [{ name: "grpc-health", containerPort: 9003 }],
    ...extra,
  };
}

type Conditions = { ready?: boolean; serving?: boolean; terminating?: boolean } | "absent";

test("readiness from the grpc probe reaches the Pod and the EndpointSlice; deletion goes terminating, SIGTERM, removal", async () => {
  sim.addService({ name: "peers", selector: { app: "epp" }, ports: [{ name: "selection-http", port: 9093 }] });
  const discovery = api.kubeConfig.makeApiClient(DiscoveryV1Api);
  const informer = makeInformer(
    api.kubeConfig,
    `/apis/discovery.k8s.io/v1/namespaces/${NS}/endpointslices`,
    () => discovery.listNamespacedEndpointSlice({ namespace: NS, labelSelector: "kubernetes.io/service-name=peers" }),
    "kubernetes.io/service-name=peers",
  );
  const seen: Conditions[] = [];
  const record = (s: V1EndpointSlice) => {
    const ep = s.endpoints?.find((e) => e.targetRef?.name === "p1");
    const c: Conditions = ep ? { ready: ep.conditions?.ready, serving: ep.conditions?.serving, terminating: ep.conditions?.terminating } : "absent";
    if (JSON.stringify(seen.at(-1)) !== JSON.stringify(c)) seen.push(c);
  };
  informer.on("add", record);
  informer.on("update", record);
  await informer.start();

  const pod = sim.runPod(healthPod("p1", { READY_AFTER_MS: "300", TERM_DELAY_MS: "200" }, { preStopMs: 100 }));
  expect(pod.ip).toMatch(new RegExp(`^${LOOPBACK_PATTERN}\\.5\\.\\d+$`));
  const line = await sim.process("p1").waitForLog(/^listening/);
  expect(line).toBe(`listening ${pod.ip}:9003 uid=${pod.uid} kubeconfig=set`);
  await waitFor(() => sim.isReady("p1"), { message: "p1 ready" });
  const core = api.kubeConfig.makeApiClient(CoreV1Api);
  await waitFor(async () => (await core.readNamespacedPod({ namespace: NS, name: "p1" })).status?.conditions?.find((c) => c.type === "Ready")?.status === "True");

  await sim.deletePod("p1");
  expect(sim.process("p1").lines).toContain("SIGTERM received");
  expect(api.get("Pod", NS, "p1")).toBeUndefined();
  await waitFor(() => seen.at(-1) === "absent");
  await informer.stop();

  expect(seen).toEqual([
    "absent", // the Service's slice exists before the pod
    { ready: false, serving: false, terminating: false },
    { ready: true, serving: true, terminating: false },
    { ready: false, serving: true, terminating: true }, // preStop and SIGTERM: still serving
    { ready: false, serving: false, terminating: true }, // the process has exited
    "absent",
  ]);
}, 30_000);

test("a delete through the API is carried out by the simulated kubelet", async () => {
  sim.runPod(healthPod("p2"));
  await waitFor(() => sim.isReady("p2"));
  const core = api.kubeConfig.makeApiClient(CoreV1Api);
  const marked = await core.deleteNamespacedPod({ namespace: NS, name: "p2" });
  expect(marked.metadata?.deletionTimestamp).toBeDefined(); // graceful: the kubelet's finalizer holds it
  await waitFor(() => api.get("Pod", NS, "p2") === undefined, { message: "pod removed" });
  expect(sim.podNames()).toEqual([]);
}, 30_000);

test("a pod whose process dies turns Failed and not ready", async () => {
  sim.addService({ name: "svc", selector: { app: "epp" }, ports: [{ name: "x", port: 1 }] });
  sim.runPod({ name: "crash", labels: { app: "epp" }, command: () => ({ cmd: "sh", args: ["-c", "sleep 0.3; exit 3"] }) });
  await waitFor(() => sim.isReady("crash"));
  await waitFor(() => (api.get("Pod", NS, "crash")?.status as { phase?: string } | undefined)?.phase === "Failed", { message: "phase Failed" });
  const slice = api.get("EndpointSlice", NS, "svc-sim") as { endpoints: { conditions: { ready: boolean } }[] } & object;
  await waitFor(() => (api.get("EndpointSlice", NS, "svc-sim") as typeof slice).endpoints[0]?.conditions.ready === false);
}, 30_000);

test("the health probe tells SERVING, NOT_SERVING, an unknown service and an unreachable address apart", async () => {
  const pod = sim.runPod(healthPod("h", { READY_AFTER_MS: "60000" }));
  await sim.process("h").waitForLog(/^listening/);
  const probe = new HealthProbe(`${pod.ip}:9003`);
  try {
    expect(await probe.check("liveness")).toBe("SERVING");
    expect(await probe.check("")).toBe("SERVING"); // an empty request message (the kubelet's default)
    expect(await probe.check("readiness")).toBe("NOT_SERVING");
    expect(await probe.check("nope")).toBe("SERVICE_UNKNOWN");
  } finally {
    probe.close();
  }
  const nobody = new HealthProbe(`${LOOPBACK}.5.254:9003`);
  expect(await nobody.check("", 300)).toBe("UNREACHABLE");
  nobody.close();
}, 30_000);

test("a simulated Deployment replaces deleted pods and rolls out without ever dropping to zero ready", async () => {
  const deploy = new SimDeployment(sim, {
    name: "epp",
    replicas: 2,
    labels: { app: "epp" },
    template: () => ({
      command: () => ({ cmd: process.execPath, args: [FIXTURE], env: { READY_AFTER_MS: "150" } }),
      readiness: { grpc: { port: 9003, service: "readiness" } },
    }),
  });
  try {
    const first = await waitFor(() => (deploy.readyPods().length === 2 ? deploy.readyPods() : undefined));
    expect(new Set(first.map((p) => sim.process(p).lines.find((l) => l.startsWith("listening"))?.split(" ")[1])).size).toBe(2);

    await sim.deletePod(first[0]!, { wait: false });
    const afterDelete = await waitFor(() => {
      const ready = deploy.readyPods();
      return ready.length === 2 && !ready.includes(first[0]!) ? ready : undefined;
    });
    expect(afterDelete).toContain(first[1]!);

    let minReady = 2;
    const sampler = setInterval(() => (minReady = Math.min(minReady, deploy.readyPods().length)), 10);
    const fresh = await deploy.rolloutRestart();
    await waitFor(() => deploy.pods().length === 2);
    clearInterval(sampler);
    expect(minReady).toBeGreaterThanOrEqual(1);
    expect(deploy.pods().sort()).toEqual([...fresh].sort());
    for (const old of afterDelete) expect(sim.process(old).lines).toContain("SIGTERM received");
  } finally {
    deploy.stop();
  }
}, 30_000);

test("a readiness gate holds a pod whose probe passes out of Ready and the EndpointSlice until it is set", async () => {
  sim.addService({ name: "gated", selector: { app: "epp" }, ports: [{ name: "http", port: 80, targetPort: 8080 }] });
  sim.runPod(healthPod("g", {}, { readinessGates: ["example.com/warm"] }));
  await waitFor(() => sim.probePassing("g"), { message: "probe passing" });
  const slice = () => api.get("EndpointSlice", NS, "gated-sim") as { endpoints: { conditions: { ready: boolean } }[]; ports: { port: number }[] } & object;
  const condition = (type: string) => (api.get("Pod", NS, "g")?.status as { conditions: { type: string; status: string }[] }).conditions.find((c) => c.type === type)?.status;
  // Probes keep passing meanwhile; the gate alone keeps it out.
  await waitFor(() => condition("ContainersReady") === "True");
  expect(sim.isReady("g")).toBe(false);
  expect(condition("example.com/warm")).toBe("False");
  expect(condition("Ready")).toBe("False");
  expect(slice().endpoints[0]?.conditions.ready).toBe(false);
  expect(slice().ports).toEqual([{ name: "http", port: 8080, protocol: "TCP" }] as never); // the targetPort

  sim.setReadinessGate("g", "example.com/warm", true);
  expect(sim.isReady("g")).toBe(true);
  expect(condition("Ready")).toBe("True");
  expect(slice().endpoints[0]?.conditions.ready).toBe(true);
  expect(() => sim.setReadinessGate("g", "other", true)).toThrow(/no readiness gate other/);
}, 30_000);

test("a pod's API client acts as its service account, held to the Roles bound to it", async () => {
  const rbac = [
    { apiVersion: "rbac.authorization.k8s.io/v1", kind: "Role", metadata: { name: "pod-reader", namespace: NS }, rules: [{ apiGroups: [""], resources: ["pods"], verbs: ["list"] }] },
    { apiVersion: "rbac.authorization.k8s.io/v1", kind: "RoleBinding", metadata: { name: "pod-reader", namespace: NS }, roleRef: { kind: "Role", name: "pod-reader" }, subjects: [{ kind: "ServiceAccount", name: "reader" }] },
  ];
  const strictApi = await startFakeKubeApi({ namespace: NS, authorize: rbacAuthorizerFor(rbac) });
  const strict = new SimCluster(strictApi, { namespace: NS, periodMs: 50 });
  try {
    const lister = (name: string, sa: string, ns = NS): SimPodSpec => ({
      name,
      labels: {},
      serviceAccountName: sa,
      command: () => ({ cmd: process.execPath, args: [join(import.meta.dir, "fixtures", "list-pods.ts"), ns] }),
    });
    strict.runPod(lister("as-reader", "reader"));
    strict.runPod(lister("as-other", "other"));
    strict.runPod(lister("elsewhere", "reader", "kube-system"));
    expect(await strict.process("as-reader").exited).toBe(0);
    expect(strict.process("as-reader").output()).toContain("pods: as-other,as-reader,elsewhere");
    for (const p of ["as-other", "elsewhere"]) expect(await strict.process(p).exited).not.toBe(0);
    const users = new Set(strictApi.requests.map((r) => `${r.user} ${r.namespace} ${r.status}`));
    expect(users).toEqual(new Set([`system:serviceaccount:${NS}:reader ${NS} 200`, `system:serviceaccount:${NS}:other ${NS} 403`, `system:serviceaccount:${NS}:reader kube-system 403`]));
  } finally {
    await strict.close();
    await strictApi.close();
  }
}, 30_000);

test("a held port fails the preflight at once, naming the address and the port", async () => {
  const holder = createServer(); // the second pod's address (a fresh cluster starts at LOOPBACK.5.2)
  await new Promise<void>((resolve) => holder.listen(9003, `${LOOPBACK}.5.3`, resolve));
  try {
    await expect(sim.assertPortsFree([9003, 9093], 3)).rejects.toThrow(new RegExp(`held .*: ${LOOPBACK_PATTERN}\\.5\\.3: 9003$`));
    await expect(sim.assertPortsFree([9093], 3)).resolves.toBeUndefined();
  } finally {
    await new Promise((resolve) => holder.close(resolve));
  }
  await sim.assertPortsFree([9003], 3);
}, 30_000);

test("a pod's process gets its own environment, not what the test runner's holds", async () => {
  // Whole-repo runs share one process: what an earlier test left in process.env must not configure a pod.
  const saved = { leak: process.env.DYN_EPP_LEAK_CHECK, kc: process.env.KUBECONFIG };
  process.env.DYN_EPP_LEAK_CHECK = "leaked";
  process.env.KUBECONFIG = "/nonexistent/kubeconfig";
  try {
    const pod = sim.runPod({
      name: "env",
      labels: {},
      command: () => ({
        cmd: process.execPath,
        args: ["-e", "console.log('env ' + JSON.stringify({ leak: process.env.DYN_EPP_LEAK_CHECK ?? null, kc: process.env.KUBECONFIG, ip: process.env.POD_IP, own: process.env.OWN, path: Boolean(process.env.PATH) }))"],
        env: { OWN: "set" },
      }),
    });
    const line = await sim.process("env").waitForLog(/^env /);
    expect(JSON.parse(line.slice(4))).toEqual({ leak: null, kc: api.kubeconfigPath, ip: pod.ip, own: "set", path: true });
  } finally {
    for (const [k, v] of [["DYN_EPP_LEAK_CHECK", saved.leak], ["KUBECONFIG", saved.kc]] as const) {
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
  }
}, 30_000);
