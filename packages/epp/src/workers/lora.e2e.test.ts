// A worker's LoRA adapters as the picker reads them, end to end: a mock worker serving adapters exports
// vllm:lora_requests_info as vLLM does (a state recorded at each engine step, every one it passed through, the
// newest by its value), and the EPP's WorkerSet scrapes it over HTTP into the rank's signals.
import { afterEach, expect, test } from "bun:test";
import { startMockWorker } from "@kv-epp/mock-worker";
import { waitFor, LOOPBACK } from "@kv-epp/testkit";
import pino from "pino";
import { createMetrics } from "../metrics.ts";
import { WorkerSet } from "./worker-set.ts";

const HOST = `${LOOPBACK}.4.197`;
const BLOCK = 16;
const ADAPTERS = ["sql-lora", "chat-lora", "code-lora"];
const cleanup: (() => Promise<unknown> | void)[] = [];
afterEach(async () => {
  for (const c of cleanup.splice(0).reverse()) await c();
});

test("the adapters a worker runs and queues reach the rank's signals from its /metrics", async () => {
  // One request runs at a time (max_num_seqs 1) and none ends: the first runs, the second waits.
  const w = await startMockWorker({
    listen: HOST, port: 0, kvEvents: `tcp://${HOST}:15557`, blockSize: BLOCK, capacityBlocks: 64, speed: 1, stepBaseMs: 20,
    maxNumSeqs: 1, loraModules: ADAPTERS, logLevel: "silent",
  });
  cleanup.push(() => w.close());
  const metricsUrl = `${w.url}/metrics`;
  const set = new WorkerSet({
    config: {
      workers: { mode: "static", list: [{ id: "w", address: w.url.slice("http://".length), kvEvents: w.ranks[0]!.kvEvents, dpSize: 1, dpStartRank: 0, kvEventsBind: false, metrics: metricsUrl }] },
      intents: undefined,
      kvTopic: "",
      kvHeartbeatMs: 0,
      scrapeIntervalMs: 10,
      model: { name: "m", tenant: "", blockSize: BLOCK, loraAdapters: ADAPTERS },
    },
    kube: () => {
      throw new Error("no Kubernetes in static mode");
    },
    metrics: createMetrics(),
    log: pino({ level: "silent" }),
  });
  const stop = new AbortController();
  cleanup.push(() => set.stop());
  cleanup.push(() => stop.abort());
  await set.start(stop.signal);
  const signals = () => {
    const c = set.candidates()[0];
    return c && set.signalsOf(c);
  };
  const lora = () => {
    const l = signals()?.lora;
    return l && { running: [...l.running], waiting: [...l.waiting], maxLora: l.maxLora };
  };

  // Scraped, but the engine has taken no step: vLLM has recorded no state yet, so none is reported.
  await waitFor(() => signals() !== undefined, { message: "the first scrape" });
  expect(lora()).toBeUndefined();

  const engine = w.ranks[0]!.engine;
  const stops: AbortController[] = [];
  const hold = (adapter: string, loraId: number, first: number) => {
    const a = new AbortController();
    stops.push(a);
    cleanup.push(() => a.abort());
    const prompt = Uint32Array.from({ length: 40 }, (_, i) => first + i);
    engine.start(prompt, 100_000, a.signal, { loraName: adapter, loraId }).catch(() => {});
  };
  hold("sql-lora", 1, 1);
  hold("chat-lora", 2, 1000);
  const busy = { running: ["sql-lora"], waiting: ["chat-lora"], maxLora: 3 };
  await waitFor(() => JSON.stringify(lora()) === JSON.stringify(busy), {
    message: `the running and waiting adapters (last seen ${JSON.stringify(lora())})`,
  });
  // Both end at once and the engine idles: it takes no step, so its last state stays the newest, as vLLM's does.
  for (const a of stops) a.abort();
  await waitFor(() => signals()?.waiting === 0, { message: "a scrape of the idle engine" });
  expect(engine.running + engine.waiting).toBe(0);
  expect(lora()).toEqual(busy);
}, 20_000);
