// The EPP's load view of an SGLang worker, end to end: a mock worker standing for SGLang (an SGLang
// --event-encoding: SGLang's scheduler gauges, no vLLM series) scraped over HTTP by the EPP's WorkerSet and
// WorkerMetricsScraper. Requests held running and queued on each DP rank show up as each rank's queue and
// KV pool, the server's running requests and its fullest rank's KV usage.
import { afterEach, expect, test } from "bun:test";
import { startMockWorker } from "@kv-epp/mock-worker";
import { waitFor, LOOPBACK } from "@kv-epp/testkit";
import pino from "pino";
import { createMetrics } from "../metrics.ts";
import { WorkerMetricsScraper } from "./worker-metrics.ts";
import { WorkerSet } from "./worker-set.ts";

const HOST = `${LOOPBACK}.4.190`;
const BLOCK = 16;
const quiet = pino({ level: "silent" });
const cleanup: (() => Promise<unknown> | void)[] = [];
afterEach(async () => {
  for (const c of cleanup.splice(0).reverse()) await c();
});

test("an SGLang worker's DP ranks are seen with their own queue and KV pool, and the server's running requests and KV usage", async () => {
  // One request runs per rank (max_num_seqs 1), the rest queue; steps are slow enough that none ends.
  const w = await startMockWorker({
    listen: HOST, port: 0, kvEvents: `tcp://${HOST}:15557`, eventEncoding: "sglang-map", dpSize: 2, blockSize: BLOCK,
    capacityBlocks: 64, speed: 1, stepBaseMs: 20, maxNumSeqs: 1, logLevel: "silent",
  });
  cleanup.push(() => w.close());
  const metricsUrl = `${w.url}/metrics`;
  const address = w.url.slice("http://".length);
  // What the EPP reads below can only come from SGLang's series.
  expect(await (await fetch(metricsUrl)).text()).not.toMatch(/^vllm:/m);

  const set = new WorkerSet({
    config: {
      workers: { mode: "static", list: [{ id: "sglang", address, kvEvents: w.ranks[0]!.kvEvents, dpSize: 2, dpStartRank: 0, kvEventsBind: false, metrics: metricsUrl }] },
      intents: undefined,
      kvTopic: "",
      kvHeartbeatMs: 0,
      scrapeIntervalMs: 10,
      model: { name: "m", tenant: "", blockSize: BLOCK, loraAdapters: [] },
    },
    kube: () => {
      throw new Error("no Kubernetes in static mode");
    },
    metrics: createMetrics(),
    log: quiet,
  });
  const stop = new AbortController();
  cleanup.push(() => set.stop());
  cleanup.push(() => stop.abort());
  await set.start(stop.signal);
  const scraper = new WorkerMetricsScraper({ intervalMs: 0, blockSize: () => BLOCK, onError: () => {} });
  scraper.setTargets([{ workerId: "sglang", endpoint: address, url: metricsUrl }]);

  // Requests placed on each rank's engine (what reaches the EPP is only the worker's /metrics).
  const [r0, r1] = w.ranks.map((r) => r.engine);
  const hold = (rank: number, promptTokens: number) => {
    const a = new AbortController();
    cleanup.push(() => a.abort());
    const prompt = Uint32Array.from({ length: promptTokens }, (_, i) => 1 + rank * 10_000 + i);
    w.ranks[rank]!.engine.start(prompt, 100_000, a.signal).catch(() => {});
  };
  hold(0, 100);
  hold(0, 40);
  hold(0, 40);
  hold(1, 300);
  await waitFor(() => r0!.running === 1 && r0!.waiting === 2 && r1!.running === 1, { message: "the requests admitted" });

  // Each rank as a candidate: its own queue and its pool of 64 blocks (1024 tokens of 16).
  await waitFor(() => {
    const cs = set.candidates();
    return cs.length === 2 && cs.map((c) => set.signalsOf(c)?.waiting).join() === "2,0";
  }, { message: "each rank's own queue" });
  expect(set.candidates().map((c) => c.dpRank)).toEqual([0, 1]);
  expect(set.candidates().map((c) => set.gpuBlocks(c))).toEqual([64, 64]);

  // The server's view: its running requests summed, its fullest rank's usage (the decodes grow it, so read
  // both sides until they meet).
  await waitFor(async () => {
    const usage = Math.max(...w.ranks.map((r) => r.cache.usage));
    await scraper.scrapeOnce();
    const m = scraper.get(address);
    if (m?.kvUsage !== usage) throw new Error(`scraped usage ${m?.kvUsage} vs the worker's ${usage}`);
    return true;
  }, { message: "the KV usage" });
  const m = scraper.get(address)!;
  expect([m.running, m.waiting, [...m.waitingByEngine]]).toEqual([2, 2, [[0, 2], [1, 0]]]);
  expect(m.kvUsage).toBeGreaterThanOrEqual(19 / 64);
  expect([...m.poolTokens!]).toEqual([[0, 1024], [1, 1024]]);
  expect([scraper.gpuBlocks("sglang", 0), scraper.gpuBlocks("sglang", 1)]).toEqual([64, 64]);
}, 20_000);
