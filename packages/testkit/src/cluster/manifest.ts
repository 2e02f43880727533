// Runs rendered manifests in the cluster simulation: a Deployment's pod template becomes a
// SimPodSpec (the container runtime's part: command, args, env with the downward API, ports,
// readiness probe, preStop, grace period) and a Service becomes a SimService with its targetPorts
// resolved against the pods' named ports. What the template says is what runs, so the simulation
// tests the manifests themselves, not a hand-written copy of them.
import type { KubeObject } from "../kube/resources.ts";
import { SimDeployment, type SimDeploymentOptions } from "./deployment.ts";
import type { PodIdentity, Probe, SimCluster, SimPodSpec, SimService } from "./sim.ts";

type EnvVar = { name: string; value?: string; valueFrom?: { fieldRef?: { fieldPath: string } } & Record<string, unknown> };
type ProbeSpec = {
  grpc?: { port: number; service?: string };
  httpGet?: { path?: string; port: number | string };
  tcpSocket?: { port: number | string };
  exec?: unknown;
};
export type ContainerSpec = {
  name: string;
  image?: string;
  command?: string[];
  args?: string[];
  env?: EnvVar[];
  ports?: { name?: string; containerPort: number }[];
  readinessProbe?: ProbeSpec;
  lifecycle?: { preStop?: { exec?: { command: string[] }; sleep?: { seconds: number } } };
};
export type PodTemplate = {
  metadata?: { labels?: Record<string, string> };
  spec: { containers: ContainerSpec[]; terminationGracePeriodSeconds?: number; serviceAccountName?: string };
};
type DeploymentObject = KubeObject & { spec: { replicas?: number; template: PodTemplate } };
type ServiceObject = KubeObject & { spec: { selector?: Record<string, string>; ports: { name?: string; port: number; targetPort?: number | string }[] } };

export type ManifestRuntime = {
  /**
   * What each container command runs, as the image's entry points would: `command[0]` (or, without
   * a command, the image name) → argv prefix, e.g. `{ epp: [process.execPath, "packages/epp/src/main.ts"] }`.
   */
  entrypoints: Record<string, string[]>;
  /** Working directory of every process (the image's WORKDIR). */
  cwd?: string;
  /** Environment added after the manifest's, per pod (e.g. the listen address, see below). */
  env?: (pod: PodIdentity) => Record<string, string>;
  /** Which container of the template to run (default: the first). */
  container?: string;
  /** Extra fields for the SimPodSpec (e.g. readiness gates), per pod name. */
  extra?: (podName: string) => Partial<SimPodSpec>;
};

const DEFAULT_GRACE_S = 30;
// Kubernetes gives SIGTERM at least this long after a preStop hook that used up the grace period.
const MIN_GRACE_AFTER_PRESTOP_MS = 2000;

function fieldRef(path: string, pod: PodIdentity, sa: string | undefined): string {
  switch (path) {
    case "metadata.name":
      return pod.name;
    case "metadata.namespace":
      return pod.namespace;
    case "metadata.uid":
      return pod.uid;
    case "status.podIP":
      return pod.ip;
    case "status.hostIP":
      return "127.0.0.1";
    case "spec.nodeName":
      return "sim-node";
    case "spec.serviceAccountName":
      return sa ?? "default";
  }
  throw new Error(`fieldRef ${path} is not simulated`);
}

function resolveEnv(env: EnvVar[], pod: PodIdentity, sa: string | undefined): Record<string, string> {
  const out: Record<string, string> = {};
  for (const e of env) {
    if (e.value !== undefined) out[e.name] = expand(e.value, out);
    else if (e.valueFrom?.fieldRef) out[e.name] = fieldRef(e.valueFrom.fieldRef.fieldPath, pod, sa);
    else throw new Error(`env ${e.name}: only value and fieldRef are simulated`);
  }
  return out;
}

/** `$(VAR)` references in command, args and env values, as the kubelet expands them. */
function expand(s: string, env: Record<string, string>): string {
  return s.replace(/\$\(([A-Za-z_][A-Za-z0-9_]*)\)/g, (whole, name: string) => env[name] ?? whole);
}

/**
 * Every loopback pod shares the host's network namespace, so a wildcard bind would take the port on
 * every pod address at once: an argument naming the wildcard (`0.0.0.0`, `tcp://*:port`) is given
 * the pod's own IP instead. (A process that binds the wildcard by default must get its address
 * through `ManifestRuntime.env`.)
 */
function ownAddress(arg: string, ip: string): string {
  return arg.replace(/(^|[^\d.])0\.0\.0\.0(?![\d.])/g, `$1${ip}`).replace(/\/\/\*:/g, `//${ip}:`);
}

function containerPort(c: ContainerSpec, port: number | string): number {
  if (typeof port === "number") return port;
  if (/^\d+$/.test(port)) return Number(port);
  const p = c.ports?.find((x) => x.name === port);
  if (!p) throw new Error(`container ${c.name} has no port named ${port}`);
  return p.containerPort;
}

function readinessOf(c: ContainerSpec): Probe {
  const p = c.readinessProbe;
  if (!p) return "running";
  if (p.grpc) return { grpc: { port: p.grpc.port, service: p.grpc.service } };
  if (p.httpGet) return { http: { port: containerPort(c, p.httpGet.port), path: p.httpGet.path ?? "/" } };
  if (p.tcpSocket) return { tcp: { port: containerPort(c, p.tcpSocket.port) } };
  throw new Error(`container ${c.name}: only grpc, httpGet and tcpSocket readiness probes are simulated`);
}

function preStopMsOf(c: ContainerSpec): number {
  const hook = c.lifecycle?.preStop;
  if (!hook) return 0;
  if (hook.sleep) return hook.sleep.seconds * 1000;
  const cmd = hook.exec?.command ?? [];
  if (cmd.length === 2 && cmd[0] === "sleep" && /^\d+(\.\d+)?$/.test(cmd[1]!)) return Number(cmd[1]) * 1000;
  throw new Error(`container ${c.name}: only a "sleep N" preStop hook is simulated`);
}

/** The SimPodSpec (without name and labels) that runs one container of a pod template. */
export function podSpecFromTemplate(template: PodTemplate, rt: ManifestRuntime): (podName: string) => Omit<SimPodSpec, "name" | "labels"> {
  const c = rt.container ? template.spec.containers.find((x) => x.name === rt.container) : template.spec.containers[0];
  if (!c) throw new Error(`pod template has no container ${rt.container ?? ""}`);
  const entry = c.command?.[0] ?? c.image ?? "";
  const prefix = rt.entrypoints[entry];
  if (!prefix) throw new Error(`container ${c.name}: no entry point for ${JSON.stringify(entry)}`);
  // Checked once, up front: a template the simulation cannot run fails before any pod starts.
  const readiness = readinessOf(c);
  const preStopMs = preStopMsOf(c);
  const graceMs = (template.spec.terminationGracePeriodSeconds ?? DEFAULT_GRACE_S) * 1000;
  const sa = template.spec.serviceAccountName;
  return (podName) => ({
    command: (pod) => {
      const env = resolveEnv(c.env ?? [], pod, sa);
      const args = [...(c.command?.slice(1) ?? []), ...(c.args ?? [])].map((a) => ownAddress(expand(a, env), pod.ip));
      return { cmd: prefix[0]!, args: [...prefix.slice(1), ...args], env: { ...env, ...rt.env?.(pod) }, cwd: rt.cwd };
    },
    readiness,
    ports: (c.ports ?? []).map((p) => ({ name: p.name ?? String(p.containerPort), containerPort: p.containerPort })),
    preStopMs,
    serviceAccountName: sa,
    terminationGraceMs: Math.max(graceMs - preStopMs, MIN_GRACE_AFTER_PRESTOP_MS),
    ...rt.extra?.(podName),
  });
}

/** A SimDeployment running a rendered Deployment (replicas, template labels, the container). */
export function simDeploymentFromManifest(
  sim: SimCluster,
  deployment: KubeObject,
  rt: ManifestRuntime,
  opts: Partial<Omit<SimDeploymentOptions, "template">> = {},
): SimDeployment {
  const d = deployment as DeploymentObject;
  if (d.kind !== "Deployment") throw new Error(`expected a Deployment, got ${d.kind}`);
  return new SimDeployment(sim, {
    name: d.metadata?.name ?? "deployment",
    replicas: d.spec.replicas ?? 1,
    labels: d.spec.template.metadata?.labels ?? {},
    template: podSpecFromTemplate(d.spec.template, rt),
    ...opts,
  });
}

/** A rendered Service for `SimCluster.addService`; named targetPorts resolve against `template`'s containers. */
export function simServiceFromManifest(service: KubeObject, template?: PodTemplate): SimService {
  const s = service as ServiceObject;
  if (s.kind !== "Service") throw new Error(`expected a Service, got ${s.kind}`);
  const containers = template?.spec.containers ?? [];
  const target = (p: ServiceObject["spec"]["ports"][number]): number => {
    if (p.targetPort === undefined) return p.port;
    for (const c of containers) {
      try {
        return containerPort(c, p.targetPort);
      } catch {
        // the next container may name it
      }
    }
    if (typeof p.targetPort === "number") return p.targetPort;
    throw new Error(`Service ${s.metadata?.name}: targetPort ${p.targetPort} names no container port`);
  };
  return {
    name: s.metadata?.name ?? "service",
    selector: s.spec.selector ?? {},
    ports: s.spec.ports.map((p) => ({ name: p.name ?? String(p.port), port: p.port, targetPort: target(p) })),
  };
}
