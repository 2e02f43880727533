// A worker's LoRA adapters as the picker reads them, end to end: a mock worker serving adapters exports
// vllm:lora_requests_info as vLLM does (every state it passed through, the newest by its value), and the EPP's
// WorkerSet scrapes it over HTTP into the rank's signals.
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
  const lora = () => {
    const c = set.candidates()[0];
    const l = c && set.signalsOf(c)?.lora;
    return l && { running: [...l.running], waiting: [...l.waiting], maxLora: l.maxLora };
  };

  // Idle: the engine reports LoRA on, no adapter in use; the mock holds every adapter it serves at once.
  await waitFor(() => lora() !== undefined, { message: "the first scrape" });
  expect(lora()).toEqual({ running: [], waiting: [], maxLora: 3 });

  const engine = w.ranks[0]!.engine;
  const hold = (adapter: string, loraId: number, first: number) => {
    const a = new AbortController();
    cleanup.push(() => a.abort());
    const prompt = Uint32Array.from({ length: 40 }, (_, i) => first + i);
    engine.start(prompt, 100_000, a.signal, { loraName: adapter, loraId }).catch(() => {});
  };
  hold("sql-lora", 1, 1);
  hold("chat-lora", 2, 1000);
  await waitFor(() => JSON.stringify(lora()) === JSON.stringify({ running: ["sql-lora"], waiting: ["chat-lora"], maxLora: 3 }), {
    message: `the running and waiting adapters (last seen ${JSON.stringify(lora())})`,
  });
  // The idle state is still exported beside the newest, as vLLM keeps every state: only the value tells them apart.
  const text = await (await fetch(metricsUrl)).text();
  const at = (labels: string) => Number(text.match(new RegExp(`^vllm:lora_requests_info\\{${labels}\\} (\\S+)$`, "m"))?.[1]);
  const idle = at('max_lora="3",running_lora_adapters="",waiting_lora_adapters=""');
  expect(at('max_lora="3",running_lora_adapters="sql-lora",waiting_lora_adapters="chat-lora"')).toBeGreaterThan(idle);
}, 20_000);
