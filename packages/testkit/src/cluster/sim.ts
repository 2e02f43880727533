// The cluster simulation's control plane: it plays the kubelet (runs each "pod" as a process bound to
// its own loopback IP, probes readiness, reflects it into the Pod's status, stops the process on
// deletion: preStop delay, SIGTERM, grace, SIGKILL) and the EndpointSlice controller (one slice per
// Service, recomputed from the pods on every tick: ready / serving / terminating). Everything it
// writes goes to the fake API server, so the processes under test see it through client-node.
import { connect } from "node:net";
import type { FakeKubeApi } from "../kube/server.ts";
import type { KubeObject } from "../kube/resources.ts";
import { parseLabelSelector } from "../kube/selectors.ts";
import { LOOPBACK } from "../loopback.ts";
import { heldPorts } from "../net.ts";
import { spawnProcess, type ProcessHandle } from "../process.ts";
import { HealthProbe } from "./grpc-health.ts";

const FINALIZER = "testkit.kv-epp.dev/kubelet";

/**
 * What a pod's process inherits of the test runner's environment: enough to run Bun, nothing that
 * configures the code under test. A container sees only its manifest's env; a whole-repo `bun test`
 * runs every package's tests in one process, and a variable an earlier test set (DYN_EPP_*,
 * MOCK_WORKER_*, KUBECONFIG, NODE_ENV=test, ...) must not reach the pods.
 */
export const POD_INHERITED_ENV = ["PATH", "HOME", "USER", "LOGNAME", "TMPDIR", "LANG", "LC_ALL", "TZ", "XDG_CACHE_HOME", "BUN_INSTALL", "BUN_INSTALL_CACHE_DIR", "BUN_RUNTIME_TRANSPILER_CACHE_PATH"] as const;

export type Probe =
  | { grpc: { port: number; service?: string } }
  | { http: { port: number; path: string } }
  | { tcp: { port: number } }
  | "running"; // ready as soon as the process runs

export type PodIdentity = { name: string; namespace: string; ip: string; uid: string };

export type SimPodSpec = {
  name: string;
  labels: Record<string, string>;
  /**
   * The process to run; it gets POD_IP, POD_NAME, POD_NAMESPACE, POD_UID and KUBECONFIG in its env
   * (a kubeconfig whose user is `system:serviceaccount:<namespace>:<serviceAccountName>` when set).
   */
  command: (pod: PodIdentity) => { cmd: string; args: string[]; env?: Record<string, string | undefined>; cwd?: string };
  readiness?: Probe;
  ports?: { name: string; containerPort: number }[];
  ip?: string; // default: the next free address of the cluster's range
  preStopMs?: number; // default 0
  terminationGraceMs?: number; // default 5000
  /**
   * Pod readiness gates (`spec.readinessGates`): condition types that must be True, besides the
   * probe, for the pod to be Ready. They start False; `SimCluster.setReadinessGate` sets them.
   */
  readinessGates?: string[];
  serviceAccountName?: string;
};

/** `targetPort` (default `port`) is the container port the EndpointSlice names, as a Service's targetPort resolves. */
export type SimService = { name: string; selector: Record<string, string>; ports: { name: string; port: number; targetPort?: number }[] };

type PodPhase = "Pending" | "Running" | "Succeeded" | "Failed";

type PodState =
  | { kind: "running" }
  | { kind: "terminating"; since: number }
  | { kind: "gone" };

class SimPod {
  /** The last readiness probe passed (the process's own view, gates aside). */
  probeOk = false;
  readonly gates: Map<string, boolean>;
  state: PodState = { kind: "running" };
  phase: PodPhase = "Running";
  private probing = false;
  private grpcProbe?: HealthProbe;
  readonly removed: Promise<void>;
  private markRemoved!: () => void;

  constructor(
    readonly spec: SimPodSpec,
    readonly identity: PodIdentity,
    readonly process: ProcessHandle,
  ) {
    this.removed = new Promise((r) => (this.markRemoved = r));
    this.gates = new Map((spec.readinessGates ?? []).map((g) => [g, false]));
    const probe = spec.readiness ?? "running";
    if (typeof probe === "object" && "grpc" in probe) this.grpcProbe = new HealthProbe(`${identity.ip}:${probe.grpc.port}`);
  }

  /** Ready as the kubelet reports it: probe passed, every readiness gate True, process running. */
  get ready(): boolean {
    return this.probeOk && this.process.running && [...this.gates.values()].every(Boolean);
  }

  /** One readiness probe; resolves to whether the pod's readiness (or its probe's result) changed. */
  async probe(): Promise<boolean> {
    const was = this.ready;
    const probed = this.probeOk;
    if (!this.process.running) this.probeOk = false;
    else if (!this.probing) {
      this.probing = true;
      try {
        this.probeOk = await probeOnce(this.spec.readiness ?? "running", this.identity.ip, this.grpcProbe);
      } finally {
        this.probing = false;
      }
    }
    return was !== this.ready || probed !== this.probeOk;
  }

  gone(): void {
    this.state = { kind: "gone" };
    this.probeOk = false;
    this.grpcProbe?.close();
    this.markRemoved();
  }
}

async function probeOnce(probe: Probe, ip: string, grpcProbe: HealthProbe | undefined): Promise<boolean> {
  if (probe === "running") return true;
  if ("grpc" in probe) return (await grpcProbe!.check(probe.grpc.service ?? "", 1000)) === "SERVING";
  if ("http" in probe) {
    try {
      const r = await fetch(`http://${ip}:${probe.http.port}${probe.http.path}`, { signal: AbortSignal.timeout(1000) });
      await r.arrayBuffer();
      return r.status >= 200 && r.status < 400;
    } catch {
      return false;
    }
  }
  return new Promise((resolve) => {
    const s = connect({ host: ip, port: probe.tcp.port });
    const done = (ok: boolean) => {
      s.destroy();
      resolve(ok);
    };
    s.once("connect", () => done(true));
    s.once("error", () => done(false));
    s.setTimeout(1000, () => done(false));
  });
}

export type SimClusterOptions = {
  namespace?: string; // default "default"
  /** First three octets of the pods' addresses, default `${LOOPBACK}.5` (in this test run's loopback range). */
  ipPrefix?: string;
  firstHost?: number; // default 2
  periodMs?: number; // probe and reconcile period, default 100
};

export class SimCluster {
  readonly namespace: string;
  private readonly pods = new Map<string, SimPod>();
  private readonly processes = new Map<string, ProcessHandle>(); // the last process run under each pod name
  private readonly services = new Map<string, SimService>();
  private readonly usedIps = new Set<string>();
  private nextHost: number;
  private readonly ipPrefix: string;
  private timer: ReturnType<typeof setInterval> | undefined;
  private ticking = false;
  private closed = false;

  constructor(
    readonly api: FakeKubeApi,
    opts: SimClusterOptions = {},
  ) {
    this.namespace = opts.namespace ?? "default";
    this.ipPrefix = opts.ipPrefix ?? `${LOOPBACK}.5`;
    this.nextHost = opts.firstHost ?? 2;
    this.timer = setInterval(() => void this.tick(), opts.periodMs ?? 100);
  }

  /** A fresh address in the cluster's range; addresses are not reused within one cluster. */
  allocateIp(): string {
    for (; this.nextHost < 255; this.nextHost++) {
      const ip = `${this.ipPrefix}.${this.nextHost}`;
      if (!this.usedIps.has(ip)) {
        this.usedIps.add(ip);
        this.nextHost++;
        return ip;
      }
    }
    throw new Error(`no free address left in ${this.ipPrefix}.0/24`);
  }

  /**
   * Fails at once, naming them, when fixed ports the next `count` pods will bind are held on their
   * addresses (or on the wildcard address, which Linux lets block every specific bind): a leftover
   * process from an interrupted run would otherwise surface as a pod that never turns ready.
   */
  async assertPortsFree(ports: readonly number[], count: number): Promise<void> {
    const problems: string[] = [];
    for (let h = this.nextHost, n = 0; h < 255 && n < count; h++) {
      const ip = `${this.ipPrefix}.${h}`;
      if (this.usedIps.has(ip)) continue;
      n++;
      const held = await heldPorts(ip, ports);
      if (held.length > 0) problems.push(`${ip}: ${held.join(", ")}`);
    }
    if (problems.length > 0) {
      throw new Error(`ports the simulated pods bind are held (on these addresses or the wildcard address; a process left over from an earlier run?): ${problems.join("; ")}`);
    }
  }

  /** Declares a Service: creates it and maintains its EndpointSlice from then on. */
  addService(svc: SimService): void {
    this.services.set(svc.name, svc);
    this.api.upsert({
      apiVersion: "v1",
      kind: "Service",
      metadata: { name: svc.name, namespace: this.namespace },
      spec: { selector: svc.selector, ports: svc.ports.map((p) => ({ name: p.name, port: p.port, targetPort: p.targetPort ?? p.port, protocol: "TCP" })) },
    });
    this.reconcileSlices();
  }

  /** Creates the Pod, starts its process and returns once both exist (not yet ready). */
  runPod(spec: SimPodSpec): PodIdentity {
    if (this.pods.has(spec.name)) throw new Error(`pod ${spec.name} already exists`);
    const ip = spec.ip ?? this.allocateIp();
    this.usedIps.add(ip);
    const created = this.api.upsert({
      apiVersion: "v1",
      kind: "Pod",
      metadata: { name: spec.name, namespace: this.namespace, labels: spec.labels, finalizers: [FINALIZER] },
      spec: {
        nodeName: "sim-node",
        serviceAccountName: spec.serviceAccountName ?? "default",
        containers: [{ name: "main", image: "sim", ports: spec.ports ?? [] }],
        readinessGates: (spec.readinessGates ?? []).map((conditionType) => ({ conditionType })),
      },
      status: { phase: "Pending" },
    });
    const identity: PodIdentity = { name: spec.name, namespace: this.namespace, ip, uid: created.metadata!.uid! };
    const c = spec.command(identity);
    const process = spawnProcess(c.cmd, c.args, {
      name: spec.name,
      cwd: c.cwd,
      inheritEnv: POD_INHERITED_ENV,
      env: {
        KUBECONFIG: spec.serviceAccountName ? this.api.kubeconfigFor(`system:serviceaccount:${this.namespace}:${spec.serviceAccountName}`) : this.api.kubeconfigPath,
        POD_IP: ip,
        POD_NAME: spec.name,
        POD_NAMESPACE: this.namespace,
        POD_UID: identity.uid,
        ...c.env,
      },
    });
    const pod = new SimPod(spec, identity, process);
    this.processes.set(spec.name, process);
    this.pods.set(spec.name, pod);
    void process.exited.then((code) => {
      if (pod.state.kind === "running") pod.phase = code === 0 ? "Succeeded" : "Failed";
      pod.probeOk = false;
      this.writePodStatus(pod);
      this.reconcileSlices();
    });
    this.writePodStatus(pod);
    return identity;
  }

  /** The process of the pod of that name (also after the pod is gone, for its logs). */
  process(name: string): ProcessHandle {
    const p = this.processes.get(name);
    if (!p) throw new Error(`no pod ${name} was run`);
    return p;
  }

  /** "running" (ready or not), "terminating" (deletion under way) or "gone". */
  podState(name: string): PodState["kind"] {
    return this.pods.get(name)?.state.kind ?? "gone";
  }

  isReady(name: string): boolean {
    return this.pods.get(name)?.ready ?? false;
  }

  /** The pod's last readiness probe passed (whatever its readiness gates say). */
  probePassing(name: string): boolean {
    return this.pods.get(name)?.probeOk ?? false;
  }

  /**
   * Sets a readiness gate's condition, as the controller owning that gate would. A test holds pods
   * out of the EndpointSlices with it, e.g. so that replicas started together cannot see each other
   * ready whatever their start-up speed.
   */
  setReadinessGate(name: string, conditionType: string, status: boolean): void {
    const pod = this.mustGet(name);
    if (!pod.gates.has(conditionType)) throw new Error(`pod ${name} has no readiness gate ${conditionType}`);
    pod.gates.set(conditionType, status);
    this.writePodStatus(pod);
    this.reconcileSlices();
  }

  /** Names of pods that exist (not yet removed), optionally only those matching a label selector. */
  podNames(selector?: string): string[] {
    const match = parseLabelSelector(selector);
    return [...this.pods.values()].filter((p) => p.state.kind !== "gone" && match({ metadata: { labels: p.spec.labels } })).map((p) => p.spec.name);
  }

  /**
   * Deletes a pod as `kubectl delete pod` does: the API marks it (deletionTimestamp), the
   * EndpointSlice turns it terminating, then preStop, SIGTERM, grace, SIGKILL, and the Pod object
   * goes. Resolves when the Pod is gone unless `wait` is false.
   */
  async deletePod(name: string, opts: { wait?: boolean } = {}): Promise<void> {
    const pod = this.mustGet(name);
    const current = this.api.get("Pod", this.namespace, name);
    if (current && !current.metadata?.deletionTimestamp) {
      current.metadata!.deletionTimestamp = new Date().toISOString();
      this.api.upsert(current);
    }
    this.beginTermination(pod);
    if (opts.wait !== false) await pod.removed;
  }

  private beginTermination(pod: SimPod): void {
    if (pod.state.kind !== "running") return;
    pod.state = { kind: "terminating", since: Date.now() };
    this.reconcileSlices();
    void (async () => {
      if (pod.spec.preStopMs) await Bun.sleep(pod.spec.preStopMs);
      await pod.process.kill("SIGTERM", pod.spec.terminationGraceMs ?? 5000);
      pod.gone();
      this.pods.delete(pod.spec.name);
      this.api.remove("Pod", this.namespace, pod.spec.name);
      this.reconcileSlices();
    })();
  }

  private mustGet(name: string): SimPod {
    const pod = this.pods.get(name);
    if (!pod) throw new Error(`no pod ${name}`);
    return pod;
  }

  private async tick(): Promise<void> {
    if (this.ticking || this.closed) return;
    this.ticking = true;
    try {
      const pods = [...this.pods.values()];
      // A delete through the API (not through deletePod) shows up as a deletionTimestamp.
      for (const pod of pods) {
        if (pod.state.kind === "running" && this.api.get("Pod", this.namespace, pod.spec.name)?.metadata?.deletionTimestamp) this.beginTermination(pod);
      }
      const changed = await Promise.all(pods.map((p) => (p.state.kind === "gone" ? false : p.probe())));
      pods.forEach((p, i) => {
        if (changed[i] && p.state.kind !== "gone") this.writePodStatus(p);
      });
      this.reconcileSlices();
    } finally {
      this.ticking = false;
    }
  }

  private writePodStatus(pod: SimPod): void {
    if (pod.state.kind === "gone" || this.closed) return;
    const current = this.api.get("Pod", this.namespace, pod.spec.name);
    if (!current) return;
    const ready = pod.ready ? "True" : "False";
    const status = {
      phase: pod.phase,
      podIP: pod.identity.ip,
      podIPs: [{ ip: pod.identity.ip }],
      hostIP: "127.0.0.1",
      startTime: current.metadata?.creationTimestamp,
      conditions: [
        { type: "PodScheduled", status: "True" },
        { type: "Initialized", status: "True" },
        ...[...pod.gates].map(([type, on]) => ({ type, status: on ? "True" : "False" })),
        { type: "ContainersReady", status: pod.probeOk && pod.process.running ? "True" : "False" },
        { type: "Ready", status: ready },
      ],
      containerStatuses: [{ name: "main", ready: pod.probeOk && pod.process.running, started: pod.process.running, restartCount: 0, image: "sim", imageID: "sim", state: pod.process.running ? { running: {} } : { terminated: { exitCode: 0 } } }],
    };
    if (JSON.stringify(current.status) === JSON.stringify(status)) return;
    this.api.upsert({ ...current, status });
  }

  /** The EndpointSlice controller: level-triggered, writes only when a slice's content changes. */
  private reconcileSlices(): void {
    if (this.closed) return;
    for (const svc of this.services.values()) {
      const endpoints = [...this.pods.values()]
        .filter((p) => p.state.kind !== "gone" && Object.entries(svc.selector).every(([k, v]) => p.spec.labels[k] === v))
        .sort((a, b) => a.spec.name.localeCompare(b.spec.name))
        .map((p) => {
          const terminating = p.state.kind === "terminating";
          return {
            addresses: [p.identity.ip],
            conditions: { ready: p.ready && !terminating, serving: p.ready, terminating },
            targetRef: { kind: "Pod", name: p.spec.name, namespace: this.namespace, uid: p.identity.uid },
            nodeName: "sim-node",
          };
        });
      const slice: KubeObject = {
        apiVersion: "discovery.k8s.io/v1",
        kind: "EndpointSlice",
        metadata: {
          name: `${svc.name}-sim`,
          namespace: this.namespace,
          labels: { "kubernetes.io/service-name": svc.name, "endpointslice.kubernetes.io/managed-by": "testkit.kv-epp.dev" },
        },
        addressType: "IPv4",
        endpoints,
        ports: svc.ports.map((p) => ({ name: p.name, port: p.targetPort ?? p.port, protocol: "TCP" })),
      };
      const current = this.api.get("EndpointSlice", this.namespace, `${svc.name}-sim`);
      if (current && JSON.stringify(current.endpoints) === JSON.stringify(endpoints) && JSON.stringify(current.ports) === JSON.stringify(slice.ports)) continue;
      this.api.upsert(slice);
    }
  }

  /** Stops the loop and kills every pod's process at once (no graceful termination). */
  async close(): Promise<void> {
    this.closed = true;
    clearInterval(this.timer);
    const pods = [...this.pods.values()];
    await Promise.all(pods.map((p) => p.process.kill("SIGKILL", 0)));
    for (const p of pods) p.gone();
    this.pods.clear();
  }
}
