// Runs the built image as deploy/base runs it and checks it serves: a mock worker and an EPP, each from
// the image's root filesystem through container.sh with its manifest's command, args and env (the pod's
// user, read-only root filesystem, /tmp emptyDir), on loopback addresses. The EPP must become Ready on
// gRPC health, route one ext_proc request over TLS to the mock, ingest the mock's KV events for it, and
// serve /metrics; the processes must run as the manifest's user, with the root read-only, no new
// privileges and no capabilities.
//
//   bun deploy/image/smoke.ts --rootfs DIR --image-config FILE   (FILE: `buildah inspect --type image` JSON)
//
// There is no API server here: the Kubernetes-mode switches of the manifests' env are left out and the
// EPP gets a static config naming the mock instead (mounted read-only under /tmp, as a ConfigMap would be).
import { mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { ExtProcClient } from "../../packages/epp/src/index.ts";
import { HealthProbe, podSpecFromTemplate, renderKustomization, spawnProcess, waitFor, type PodTemplate, type ProcessHandle } from "../../packages/testkit/src/index.ts";
import { EPP_RUNTIME_ENV } from "../../packages/epp/src/runtime-env.ts";

const ROOT = join(import.meta.dir, "..", "..");
const CONTAINER_SH = join(import.meta.dir, "container.sh");
/** Env that needs an API server (pool, peer and intent discovery): replaced by the static config. */
const KUBERNETES_MODE = new Set(["DYN_EPP_POOL_NAME", "DYN_EPP_PEER_SERVICE", "DYN_EPP_INTENT_DISCOVERY", "MOCK_WORKER_DISCOVERY"]);

const { values } = parseArgs({ options: { rootfs: { type: "string" }, "image-config": { type: "string" } } });
if (!values.rootfs || !values["image-config"]) throw new Error("usage: smoke.ts --rootfs DIR --image-config FILE");
const rootfs = values.rootfs;
type ImageConfig = { User?: string; Env?: string[]; WorkingDir?: string; Cmd?: string[] };
const image = (JSON.parse(readFileSync(values["image-config"], "utf8")) as { OCIv1: { config: ImageConfig } }).OCIv1.config;

type SecurityContext = { runAsUser?: number; runAsGroup?: number; readOnlyRootFilesystem?: boolean; allowPrivilegeEscalation?: boolean; capabilities?: { drop?: string[] } };
type Template = PodTemplate & {
  spec: PodTemplate["spec"] & {
    securityContext?: SecurityContext;
    volumes?: { name: string; emptyDir?: object }[];
    containers: (PodTemplate["spec"]["containers"][number] & { securityContext?: SecurityContext; volumeMounts?: { name: string; mountPath: string }[] })[];
  };
};
const objects = renderKustomization(join(ROOT, "deploy", "base"));
function templateOf(name: string): Template {
  const d = objects.find((o) => o.kind === "Deployment" && o.metadata?.name === name) as { spec: { template: Template } } | undefined;
  if (!d) throw new Error(`deploy/base has no Deployment ${name}`);
  return d.spec.template;
}

// A random third octet: runs on one machine (and the tests' fixed 127.0.x.y) never share an address.
const net = `127.77.${1 + Math.floor(Math.random() * 250)}`;
const workdir = mkdtempSync(join(tmpdir(), "kv-epp-image-smoke-"));
const running: ProcessHandle[] = [];

type Started = {
  proc: ProcessHandle;
  ip: string;
  spec: ReturnType<ReturnType<typeof podSpecFromTemplate>>;
  /** the container's args as the manifest gives them, wildcards made the pod's address */
  args: string[];
  sc: Required<Pick<SecurityContext, "runAsUser" | "runAsGroup">> & SecurityContext;
};

/** One pod of a Deployment in deploy/base, its container run from the image. */
function startPod(deployment: string, ip: string, extraEnv: Record<string, string>, files: [src: string, dst: string][] = []): Started {
  const template = templateOf(deployment);
  const c = template.spec.containers[0]!;
  const sc = { ...template.spec.securityContext, ...c.securityContext };
  if (sc.runAsUser === undefined || sc.runAsGroup === undefined) throw new Error(`${deployment}: no runAsUser/runAsGroup`);
  const emptyDirs = new Set((template.spec.volumes ?? []).filter((v) => v.emptyDir).map((v) => v.name));
  const tmpfs = (c.volumeMounts ?? []).filter((m) => emptyDirs.has(m.name)).map((m) => m.mountPath);
  const entry = c.command?.[0] ?? image.Cmd?.[0] ?? "";
  const spec = podSpecFromTemplate(template, { entrypoints: { [entry]: [entry] } })(`${deployment}-0`);
  const { cmd, args, env } = spec.command({ name: `${deployment}-0`, namespace: "kv-epp", ip, uid: crypto.randomUUID() });
  const podEnv: Record<string, string> = {};
  for (const kv of image.Env ?? []) podEnv[kv.slice(0, kv.indexOf("="))] = kv.slice(kv.indexOf("=") + 1);
  for (const [k, v] of Object.entries({ ...env, POD_IP: ip, ...extraEnv })) if (v !== undefined && !KUBERNETES_MODE.has(k)) podEnv[k] = v;
  const argv = [
    rootfs,
    "--user", `${sc.runAsUser}:${sc.runAsGroup}`,
    ...(sc.readOnlyRootFilesystem ? ["--read-only"] : []),
    ...tmpfs.flatMap((t) => ["--tmpfs", t]),
    ...files.flatMap(([src, dst]) => ["--file", `${src}:${dst}`]),
    "--workdir", image.WorkingDir || "/",
    ...Object.entries(podEnv).flatMap(([k, v]) => ["--env", `${k}=${v}`]),
    "--", cmd, ...args,
  ];
  const proc = spawnProcess(CONTAINER_SH, argv, { name: deployment, inheritEnv: ["PATH"] });
  running.push(proc);
  return { proc, ip, spec, args, sc: sc as Started["sc"] };
}

/** `wait`, failing at once when the pod's process exits first (a crash at start is not a slow start). */
function whileRunning<T>(s: Started, wait: Promise<T>): Promise<T> {
  const died = s.proc.exited.then((code) => {
    throw new Error(`${s.proc.name} exited (${code}) before it was ready`);
  });
  return Promise.race([wait, died]);
}

/** The image's `bun` process of a pod (container.sh leads the process group; bun is what it execs). */
function bunProcess(pgid: number): number | undefined {
  for (const d of readdirSync("/proc")) {
    if (!/^\d+$/.test(d)) continue;
    try {
      const stat = readFileSync(`/proc/${d}/stat`, "utf8");
      const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
      if (Number(fields[2]) === pgid && stat.includes("(bun)")) return Number(d);
    } catch {
      // gone meanwhile
    }
  }
  return undefined;
}

/** What the kernel says about the running process: its uid/gid, privileges and root mount. */
function checkConfinement(s: Started): string {
  const pid = bunProcess(s.proc.pid);
  if (pid === undefined) throw new Error(`${s.proc.name}: no bun process in the pod`);
  const status = readFileSync(`/proc/${pid}/status`, "utf8");
  const field = (k: string) => new RegExp(`^${k}:\\s*(.*)$`, "m").exec(status)?.[1]?.trim() ?? "";
  const uid = field("Uid").split(/\s+/)[0];
  const gid = field("Gid").split(/\s+/)[0];
  if (uid !== String(s.sc.runAsUser) || gid !== String(s.sc.runAsGroup)) throw new Error(`${s.proc.name}: runs as ${uid}:${gid}, the manifest says ${s.sc.runAsUser}:${s.sc.runAsGroup}`);
  if (field("NoNewPrivs") !== "1" && s.sc.allowPrivilegeEscalation === false) throw new Error(`${s.proc.name}: NoNewPrivs is not set`);
  if (!/^0+$/.test(field("CapEff")) || !/^0+$/.test(field("CapPrm"))) throw new Error(`${s.proc.name}: has capabilities (CapEff ${field("CapEff")})`);
  const rootMount = readFileSync(`/proc/${pid}/mountinfo`, "utf8").split("\n").map((l) => l.split(" ")).filter((f) => f[4] === "/").at(-1);
  const rootRo = rootMount?.[5]?.split(",").includes("ro") ?? false;
  if (s.sc.readOnlyRootFilesystem && !rootRo) throw new Error(`${s.proc.name}: the root filesystem is writable`);
  return `uid ${uid} gid ${gid}, root ${rootRo ? "read-only" : "writable"}, no new privileges, no capabilities`;
}

/** The runtime environment the EPP's process really has (its entry point sets it: packages/epp/src/runtime-env.ts). */
function checkRuntimeEnv(s: Started): string {
  const pid = bunProcess(s.proc.pid)!;
  const env = new Map(readFileSync(`/proc/${pid}/environ`, "utf8").split("\0").map((kv) => [kv.slice(0, kv.indexOf("=")), kv.slice(kv.indexOf("=") + 1)]));
  const set = Object.entries(EPP_RUNTIME_ENV).map(([k, v]) => {
    if (env.get(k) !== v) throw new Error(`${s.proc.name}: ${k} is ${JSON.stringify(env.get(k))}, the entry point sets ${JSON.stringify(v)}`);
    return `${k}=${v}`;
  });
  return set.join(" ");
}

async function main(): Promise<void> {
  if (!image.User || /^(0|root)(:|$)/.test(image.User)) throw new Error(`the image's USER is ${JSON.stringify(image.User)}: not a non-root user`);
  const t0 = performance.now();
  const since = () => `${((performance.now() - t0) / 1000).toFixed(1)} s`;

  const mock = startPod("vllm-mock", `${net}.1`, {});
  const mockHttp = mock.spec.ports?.find((p) => p.name === "http")?.containerPort ?? 8000;
  const mockKv = mock.spec.ports?.find((p) => p.name === "kv-events")?.containerPort ?? 5557;
  await whileRunning(mock, waitFor(async () => (await fetch(`http://${mock.ip}:${mockHttp}/v1/models`).catch(() => undefined))?.ok, { timeoutMs: 60_000, message: "the mock worker answers /v1/models" }));
  console.log(`smoke: mock worker ready at ${mock.ip}:${mockHttp} after ${since()} (${checkConfinement(mock)})`);

  const model = mock.args.find((a) => a.startsWith("--model="))?.slice("--model=".length) ?? "Qwen/Qwen3-0.6B";
  const configPath = join(workdir, "epp.yaml");
  writeFileSync(configPath, JSON.stringify({
    model,
    blockSize: 16,
    workers: [{ id: "vllm-mock-0", address: `${mock.ip}:${mockHttp}`, kvEvents: `tcp://${mock.ip}:${mockKv}` }],
  }));
  const epp = startPod("dynamo-epp", `${net}.2`, { DYN_EPP_CONFIG: "/tmp/config/epp.yaml", DYN_EPP_LISTEN: `${net}.2` }, [[configPath, "/tmp/config/epp.yaml"]]);
  const readiness = epp.spec.readiness;
  if (!readiness || typeof readiness !== "object" || !("grpc" in readiness)) throw new Error("the EPP's manifest has no gRPC readiness probe");
  const probe = new HealthProbe(`${epp.ip}:${readiness.grpc.port}`);
  try {
    await whileRunning(epp, waitFor(async () => (await probe.check(readiness.grpc.service ?? "")) === "SERVING", { timeoutMs: 90_000, intervalMs: 250, message: `the EPP's gRPC health (${readiness.grpc.service}) is SERVING` }));
  } finally {
    probe.close();
  }
  console.log(`smoke: EPP Ready (gRPC health ${readiness.grpc.port}, service ${readiness.grpc.service}) after ${since()} (${checkConfinement(epp)}; ${checkRuntimeEnv(epp)})`);

  const grpcPort = epp.spec.ports?.find((p) => p.name === "grpc")?.containerPort ?? 9002;
  const client = new ExtProcClient(`${epp.ip}:${grpcPort}`, "full-duplex", { tls: true });
  const body = new TextEncoder().encode(JSON.stringify({ model, messages: [{ role: "user", content: "What does a KV-cache-aware endpoint picker do? ".repeat(8) }], max_tokens: 4 }));
  const routed = await client.route("/v1/chat/completions", body);
  if (routed.endpoint !== `${mock.ip}:${mockHttp}`) throw new Error(`routed to ${routed.endpoint}, expected the mock at ${mock.ip}:${mockHttp}`);
  // Sent on to the chosen worker as a gateway would: its prefill publishes KV events to the EPP.
  const served = await fetch(`http://${routed.endpoint}/v1/chat/completions`, { method: "POST", headers: { "content-type": "application/json" }, body });
  await served.arrayBuffer();
  await routed.finish(served.status);
  console.log(`smoke: ext_proc over TLS routed to ${routed.endpoint} (pick ${routed.pickMs.toFixed(1)} ms), the worker answered ${served.status}`);

  const metricsPort = epp.spec.ports?.find((p) => p.name === "metrics")?.containerPort ?? 9090;
  const metric = (text: string, name: string) => Number(new RegExp(`^${name}(?:\\{[^}]*\\})? (\\S+)$`, "m").exec(text)?.[1] ?? NaN);
  const text = await waitFor(async () => {
    const t = await (await fetch(`http://${epp.ip}:${metricsPort}/metrics`)).text();
    return metric(t, "dynamo_epp_kv_events_applied_total") > 0 ? t : undefined;
  }, { timeoutMs: 30_000, message: "the EPP's /metrics counts the mock's KV events" });
  if (metric(text, "dynamo_epp_ready") !== 1) throw new Error("dynamo_epp_ready is not 1");
  if (!(metric(text, "dynamo_epp_requests_total") >= 1)) throw new Error("dynamo_epp_requests_total does not count the request");
  console.log(`smoke: /metrics on ${metricsPort}: dynamo_epp_ready 1, requests ${metric(text, "dynamo_epp_requests_total")}, KV events applied ${metric(text, "dynamo_epp_kv_events_applied_total")}, index blocks ${metric(text, "dynamo_epp_kv_index_blocks")}`);
}

let failed = false;
try {
  await main();
  console.log("smoke: passed");
} catch (err) {
  failed = true;
  console.error(`smoke: FAILED: ${(err as Error).message}`);
  for (const p of running) console.error(`--- ${p.name} (last lines)\n${p.lines.slice(-30).join("\n")}`);
} finally {
  await Promise.all(running.map((p) => p.kill("SIGTERM", 5000)));
  rmSync(workdir, { recursive: true, force: true });
}
process.exit(failed ? 1 : 0);
