// Checks deploy/: every kustomization renders (with kubectl where it exists, and with the testkit's
// own renderer, which must agree), and the rendered objects carry the essentials the EPP, the
// gateway and the recovery rules depend on.
import { describe, expect, test } from "bun:test";
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { rbacAuthorizer, renderKustomization, renderWithKubectl, type KubeObject } from "../src/index.ts";

const DEPLOY = join(import.meta.dir, "..", "..", "..", "deploy");

/**
 * The environment variables a program reads: its options' declared names (@kv-epp/options' naming rule).
 * Loaded by path beside the deploy tree, as the manifests are: testkit itself depends on no program.
 */
async function envNamesOf(configModule: string, specName: string, programName: string): Promise<Set<string>> {
  const packages = join(DEPLOY, "..", "packages");
  const { envName } = (await import(join(packages, "options", "src", "index.ts"))) as {
    envName: (key: string, o: unknown, prefix: string | undefined) => string | undefined;
  };
  const m = (await import(join(packages, configModule))) as Record<string, unknown>;
  const spec = m[specName] as Record<string, unknown>;
  const prefix = (m[programName] as { envPrefix?: string }).envPrefix;
  return new Set(Object.entries(spec).map(([k, o]) => envName(k, o, prefix)).filter((n): n is string => n !== undefined));
}
const EPP_ENV = await envNamesOf(join("epp", "src", "options.ts"), "EPP_OPTIONS", "EPP_PROGRAM");
const MOCK_WORKER_ENV = await envNamesOf(join("mock-worker", "src", "config.ts"), "MOCK_WORKER_OPTIONS", "MOCK_WORKER_PROGRAM");
const KUSTOMIZATIONS = ["base", "overlays/networkpolicy", "overlays/vllm", "overlays/monitoring"];
const NS = "kv-epp";
const EPP_LABELS = { "app.kubernetes.io/name": "dynamo-epp" };

type Container = {
  name: string;
  command?: string[];
  args?: string[];
  env?: { name: string; value?: string; valueFrom?: { fieldRef?: { fieldPath: string } } }[];
  ports?: { name?: string; containerPort: number }[];
  readinessProbe?: { grpc?: { port: number; service?: string } };
  livenessProbe?: { grpc?: { port: number; service?: string } };
  resources?: { requests?: Record<string, string>; limits?: Record<string, string> };
  lifecycle?: { preStop?: { exec?: { command: string[] } } };
  volumeMounts?: { name: string; mountPath: string }[];
};
type PodSpec = {
  serviceAccountName?: string;
  terminationGracePeriodSeconds?: number;
  securityContext?: { runAsNonRoot?: boolean; runAsUser?: number };
  containers: Container[];
  volumes?: { name: string }[];
};
type Workload = KubeObject & {
  spec: { replicas: number; strategy?: { rollingUpdate?: { maxUnavailable?: number } }; selector: { matchLabels: Record<string, string> }; template: { metadata: { labels: Record<string, string> }; spec: PodSpec } };
};
type Service = KubeObject & { spec: { selector: Record<string, string>; clusterIP?: string; ports: { name: string; port: number; targetPort?: string | number }[] } };

const find = <T extends KubeObject>(objs: KubeObject[], kind: string, name: string): T => {
  const o = objs.find((x) => x.kind === kind && x.metadata?.name === name);
  if (!o) throw new Error(`${kind}/${name} missing`);
  return o as T;
};
const selects = (selector: Record<string, string>, labels: Record<string, string>) => Object.entries(selector).every(([k, v]) => labels[k] === v);
const envOf = (c: Container) => new Map((c.env ?? []).map((e) => [e.name, e.valueFrom?.fieldRef?.fieldPath ?? e.value]));
/** A Kubernetes CPU quantity ("500m", "2") in CPUs. */
const cpuOf = (q: string) => (q.endsWith("m") ? Number(q.slice(0, -1)) / 1000 : Number(q));
const portsOf = (c: Container) => Object.fromEntries((c.ports ?? []).map((p) => [p.name, p.containerPort]));

/** Order-insensitive form for comparing two renderings (kubectl orders by kind, and list items by its own merge rules). */
function canonical(v: unknown): unknown {
  if (Array.isArray(v)) return v.map(canonical).sort((a, b) => JSON.stringify(a).localeCompare(JSON.stringify(b)));
  if (v !== null && typeof v === "object") {
    return Object.fromEntries(Object.entries(v as Record<string, unknown>).sort(([a], [b]) => a.localeCompare(b)).map(([k, x]) => [k, canonical(x)]));
  }
  return v;
}

/**
 * The Lease verbs the intents Kubernetes backend (packages/intents) uses, read from its client calls,
 * so that a new call there without the RBAC to match fails here, not in a cluster.
 */
function intentsLeaseVerbs(): string[] {
  const file = join(DEPLOY, "..", "packages", "intents", "src", "discovery", "kubernetes.ts");
  const fallback = ["get", "list", "watch", "create", "update", "delete"];
  if (!existsSync(file)) return fallback;
  const text = readFileSync(file, "utf8");
  const verbOf: Record<string, string[]> = { read: ["get"], list: ["list"], create: ["create"], replace: ["update"], patch: ["patch"], delete: ["delete"] };
  const verbs = new Set<string>();
  for (const m of text.matchAll(/\.(read|list|create|replace|patch|delete)NamespacedLease\b/g)) for (const v of verbOf[m[1]!]!) verbs.add(v);
  if (/makeInformer/.test(text)) (verbs.add("list"), verbs.add("watch"));
  return verbs.size > 0 ? [...verbs].sort() : fallback;
}

const rendered = new Map(KUSTOMIZATIONS.map((k) => [k, renderKustomization(join(DEPLOY, k))]));
const render = (k: string) => rendered.get(k)!;

describe("deploy/ kustomizations", () => {
  for (const k of KUSTOMIZATIONS) {
    test(`${k}: the testkit renderer agrees with kubectl kustomize (where kubectl exists)`, () => {
      const ours = render(k);
      expect(ours.length).toBeGreaterThan(5);
      const theirs = renderWithKubectl(join(DEPLOY, k));
      if (theirs === null) return; // no kubectl here: our rendering alone is validated below
      expect(canonical(ours)).toEqual(canonical(theirs));
    });

    test(`${k}: every namespaced object lands in ${NS}`, () => {
      for (const o of render(k)) {
        if (o.kind === "Namespace") expect(o.metadata?.name).toBe(NS);
        else expect([o.kind, o.metadata?.namespace]).toEqual([o.kind, NS]);
      }
    });

    test(`${k}: the EPP Deployment has its ports, grpc probes, downward API, peer Service and graceful termination`, () => {
      const objs = render(k);
      const d = find<Workload>(objs, "Deployment", "dynamo-epp");
      expect(d.spec.replicas).toBe(2);
      expect(d.spec.strategy?.rollingUpdate?.maxUnavailable).toBe(0);
      const pod = d.spec.template.spec;
      const epp = pod.containers.find((c) => c.name === "epp")!;
      expect(portsOf(epp)).toEqual({ grpc: 9002, "grpc-health": 9003, metrics: 9090, "replica-agg": 9092, "selection-http": 9093 });
      expect(epp.readinessProbe?.grpc).toEqual({ port: 9003, service: "readiness" });
      expect(epp.livenessProbe?.grpc).toEqual({ port: 9003, service: "liveness" });
      const env = envOf(epp);
      expect(env.get("POD_IP")).toBe("status.podIP");
      expect(env.get("POD_NAMESPACE")).toBe("metadata.namespace");
      expect(env.get("DYN_EPP_PEER_SERVICE")).toBe("dynamo-epp-peer");
      // Attachment intents beside pod discovery; the shared host record (kvh-<host>) is owned by each
      // replica's pod, which the intents backend names from POD_NAME/POD_UID.
      expect(env.get("DYN_EPP_INTENT_DISCOVERY")).toBe("kubernetes");
      expect(env.get("DYN_EPP_KV_HOST")).toBe("dynamo-epp");
      expect(env.get("POD_NAME")).toBe("metadata.name");
      expect(env.get("POD_UID")).toBe("metadata.uid");
      find(objs, "Service", env.get("DYN_EPP_PEER_SERVICE")!);
      find(objs, "InferencePool", env.get("DYN_EPP_POOL_NAME")!);
      expect(epp.resources?.requests?.cpu).toBeDefined();
      // No CPU limit, so no quota to size the tokenizer pool from: it is sized with the request (less the decision thread's CPU).
      expect(epp.resources?.limits?.cpu).toBeUndefined();
      expect(Number(env.get("DYN_EPP_TOKENIZER_THREADS"))).toBe(Math.max(1, Math.floor(cpuOf(epp.resources!.requests!.cpu!)) - 1));
      expect(epp.resources?.limits?.memory).toBeDefined();
      const preStop = epp.lifecycle?.preStop?.exec?.command ?? [];
      expect(preStop[0]).toBe("sleep");
      expect(pod.terminationGracePeriodSeconds!).toBeGreaterThan(Number(preStop[1]) + 10);
      expect(pod.securityContext?.runAsNonRoot).toBe(true);
      expect(epp.command).toEqual(["epp"]);
      expect(selects(d.spec.selector.matchLabels, d.spec.template.metadata.labels)).toBe(true);
      // Every volume mounted is declared.
      const volumes = new Set((pod.volumes ?? []).map((v) => v.name));
      for (const m of epp.volumeMounts ?? []) expect(volumes.has(m.name)).toBe(true);
    });

    test(`${k}: the EPP's environment variables are ones the EPP reads`, () => {
      const known = EPP_ENV;
      expect(known.has("DYN_EPP_GRPC_PORT")).toBe(true);
      const epp = find<Workload>(render(k), "Deployment", "dynamo-epp").spec.template.spec.containers.find((c) => c.name === "epp")!;
      const unknown = [...envOf(epp).keys()].filter((n) => !known.has(n) && !["POD_NAME", "POD_UID"].includes(n));
      expect(unknown).toEqual([]);
    });

    test(`${k}: Service dynamo-epp carries gRPC only; dynamo-epp-peer carries the peer plane`, () => {
      const objs = render(k);
      const podLabels = find<Workload>(objs, "Deployment", "dynamo-epp").spec.template.metadata.labels;
      const epp = find<Service>(objs, "Service", "dynamo-epp");
      expect(epp.spec.ports.map((p) => [p.name, p.port])).toEqual([["grpc", 9002]]);
      const peer = find<Service>(objs, "Service", "dynamo-epp-peer");
      expect(peer.spec.ports.map((p) => [p.name, p.port]).sort()).toEqual([["replica-agg", 9092], ["selection-http", 9093]]);
      for (const s of [epp, peer]) expect(selects(s.spec.selector, podLabels)).toBe(true);
      const containerPorts = Object.keys(portsOf(find<Workload>(objs, "Deployment", "dynamo-epp").spec.template.spec.containers[0]!));
      for (const p of [...epp.spec.ports, ...peer.spec.ports]) expect(containerPorts).toContain(p.targetPort as string);
    });

    test(`${k}: RBAC gives the EPP read-only pods, endpointslices and inferencepools, and Leases for KV discovery`, () => {
      const objs = render(k);
      const saOf = (binding: KubeObject) => ((binding.subjects as { kind: string; name: string; namespace?: string }[]) ?? []).map((s) => `${s.kind}/${s.namespace}/${s.name}`);
      const eppSa = find<Workload>(objs, "Deployment", "dynamo-epp").spec.template.spec.serviceAccountName!;
      find(objs, "ServiceAccount", eppSa);
      const rolesOf = (sa: string) =>
        objs
          .filter((o) => o.kind === "RoleBinding" && saOf(o).includes(`ServiceAccount/${NS}/${sa}`))
          .map((b) => find(objs, "Role", (b.roleRef as { name: string }).name));
      const can = rbacAuthorizer(rolesOf(eppSa));
      const read = ["get", "list", "watch"];
      const writes = ["create", "update", "patch", "delete", "deletecollection"];
      for (const [group, plural] of [["", "pods"], ["discovery.k8s.io", "endpointslices"], ["inference.networking.k8s.io", "inferencepools"]] as const) {
        for (const verb of read) expect([plural, verb, can({ group, plural, verb })]).toEqual([plural, verb, true]);
        for (const verb of writes) expect([plural, verb, can({ group, plural, verb })]).toEqual([plural, verb, false]);
      }
      const leaseVerbs = intentsLeaseVerbs();
      for (const verb of leaseVerbs) expect(["leases", verb, can({ group: "coordination.k8s.io", plural: "leases", verb })]).toEqual(["leases", verb, true]);
      for (const [group, plural] of [["", "secrets"], ["", "configmaps"], ["apps", "deployments"]] as const) expect(can({ group, plural, verb: "get" })).toBe(false);
      // Workers (service account kv-worker, where the manifests run them) write their intents and read
      // the host record: Leases, the same verbs, and nothing else (no pods: the owner reference comes
      // from the downward API).
      const workerSa = objs.find((o) => o.kind === "ServiceAccount" && o.metadata?.name === "kv-worker");
      expect(workerSa).toBeDefined();
      const worker = rbacAuthorizer(rolesOf("kv-worker"));
      for (const verb of leaseVerbs) expect(["kv-worker leases", verb, worker({ group: "coordination.k8s.io", plural: "leases", verb })]).toEqual(["kv-worker leases", verb, true]);
      for (const [group, plural] of [["", "pods"], ["", "secrets"], ["", "configmaps"], ["discovery.k8s.io", "endpointslices"]] as const) {
        for (const verb of read) expect([plural, verb, worker({ group, plural, verb })]).toEqual([plural, verb, false]);
      }
    });

    test(`${k}: the InferencePool selects the model servers on 8000 and points at the EPP on 9002`, () => {
      const objs = render(k);
      const pool = find<KubeObject & { spec: { selector: { matchLabels: Record<string, string> }; targetPorts: { number: number }[]; endpointPickerRef: { name: string; kind?: string; port: { number: number } } } }>(
        objs,
        "InferencePool",
        "vllm-pool",
      );
      expect(pool.apiVersion).toBe("inference.networking.k8s.io/v1");
      expect(pool.spec.targetPorts).toEqual([{ number: 8000 }]);
      expect(pool.spec.endpointPickerRef.name).toBe("dynamo-epp");
      expect(pool.spec.endpointPickerRef.port.number).toBe(9002);
      expect(find<Service>(objs, "Service", "dynamo-epp").spec.ports.map((p) => p.port)).toContain(9002);
      const servers = objs.filter((o): o is Workload => o.kind === "Deployment" && selects(pool.spec.selector.matchLabels, (o as Workload).spec.template.metadata.labels));
      expect(servers.length).toBe(1);
      const ports = servers[0]!.spec.template.spec.containers[0]!.ports!.map((p) => p.containerPort);
      expect(ports).toContain(8000);
      expect(ports).toContain(5557);
    });
  }

  test("base: mock workers look like vLLM (labels, ports, KV events on tcp://*:5557)", () => {
    const d = find<Workload>(render("base"), "Deployment", "vllm-mock");
    expect(d.spec.template.metadata.labels.app).toBe("vllm");
    const c = d.spec.template.spec.containers[0]!;
    expect(c.command).toEqual(["mock-worker"]);
    expect(c.args).toContain("--kv-events=tcp://*:5557");
    expect(c.args).toContain("--port=8000");
    expect(portsOf(c)).toEqual({ http: 8000, "kv-events": 5557 });
  });

  test("base: mock workers register attachment intents as their pod, addressed to the EPP's KV host", () => {
    const objs = render("base");
    const d = find<Workload>(objs, "Deployment", "vllm-mock");
    const pod = d.spec.template.spec;
    expect(pod.serviceAccountName).toBe("kv-worker");
    find(objs, "ServiceAccount", "kv-worker");
    const env = envOf(pod.containers[0]!);
    expect(env.get("MOCK_WORKER_DISCOVERY")).toBe("kubernetes");
    // The intents' host is the one the EPP advertises.
    const epp = find<Workload>(objs, "Deployment", "dynamo-epp").spec.template.spec.containers.find((c) => c.name === "epp")!;
    expect(env.get("MOCK_WORKER_KV_HOST")).toBe(envOf(epp).get("DYN_EPP_KV_HOST")!);
    // Endpoints in the intents name the pod IP (the worker binds the wildcard).
    expect(env.get("MOCK_WORKER_ADVERTISE_HOST")).toBe("status.podIP");
    // Worker id = pod name, as pod discovery names the worker: the EPP merges both into one worker.
    expect(env.get("MOCK_WORKER_WORKER_ID")).toBe("metadata.name");
    // The Leases' owner (garbage collection with the pod) and namespace.
    expect(env.get("POD_NAME")).toBe("metadata.name");
    expect(env.get("POD_UID")).toBe("metadata.uid");
    expect(env.get("POD_NAMESPACE")).toBe("metadata.namespace");
  });

  test("base: the mock worker's environment variables are ones it reads", () => {
    const known = MOCK_WORKER_ENV;
    expect(known.has("MOCK_WORKER_DISCOVERY")).toBe(true);
    const c = find<Workload>(render("base"), "Deployment", "vllm-mock").spec.template.spec.containers[0]!;
    const unknown = [...envOf(c).keys()].filter((n) => !known.has(n) && !["POD_NAME", "POD_UID", "POD_NAMESPACE"].includes(n));
    expect(unknown).toEqual([]);
  });

  test("networkpolicy: the peer ports admit only peer EPP pods", () => {
    type Rule = { from?: { podSelector?: { matchLabels: Record<string, string> } }[]; ports?: { port: number }[] };
    const np = find<KubeObject & { spec: { podSelector: { matchLabels: Record<string, string> }; policyTypes: string[]; ingress: Rule[] } }>(
      render("overlays/networkpolicy"),
      "NetworkPolicy",
      "dynamo-epp-peer",
    );
    expect(np.spec.podSelector.matchLabels).toEqual(EPP_LABELS);
    expect(np.spec.policyTypes).toEqual(["Ingress"]);
    const admits = (port: number) => np.spec.ingress.filter((r) => !r.ports || r.ports.some((p) => p.port === port));
    for (const port of [9092, 9093]) {
      const rules = admits(port);
      expect(rules.length).toBeGreaterThan(0);
      for (const r of rules) {
        expect(r.from?.length).toBeGreaterThan(0);
        for (const f of r.from!) expect(f.podSelector?.matchLabels).toEqual(EPP_LABELS);
      }
    }
    for (const port of [9002, 9003]) expect(admits(port).some((r) => !r.from)).toBe(true);
  });

  test("a PodDisruptionBudget lets drains evict one EPP replica at a time", () => {
    const objs = render("base");
    const pdb = find<{ spec: { maxUnavailable: number; selector: { matchLabels: Record<string, string> } } }>(objs, "PodDisruptionBudget", "dynamo-epp");
    expect(pdb.spec.maxUnavailable).toBe(1);
    const epp = find<Workload>(objs, "Deployment", "dynamo-epp") as unknown as { spec: { template: { metadata: { labels: Record<string, string> } } } };
    for (const [k, v] of Object.entries(pdb.spec.selector.matchLabels)) expect(epp.spec.template.metadata.labels[k]).toBe(v);
  });

  test("vllm: real vLLM replaces the mock, publishing KV events over ZeroMQ on tcp://*:5557 with replay on 5558, where the EPP asks", () => {
    const objs = render("overlays/vllm");
    expect(objs.some((o) => o.metadata?.name === "vllm-mock")).toBe(false);
    const c = find<Workload>(objs, "Deployment", "vllm").spec.template.spec.containers[0]!;
    const args = c.args!;
    const cfg = JSON.parse(args[args.indexOf("--kv-events-config") + 1]!);
    expect(cfg).toEqual({ enable_kv_cache_events: true, publisher: "zmq", endpoint: "tcp://*:5557", replay_endpoint: "tcp://*:5558" });
    expect(c.ports).toContainEqual({ name: "kv-replay", containerPort: 5558 });
    expect(args).toContain("--block-size=16");
    // It registers no intents: no service account token (no Lease rights it would not use).
    const pod = find<Workload>(objs, "Deployment", "vllm").spec.template.spec as { automountServiceAccountToken?: boolean; serviceAccountName?: string };
    expect(pod.automountServiceAccountToken).toBe(false);
    expect(pod.serviceAccountName).toBeUndefined();
    const epp = find<Workload>(objs, "Deployment", "dynamo-epp").spec.template.spec.containers.find((x) => x.name === "epp")!;
    expect(envOf(epp).get("DYN_EPP_BLOCK_SIZE")).toBe("16");
    expect(envOf(epp).get("DYN_EPP_TOKENIZER_DIR")).toBe("/tokenizer");
    expect(envOf(epp).get("DYN_EPP_KV_REPLAY_PORT")).toBe("5558");
    expect(envOf(epp).get("POD_IP")).toBe("status.podIP"); // the patch merged env by name, it did not replace it
  });
});

describe("deploy/Dockerfile", () => {
  const text = readFileSync(join(DEPLOY, "Dockerfile"), "utf8");
  const stages = [...text.matchAll(/^FROM\s+(\S+)(?:\s+AS\s+(\S+))?/gim)].map((m) => ({ image: m[1]!, name: m[2] }));

  test("is multi-stage on the pinned Bun image", () => {
    expect(stages.length).toBeGreaterThanOrEqual(2);
    expect(text).toMatch(/^ARG BUN_IMAGE=oven\/bun:1\.4\.5$/m);
    for (const s of stages) expect(s.image).toBe("${BUN_IMAGE}");
  });

  test("builds the WASM index, installs production dependencies only, runs as non-root with its three entry points", () => {
    expect(text).toMatch(/index-wasm\/scripts\/build\.ts/);
    expect(text).toMatch(/bun install --frozen-lockfile --production/);
    const runtime = text.slice(text.lastIndexOf("\nFROM "));
    const user = /^USER\s+(\S+)/m.exec(runtime)?.[1];
    expect(user).toBeDefined();
    expect(["root", "0", "0:0"]).not.toContain(user!);
    expect(runtime).toMatch(/\/usr\/local\/bin\/epp/);
    expect(runtime).toMatch(/\/usr\/local\/bin\/mock-worker/);
    expect(runtime).toMatch(/\/usr\/local\/bin\/pd-sidecar/);
    expect(runtime).toMatch(/^CMD \["epp"\]$/m);
  });
});

describe("deploy/kind/e2e.sh", () => {
  test("says skipped and exits 0 where docker or kind is missing", () => {
    const r = Bun.spawnSync([Bun.which("bash")!, join(DEPLOY, "kind", "e2e.sh")], { env: { PATH: "/nonexistent" }, stdout: "pipe", stderr: "pipe" });
    expect(r.exitCode).toBe(0);
    expect(r.stdout.toString()).toMatch(/^skipped: /m);
  });
});
