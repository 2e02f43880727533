// The worker-health rule the WorkerSet owns, against a real /metrics server: a static worker whose
// /metrics fails DOWN_AFTER_FAILED_SCRAPES times in a row leaves the candidates (ranks() says why), and
// its next good scrape brings it back.
import { afterEach, expect, test } from "bun:test";
import { waitFor, LOOPBACK } from "@kv-epp/testkit";
import pino from "pino";
import { createMetrics } from "../metrics.ts";
import { DOWN_AFTER_FAILED_SCRAPES, WorkerSet } from "./worker-set.ts";

const HOST = `${LOOPBACK}.4.140`;
const quiet = pino({ level: "silent" });
const cleanup: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of cleanup.splice(0).reverse()) await c();
});

const VLLM_BODY = 'vllm:num_requests_waiting{engine="0"} 2\nvllm:num_requests_waiting{engine="1"} 5\n';

/** A vLLM (or, given its text, SGLang) /metrics stand-in that answers 200 or 500 as told. */
function metricsServer(body = VLLM_BODY) {
  const state = { ok: true, scrapes: 0 };
  const server = Bun.serve({
    hostname: HOST,
    port: 0,
    fetch: () => {
      state.scrapes++;
      return state.ok ? new Response(body) : new Response("down", { status: 500 });
    },
  });
  cleanup.push(() => server.stop(true));
  return { state, url: `http://${HOST}:${server.port}/metrics` };
}

function staticSet(metricsUrl: string) {
  const metrics = createMetrics();
  const set = new WorkerSet({
    config: {
      workers: { mode: "static", list: [{ id: "w", address: `${HOST}:8000`, kvEvents: `tcp://${HOST}:1`, dpSize: 2, dpStartRank: 0, kvEventsBind: false, metrics: metricsUrl }] },
      intents: undefined,
      kvTopic: "",
      kvHeartbeatMs: 0,
      scrapeIntervalMs: 10,
      model: { name: "m", tenant: "", blockSize: 16, loraAdapters: [] },
    },
    kube: () => {
      throw new Error("no Kubernetes in static mode");
    },
    metrics,
    log: quiet,
  });
  const stop = new AbortController();
  cleanup.push(() => set.stop());
  cleanup.push(() => stop.abort());
  return { set, metrics, listed: set.start(stop.signal) };
}

test("a static worker whose /metrics keeps failing is not routable, and says so, until a scrape answers again", async () => {
  const m = metricsServer();
  const { set, listed } = staticSet(m.url);
  await listed;
  await waitFor(() => set.candidates().length === 2 && set.signalsOf(set.candidates()[0]!) !== undefined, { message: "first scrape" });
  expect(set.candidates().map((c) => c.dpRank)).toEqual([0, 1]);
  // One API server fronts both engines: each rank is told its own engine's queue, not the server's sum.
  const [rank0] = set.candidates();
  expect(set.candidates().map((c) => set.signalsOf(c)?.waiting)).toEqual([2, 5]);
  expect(set.ranks().map((r) => [r.dpRank, r.routable, r.failedScrapes])).toEqual([[0, true, 0], [1, true, 0]]);

  m.state.ok = false;
  await waitFor(() => set.candidates().length === 0, { message: "worker down" });
  expect(set.ranks().every((r) => !r.routable && r.failedScrapes >= DOWN_AFTER_FAILED_SCRAPES)).toBe(true);
  expect(set.signalsOf(rank0!)).toBeUndefined();

  m.state.ok = true;
  await waitFor(() => set.candidates().length === 2, { message: "worker back up" });
  expect(set.ranks().map((r) => [r.routable, r.failedScrapes])).toEqual([[true, 0], [true, 0]]);
});

test("the scrape failures are counted, and the listed ranks' total is exported", async () => {
  const m = metricsServer();
  m.state.ok = false;
  const { set, metrics, listed } = staticSet(m.url);
  await listed;
  await waitFor(() => m.state.scrapes >= 2, { message: "two failed scrapes" });
  const text = await metrics.registry.metrics();
  expect(Number(/^dynamo_epp_worker_scrape_errors_total (\d+)/m.exec(text)?.[1])).toBeGreaterThanOrEqual(1);
  expect(text).toMatch(/^dynamo_epp_workers 2$/m);
  set.updateGauges();
  expect(await metrics.registry.metrics()).toMatch(/^dynamo_epp_kv_listeners_connected 0$/m);
});

test("an SGLang server's DP ranks are told their own queue and pool, and a full queue is seen", async () => {
  const line = (name: string, dp: number, v: string) => `${name}{dp_rank="${dp}",engine_type="unified",model_name="m",pp_rank="0",tp_rank="${dp}"} ${v}`;
  const body = [line("sglang:num_queue_reqs", 0, "9.0"), line("sglang:num_queue_reqs", 1, "4.0"), line("sglang:max_total_num_tokens", 0, "3200.0"), line("sglang:max_total_num_tokens", 1, "1600.0")].join("\n");
  const { set, listed } = staticSet(metricsServer(body).url);
  await listed;
  await waitFor(() => set.candidates().length === 2 && set.signalsOf(set.candidates()[0]!) !== undefined, { message: "first scrape" });
  expect(set.candidates().map((c) => set.signalsOf(c)?.waiting)).toEqual([9, 4]);
  expect(set.candidates().map((c) => set.gpuBlocks(c))).toEqual([200, 100]);
  // Every rank over the threshold: the queues are full (threshold 0: never).
  expect([set.queuesFull(0), set.queuesFull(3), set.queuesFull(4)]).toEqual([false, true, false]);
});

test("an SGLang pool is counted in the index's blocks, which the workers' events may have set, not in the configured size", async () => {
  const line = (name: string, dp: number, v: string) => `${name}{dp_rank="${dp}",engine_type="unified",model_name="m",pp_rank="0",tp_rank="${dp}"} ${v}`;
  const { set, listed } = staticSet(metricsServer([line("sglang:max_total_num_tokens", 0, "3200.0"), line("sglang:max_total_num_tokens", 1, "1600.0")].join("\n")).url);
  // Configured 16; SGLang started with --page-size 8, which its events showed the index.
  let indexBlockSize = 8;
  set.countPoolsIn(() => indexBlockSize);
  await listed;
  await waitFor(() => set.candidates().length === 2 && set.gpuBlocks(set.candidates()[1]!) !== undefined, { message: "first scrape" });
  expect(set.candidates().map((c) => set.gpuBlocks(c))).toEqual([400, 200]);
  // Counted when read: no scrape needs to come between the change and the next capacity check.
  indexBlockSize = 32;
  expect(set.candidates().map((c) => set.gpuBlocks(c))).toEqual([100, 50]);
});
