// End to end, in process: a mock worker with two DP ranks registers its intents; an EPP (static mode,
// no configured workers) advertises itself as host and attaches a KV listener to both ranks; blocks
// stored on each rank reach its index; the worker exits and the EPP detaches. The glue between the
// IntentWatcher and the EPP's worker registry is the wiring proposed for packages/epp (see README).
import { afterEach, describe, expect, test } from "bun:test";
import { createServer } from "node:net";
import { parseConfig, startEpp, type EppHandle } from "@kv-epp/epp";
import { startMockWorker, type MockWorker } from "@kv-epp/mock-worker";
import { freePort, waitFor, LOOPBACK } from "@kv-epp/testkit";
import pino from "pino";
import { complete, E2E_MODEL as MODEL, emptyEppConfig } from "./fixtures.ts";
import { intentWorkers, MemoryDiscoveryStore, mergeWorkerSets, registerReportedIntents, registerWorkerIntents, startIntentHost, type IntentHost, type IntentOwner } from "../src/index.ts";

const HOST_INSTANCE = "epp-e2e";
const log = pino({ level: "silent" });

let cleanup: (() => Promise<unknown>)[] = [];
afterEach(async () => {
  for (const c of cleanup.reverse()) await c().catch(() => {});
  cleanup = [];
});

async function startStaticEpp(): Promise<EppHandle> {
  const file = emptyEppConfig("intents-e2e-");
  const ports = ["--grpc-port", "0", "--grpc-health-port", "0", "--metrics-port", "0", "--replica-agg-port", "0", "--selection-port", "0"];
  const cfg = parseConfig(["--config", file, "--listen", `${LOOPBACK}.7.3`, ...ports, "--scrape-interval-ms", "0", "--log-level", "silent"], {});
  const epp = await startEpp(cfg, { log });
  cleanup.push(() => epp.stop({ graceMs: 100 }));
  await epp.ready;
  return epp;
}

/** What packages/epp wires beside pod discovery: intents (and pods, none here) → one worker set. */
async function attachIntents(epp: EppHandle, store: MemoryDiscoveryStore): Promise<IntentHost> {
  const host = await startIntentHost({
    discovery: store.connect({ producer: "epp-proc" }),
    hostInstance: HOST_INSTANCE,
    onChange: (desired) => epp.workers.reconcile(mergeWorkerSets([], intentWorkers(desired)).workers),
  });
  cleanup.push(() => host.stop());
  return host;
}

const canBind = (host: string, port: number) =>
  new Promise<boolean>((resolve) => {
    const srv = createServer();
    srv.once("error", () => resolve(false));
    srv.listen(port, host, () => srv.close(() => resolve(true)));
  });

/** p and p + 1 both free on `host`: the EPP's registry still derives rank r's port as port + r. */
async function freePortPair(host: string): Promise<number> {
  for (;;) {
    const p = await freePort(host);
    if (p < 65535 && (await canBind(host, p + 1))) return p;
  }
}

async function startWorker(store: MemoryDiscoveryStore, producer: string): Promise<{ worker: MockWorker; owner: IntentOwner; discovery: ReturnType<MemoryDiscoveryStore["connect"]> }> {
  const kvPort = await freePortPair(`${LOOPBACK}.7.4`);
  const worker = await startMockWorker({ listen: `${LOOPBACK}.7.4`, port: 0, kvEvents: `tcp://${LOOPBACK}.7.4:${kvPort}`, dpSize: 2, blockSize: 16, speed: 0, model: MODEL, workerId: "mock-a", logger: log });
  cleanup.push(() => worker.close());
  const discovery = store.connect({ producer });
  const owner = await registerWorkerIntents({
    discovery,
    workerId: "mock-a",
    controlTarget: HOST_INSTANCE,
    model: MODEL,
    blockSize: 16,
    topic: worker.config.topic,
    ranks: worker.ranks,
    address: new URL(worker.url).host,
    log,
  });
  cleanup.push(() => owner.close());
  return { worker, owner, discovery };
}

type WorkerRow = { worker_id: string; dp_rank: number; connected: boolean; blocks: number };
const workersOf = async (epp: EppHandle): Promise<WorkerRow[]> => (await (await fetch(`http://${LOOPBACK}.7.3:${epp.ports.selection}/workers`)).json()) as WorkerRow[];

/**
 * Prompts to each of `ranks` of `workerId` until the EPP's index holds blocks of each. What a PUB sends before a
 * subscriber's SUBSCRIBE has reached it is lost (`connected` is the handshake, which comes first), so one
 * prompt a rank could be published into nothing; each retry is a new prompt, so its events are new too.
 */
async function blocksOfRanks(epp: EppHandle, worker: MockWorker, workerId: string, ranks: number[], prompt: string): Promise<void> {
  let attempt = 0;
  await waitFor(async () => {
    const rows = (await workersOf(epp)).filter((r) => r.worker_id === workerId);
    const missing = ranks.filter((rank) => !rows.some((r) => r.dp_rank === rank && r.connected && r.blocks > 0));
    if (missing.length === 0) return true;
    attempt++;
    for (const rank of missing) await complete(worker.url, rank, `${prompt} (rank ${rank}, attempt ${attempt})`);
    await Bun.sleep(50);
    return false;
  }, { message: `blocks of ${workerId}'s ranks ${ranks.join(", ")} in the EPP's index` });
}

describe("intents end to end: mock worker → discovery → EPP", () => {
  test("two DP ranks register, the EPP attaches to both and indexes their blocks, the worker exits and the EPP detaches", async () => {
    const store = new MemoryDiscoveryStore();
    const epp = await startStaticEpp();
    await attachIntents(epp, store);
    expect(epp.workers.specs()).toEqual([]);

    const { worker, owner } = await startWorker(store, "mock-proc");
    expect(owner.managedRanks()).toEqual([0, 1]);
    await waitFor(() => epp.workers.connected("mock-a", 0) && epp.workers.connected("mock-a", 1), { message: "EPP connected to both ranks" });
    expect(epp.workers.specs().map((s) => [s.id, s.address, s.dpSize])).toEqual([["mock-a", new URL(worker.url).host, 2]]);

    await blocksOfRanks(epp, worker, "mock-a", [0, 1], "the quick brown fox jumps over the lazy dog ".repeat(12));
    expect((await workersOf(epp)).length).toBe(2);

    // The worker exits cleanly: intents withdrawn, then its process goes.
    await owner.close();
    await worker.close();
    await waitFor(() => epp.workers.specs().length === 0, { message: "EPP detached" });
    expect(await workersOf(epp)).toEqual([]);
  });

  test("a worker that dies without withdrawing is detached when its lease ends", async () => {
    const store = new MemoryDiscoveryStore();
    const epp = await startStaticEpp();
    await attachIntents(epp, store);
    const { worker } = await startWorker(store, "mock-proc-2");
    // Connected first: a KvEventPublisher closed while a subscriber is mid-handshake hangs (kv-events).
    await waitFor(() => epp.workers.connected("mock-a", 0) && epp.workers.connected("mock-a", 1));
    await worker.close();
    store.expire("mock-proc-2"); // the process is gone: its lease (pod, HTTP stream) ends
    await waitFor(() => epp.workers.specs().length === 0, { message: "EPP detached" });
  });
});

describe("intents beside pod discovery (kubernetes mode of the merge)", () => {
  test("a worker registered under another id is its pod's one worker; when its pod is no longer Ready it leaves, intent or not", async () => {
    const store = new MemoryDiscoveryStore();
    const epp = await startStaticEpp();
    // Pod discovery as the EPP's informer hands it over (Ready pods), here driven by the test.
    let pods: { id: string; address: string; kvEvents: string; dpSize: number; metricsUrl: string }[] = [];
    let intents: ReturnType<typeof intentWorkers> = [];
    const reconcile = () => epp.workers.reconcile(mergeWorkerSets(pods, intents, { mode: "kubernetes" }).workers);
    const host = await startIntentHost({
      discovery: store.connect({ producer: "epp-proc-k" }),
      hostInstance: HOST_INSTANCE,
      onChange: (desired) => {
        intents = intentWorkers(desired);
        reconcile();
      },
    });
    cleanup.push(() => host.stop());
    const { worker } = await startWorker(store, "mock-proc-k"); // registers as "mock-a"
    await waitFor(() => intents.length === 1, { message: "intent seen" });
    expect(epp.workers.specs()).toEqual([]); // no Ready pod for it: not routable, no listener
    const address = new URL(worker.url).host;
    // Its pod is Ready, named otherwise; pod discovery guesses a KV port the worker does not use.
    pods = [{ id: "vllm-pod-a", address, kvEvents: `tcp://${LOOPBACK}.7.4:1`, dpSize: 1, metricsUrl: `http://${address}/metrics` }];
    reconcile();
    await waitFor(() => epp.workers.connected("vllm-pod-a", 0) && epp.workers.connected("vllm-pod-a", 1), { message: "the pod's worker listens on both intent ranks" });
    expect(epp.workers.specs().map((s) => [s.id, s.dpSize])).toEqual([["vllm-pod-a", 2]]);
    await blocksOfRanks(epp, worker, "vllm-pod-a", [1], "a prompt long enough to fill a few blocks of sixteen tokens each ".repeat(4));
    expect((await workersOf(epp)).map((r) => r.worker_id)).toEqual(["vllm-pod-a", "vllm-pod-a"]);
    // The pod fails readiness (its process and intents live on): it leaves the worker set.
    pods = [];
    reconcile();
    expect(epp.workers.specs()).toEqual([]);
    expect(await workersOf(epp)).toEqual([]);
  });
});

describe("KV-event sources the worker reports: sidecar → discovery → EPP", () => {
  test("a worker whose ranks bound ephemeral ports (tcp://IP:0) is attached through the sources it reports (vLLM #55844)", async () => {
    const store = new MemoryDiscoveryStore();
    const epp = await startStaticEpp();
    await attachIntents(epp, store);
    // No port convention: each rank's publisher and replay socket take whatever port the OS gives.
    const worker = await startMockWorker({
      listen: `${LOOPBACK}.7.5`, port: 0, kvEvents: `tcp://${LOOPBACK}.7.5:0`, replay: `tcp://${LOOPBACK}.7.5:0`, dpSize: 2, blockSize: 16, speed: 0, model: MODEL, workerId: "mock-b", logger: log,
    });
    cleanup.push(() => worker.close());
    const ports = worker.ranks.map((r) => Number(r.kvEvents.split(":").at(-1)));
    expect(ports[1]).not.toBe(ports[0]! + 1);
    // The sidecar's job: read the worker's report, register one intent per rank.
    const { owner, reported } = await registerReportedIntents({
      from: worker.url, discovery: store.connect({ producer: "sidecar-b" }), workerId: "mock-b", controlTarget: HOST_INSTANCE,
      model: MODEL, blockSize: 16, address: new URL(worker.url).host, log,
    });
    cleanup.push(() => owner.close());
    expect(reported.sources.map((s) => [s.rank, s.kvEvents, s.replay])).toEqual(worker.ranks.map((r) => [r.rank, r.kvEvents, r.replay]));
    await waitFor(() => epp.workers.connected("mock-b", 0) && epp.workers.connected("mock-b", 1), { message: "EPP connected to both reported ports" });
    await blocksOfRanks(epp, worker, "mock-b", [0, 1], "a worker that reports where it publishes needs no port convention ".repeat(8));
    expect((await workersOf(epp)).length).toBe(2);
  });
});
