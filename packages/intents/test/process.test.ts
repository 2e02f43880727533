// End to end with real processes: an HTTP-served discovery store, an EPP process (static mode, no
// configured workers, --intent-discovery) and a mock worker process with two DP ranks on ephemeral
// KV-event ports (--discovery): only the intents can tell the EPP where those ranks publish.
import { afterAll, afterEach, beforeAll, describe, expect, test } from "bun:test";
import { join } from "node:path";
import { freePort, killAll, spawnBun, waitFor, type ProcessHandle, LOOPBACK } from "@kv-epp/testkit";
import { serveDiscoveryStore, type DiscoveryServer } from "../src/index.ts";
import { complete, E2E_MODEL as MODEL, emptyEppConfig } from "./fixtures.ts";

const ROOT = join(import.meta.dir, "../../..");
const STORE_IP = `${LOOPBACK}.7.10`;
const EPP_IP = `${LOOPBACK}.7.11`;
const WORKER_IP = `${LOOPBACK}.7.12`;
const KV_HOST = "epp-proc";

type WorkerRow = { worker_id: string; dp_rank: number; kv_events: string; connected: boolean; blocks: number };

let store: DiscoveryServer;
beforeAll(() => {
  store = serveDiscoveryStore({ hostname: STORE_IP });
});
afterEach(() => killAll("SIGKILL", 1000));
afterAll(() => store.close());

async function startEppProcess(): Promise<{ proc: ProcessHandle; workers: () => Promise<WorkerRow[]> }> {
  const file = emptyEppConfig("intents-proc-");
  const selection = await freePort(EPP_IP);
  const ports = await Promise.all([1, 2, 3, 4].map(() => freePort(EPP_IP)));
  const proc = spawnBun(
    [
      join(ROOT, "packages/epp/src/main.ts"),
      `--config=${file}`,
      `--listen=${EPP_IP}`,
      `--selection-port=${selection}`,
      `--grpc-port=${ports[0]}`,
      `--grpc-health-port=${ports[1]}`,
      `--metrics-port=${ports[2]}`,
      `--replica-agg-port=${ports[3]}`,
      `--intent-discovery=${store.url}`,
      `--kv-host=${KV_HOST}`,
      "--scrape-interval-ms=0",
    ],
    {},
    { name: "epp" },
  );
  await proc.waitForLog(/EMPTY KV index|recovered/);
  return { proc, workers: async () => (await (await fetch(`http://${EPP_IP}:${selection}/workers`)).json()) as WorkerRow[] };
}

async function startWorkerProcess(): Promise<{ proc: ProcessHandle; url: string }> {
  const port = await freePort(WORKER_IP);
  const proc = spawnBun(
    [
      join(ROOT, "packages/mock-worker/src/main.ts"),
      `--listen=${WORKER_IP}`,
      `--port=${port}`,
      `--kv-events=tcp://${WORKER_IP}:0`,
      "--dp-size=2",
      "--speed=0",
      `--model=${MODEL}`,
      "--worker-id=mock-a",
      `--discovery=${store.url}`,
      `--kv-host=${KV_HOST}`,
    ],
    {},
    { name: "mock-worker" },
  );
  await proc.waitForLog(/intent registered.*"rank":1|"rank":1.*intent registered/);
  return { proc, url: `http://${WORKER_IP}:${port}` };
}

describe("intents across processes", () => {
  test("a mock worker with two DP ranks registers, the EPP attaches to both, the worker exits and the EPP detaches", async () => {
    const epp = await startEppProcess();
    const worker = await startWorkerProcess();
    const rows = await waitFor(async () => {
      const r = await epp.workers();
      return r.length === 2 && r.every((w) => w.connected) ? r : null;
    }, { message: "EPP connected to both ranks" });
    expect(rows.map((r) => [r.worker_id, r.dp_rank])).toEqual([
      ["mock-a", 0],
      ["mock-a", 1],
    ]);
    // Ephemeral ports: rank 1 is not at rank 0's port + 1, only its intent says where it is.
    expect(new Set(rows.map((r) => r.kv_events)).size).toBe(2);

    const prompt = "a prompt long enough to fill several blocks of sixteen tokens each, ".repeat(6);
    await complete(worker.url, 0, prompt);
    await complete(worker.url, 1, `${prompt} on the other rank`);
    await waitFor(async () => (await epp.workers()).every((w) => w.blocks > 0), { message: "blocks of both ranks indexed" });

    await worker.proc.kill("SIGTERM");
    await waitFor(async () => (await epp.workers()).length === 0, { message: "EPP detached after a clean exit" });
  });

  test("a worker process killed outright is detached when its lease stream drops", async () => {
    const epp = await startEppProcess();
    const worker = await startWorkerProcess();
    await waitFor(async () => (await epp.workers()).length === 2);
    await worker.proc.kill("SIGKILL");
    await waitFor(async () => (await epp.workers()).length === 0, { message: "EPP detached after SIGKILL" });
  });
});
