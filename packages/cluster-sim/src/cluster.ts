// deploy/base, running in the cluster simulation: the rendered kustomization's InferencePool,
// Services, Roles and both Deployments, with the EPP and the mock worker as real processes, each pod
// on its own address in this test run's loopback range (LOOPBACK.5.x) with the standard ports. The fake API server holds each pod's client
// to the Roles its service account is bound to (the EPP's `dynamo-epp`, the workers' `kv-worker`),
// so a request the manifests do not grant fails the run.
import { join } from "node:path";
import {
  heldPorts,
  killAll,
  LOOPBACK,
  rbacAuthorizerFor,
  renderKustomization,
  SimCluster,
  simDeploymentFromManifest,
  simServiceFromManifest,
  startFakeKubeApi,
  waitFor,
  type FakeKubeApi,
  type KubeObject,
  type PodTemplate,
  type SimDeployment,
} from "@kv-epp/testkit";

export const REPO_ROOT = join(import.meta.dir, "..", "..", "..");
const DEPLOY_BASE = join(REPO_ROOT, "deploy", "base");

const EPP_DEPLOYMENT = "dynamo-epp";
const WORKER_DEPLOYMENT = "vllm-mock";
const KV_EVENTS_PORT = 5557;
// When another process holds 5557 on the wildcard address (a shared machine), the workers publish
// here instead and the EPPs are told so, both through their manifests' own knobs.
const FALLBACK_KV_EVENTS_PORT = 15557;
const EPP_PORTS = [9002, 9003, 9090, 9092, 9093];
const WORKER_PORTS = [8000];
// Addresses checked up front; the scenario runs 9 pods (2 workers, 7 EPP replicas over its steps).
const MAX_PODS = 16;

/** The readiness gate that holds replicas started together out of the EndpointSlices (see `coldStart`). */
const COLD_START_GATE = "kv-epp.dev/cold-start";

const byKindName = (objs: KubeObject[], kind: string, name: string): KubeObject => {
  const o = objs.find((x) => x.kind === kind && x.metadata?.name === name);
  if (!o) throw new Error(`${kind}/${name} is not in the rendered manifests`);
  return o;
};

const templateOf = (d: KubeObject) => (d as KubeObject & { spec: { template: PodTemplate } }).spec.template;

/** Edits the rendered objects so workers publish, and EPPs subscribe, on another KV-event port. */
function moveKvEventsPort(objs: KubeObject[], port: number): void {
  const worker = templateOf(byKindName(objs, "Deployment", WORKER_DEPLOYMENT)).spec.containers[0]!;
  worker.args = worker.args?.map((a) => a.replace(`:${KV_EVENTS_PORT}`, `:${port}`));
  for (const p of worker.ports ?? []) if (p.containerPort === KV_EVENTS_PORT) p.containerPort = port;
  const epp = templateOf(byKindName(objs, "Deployment", EPP_DEPLOYMENT)).spec.containers[0]!;
  const env = epp.env?.find((e) => e.name === "DYN_EPP_KV_EVENTS_PORT");
  if (!env) throw new Error("the EPP Deployment sets no DYN_EPP_KV_EVENTS_PORT");
  env.value = String(port);
}

/**
 * Every worker pod serves `n` API servers, one per DP rank (vLLM's external DP load balancing): the
 * InferencePool lists the ports 8000.. as its targetPorts, and the mock worker runs `n` ranks with
 * --rank-ports (rank r on 8000 + r, publishing on the KV port + r). The EPP's --dp-size stays 1:
 * one rank per target port.
 */
function spreadWorkersOverPorts(objs: KubeObject[], n: number): void {
  const pool = objs.find((o) => o.kind === "InferencePool") as KubeObject & { spec: { targetPorts: { number: number }[] } };
  const base = pool.spec.targetPorts[0]!.number;
  pool.spec.targetPorts = Array.from({ length: n }, (_, r) => ({ number: base + r }));
  const worker = templateOf(byKindName(objs, "Deployment", WORKER_DEPLOYMENT)).spec.containers[0]!;
  worker.args = [...(worker.args ?? []).filter((a) => !a.startsWith("--dp-size")), `--dp-size=${n}`, "--rank-ports=true"];
  for (let r = 1; r < n; r++) worker.ports = [...(worker.ports ?? []), { name: `http-${r}`, containerPort: base + r }];
}

export type SimulatedClusterOptions = {
  /** Target ports per worker pod, each its own API server and DP rank (default: as the manifests say, one). */
  targetPorts?: number;
  /** The kustomization to run (default deploy/base). */
  kustomization?: string;
  /** First host of the pods' addresses in LOOPBACK.5.0/24 (default 100: clear of the testkit's own tests). */
  firstHost?: number;
  /** Kubelet probe and EndpointSlice period (default 100 ms). */
  periodMs?: number;
};

/** Ends a test's cluster and gateway, then whatever process is left (SIGKILL): nothing outlives a test file. */
export async function tearDown(cluster: SimulatedCluster | undefined, gateway: { close(): void } | undefined): Promise<void> {
  gateway?.close();
  await cluster?.close();
  await killAll("SIGKILL", 0);
}

export class SimulatedCluster {
  /** The Deployment's pods as they are started from now on carry the cold-start readiness gate. */
  private gateNewEpps = false;

  private constructor(
    readonly api: FakeKubeApi,
    readonly sim: SimCluster,
    readonly namespace: string,
    readonly manifests: KubeObject[],
    readonly epps: SimDeployment,
    readonly workers: SimDeployment,
    readonly kvEventsPort: number,
  ) {}

  static async start(opts: SimulatedClusterOptions = {}): Promise<SimulatedCluster> {
    const objs = renderKustomization(opts.kustomization ?? DEPLOY_BASE);
    const eppDeployment = byKindName(objs, "Deployment", EPP_DEPLOYMENT);
    const workerDeployment = byKindName(objs, "Deployment", WORKER_DEPLOYMENT);
    const namespace = eppDeployment.metadata?.namespace ?? "default";

    const firstHost = opts.firstHost ?? 100;
    // An address no pod gets: what cannot be bound there is held on the wildcard address.
    const subnet = `${LOOPBACK}.5`;
    const probeIp = `${subnet}.${firstHost - 1}`;
    const ranks = opts.targetPorts ?? 1;
    if (ranks > 1) spreadWorkersOverPorts(objs, ranks);
    const workerPorts = Array.from({ length: ranks }, (_, r) => WORKER_PORTS[0]! + r);
    const held = await heldPorts(probeIp, [...EPP_PORTS, ...workerPorts]);
    if (held.length > 0) throw new Error(`ports ${held.join(", ")} are held on the wildcard address by another process: the simulated pods cannot bind them`);
    let kvEventsPort = KV_EVENTS_PORT;
    const kvPorts = (base: number) => Array.from({ length: ranks }, (_, r) => base + r);
    if ((await heldPorts(probeIp, kvPorts(KV_EVENTS_PORT))).length > 0) {
      kvEventsPort = FALLBACK_KV_EVENTS_PORT;
      if ((await heldPorts(probeIp, kvPorts(kvEventsPort))).length > 0) throw new Error(`ports ${KV_EVENTS_PORT} and ${kvEventsPort} are both held on the wildcard address by another process`);
      console.warn(`cluster-sim: port ${KV_EVENTS_PORT} is held on the wildcard address by another process; KV events use ${kvEventsPort}`);
      moveKvEventsPort(objs, kvEventsPort);
    }
    // A process left over from an interrupted run (a SIGKILLed test runner cannot clean up) would
    // hold a pod address's port.
    for (let h = firstHost; h < firstHost + MAX_PODS; h++) {
      const ip = `${subnet}.${h}`;
      const taken = await heldPorts(ip, [...EPP_PORTS, ...workerPorts, ...kvPorts(kvEventsPort)]);
      if (taken.length > 0) throw new Error(`${ip}: ports ${taken.join(", ")} are held (a process left over from an earlier run?)`);
    }

    const api = await startFakeKubeApi({ host: `${subnet}.1`, port: 0, namespace, authorize: rbacAuthorizerFor(objs) });
    const sim = new SimCluster(api, { namespace, ipPrefix: subnet, firstHost, periodMs: opts.periodMs ?? 100 });
    let workers: SimDeployment | undefined;
    try {
      for (const o of objs) {
        if (o.kind === "InferencePool") api.upsert(o);
        if (o.kind === "Service") {
          const selector = (o as KubeObject & { spec: { selector?: Record<string, string> } }).spec.selector ?? {};
          const target = [eppDeployment, workerDeployment].find((d) => Object.entries(selector).every(([k, v]) => templateOf(d).metadata?.labels?.[k] === v));
          sim.addService(simServiceFromManifest(o, target && templateOf(target)));
        }
      }

      // The image's entry points (deploy/Dockerfile). CLUSTER_SIM_EPP names another EPP script to run
      // the scenario against (e.g. a candidate fix kept outside the tree).
      const entrypoints = {
        epp: [process.execPath, process.env.CLUSTER_SIM_EPP ?? "packages/epp/src/main.ts"],
        "mock-worker": [process.execPath, "packages/mock-worker/src/main.ts"],
      };
      let cluster: SimulatedCluster | undefined;
      workers = simDeploymentFromManifest(sim, workerDeployment, { entrypoints, cwd: REPO_ROOT });
      const epps = simDeploymentFromManifest(sim, eppDeployment, {
        entrypoints,
        cwd: REPO_ROOT,
        // The EPP binds every server on DYN_EPP_LISTEN (default the wildcard): each pod gets its own IP.
        env: (pod) => ({ DYN_EPP_LISTEN: pod.ip }),
        extra: () => (cluster?.gateNewEpps ?? true ? { readinessGates: [COLD_START_GATE] } : {}),
      });
      cluster = new SimulatedCluster(api, sim, namespace, objs, epps, workers, kvEventsPort);
      cluster.gateNewEpps = true; // the first replicas start cold, together
      return cluster;
    } catch (err) {
      // Nothing may outlive a failed start: the test runner may go on with other files.
      workers?.stop();
      await sim.close();
      await api.close();
      throw err;
    }
  }

  ip(pod: string): string {
    const ip = this.api.get("Pod", this.namespace, pod)?.status as { podIP?: string } | undefined;
    if (!ip?.podIP) throw new Error(`pod ${pod} has no IP`);
    return ip.podIP;
  }

  /** Replicas started from now on are held unready by the cold-start gate until `coldStart` opens it. */
  holdNewEpps(on: boolean): void {
    this.gateNewEpps = on;
  }

  /**
   * Replicas that start together, cold: each must become SERVING on its own (its probe passing) while
   * every peer is still held out of the EndpointSlices, whatever their start-up speeds, which is
   * the deadlock the recovery rules forbid (a replica waiting for a peer that waits for it). Then
   * the gate opens and they turn Ready. Returns the pods.
   */
  async coldStart(count: number, timeoutMs = 60_000): Promise<string[]> {
    const pods = await waitFor(() => {
      const gated = this.epps.pods().filter((p) => this.sim.podState(p) === "running" && !this.sim.isReady(p));
      return gated.length === count ? gated : undefined;
    }, { timeoutMs, message: `${count} new EPP pods` });
    this.gateNewEpps = false;
    const tails = () => pods.map((p) => `--- ${p}:\n${this.sim.process(p).lines.slice(-15).join("\n")}`).join("\n");
    let exited: string | undefined;
    await waitFor(
      () => {
        exited = pods.find((p) => !this.sim.process(p).running);
        return exited !== undefined || pods.every((p) => this.sim.probePassing(p));
      },
      { timeoutMs, message: `${pods.join(", ")} SERVING on their own (no deadlock)` },
    ).catch((e) => {
      throw new Error(`${(e as Error).message}\n${tails()}`);
    });
    if (exited) throw new Error(`${exited} exited before it was SERVING\n${tails()}`);
    for (const p of pods) this.sim.setReadinessGate(p, COLD_START_GATE, true);
    await waitFor(() => pods.every((p) => this.sim.isReady(p)), { timeoutMs, message: `${pods.join(", ")} Ready` });
    return pods;
  }

  /**
   * Waits for `count` ready mock workers; a worker whose process exits meanwhile (a port taken after
   * the start-up check, a crash) fails the wait at once, with its last log lines.
   */
  async waitReadyWorkers(count: number, timeoutMs = 30_000): Promise<string[]> {
    let exited: string | undefined;
    await waitFor(
      () => {
        exited = this.workers.pods().find((p) => this.sim.podState(p) === "running" && !this.sim.process(p).running);
        return exited !== undefined || this.readyWorkers().length === count;
      },
      { timeoutMs, message: `${count} ready mock workers` },
    );
    if (exited) throw new Error(`${exited} exited before it was ready:\n${this.sim.process(exited).lines.slice(-15).join("\n")}`);
    return this.readyWorkers();
  }

  /** Ready, not terminating EPP pods as the peer Service's EndpointSlice lists them. */
  readyEpps(): string[] {
    return this.epps.readyPods().sort();
  }

  /** Addresses of the ready endpoints of a Service's EndpointSlice, as a gateway or kube-proxy uses them. */
  readyAddresses(service: string): string[] {
    const slice = this.api.get("EndpointSlice", this.namespace, `${service}-sim`) as
      | (KubeObject & { endpoints?: { addresses: string[]; conditions?: { ready?: boolean } }[] })
      | undefined;
    return (slice?.endpoints ?? []).filter((e) => e.conditions?.ready).flatMap((e) => e.addresses);
  }

  readyWorkers(): string[] {
    return this.workers.readyPods().sort();
  }

  async close(): Promise<void> {
    this.epps.stop();
    this.workers.stop();
    await this.sim.close();
    await this.api.close();
  }
}
