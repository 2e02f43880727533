// Process level: four mock workers, EPP replicas as processes, each "pod" on its own loopback
// address with the standard ports. The test plays the gateway: it asks a replica over ext_proc and
// holds the request in flight until it ends the ext_proc response phase.
//
// The measure of spread: at every pick, max / mean in-flight requests over the four workers (in-flight
// = routed by any replica and not released yet, counted by the test), averaged over the picks; and the
// share of picks that went to a worker with the fewest requests in flight. All prompts are distinct
// and equally long and ask for the same output, so the cost function ranks workers by in-flight load
// alone. The same seeded schedule (which request is released after which pick) runs three ways: one
// replica; two replicas alternating with replica-agg; two alternating without it. No clock decides
// anything: before each pick the test waits until the replica's own view of the load (GET /workers:
// its own requests, and with replica-agg its sibling's) is what the test knows it to be, so the
// comparison is of what each replica knows, not of how fast a loaded machine delivers it. (How fast
// a peer's load arrives and leaves is the third test's subject.)
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { killAll, seededRandom, spawnBun, waitFor, type ProcessHandle, LOOPBACK } from "@kv-epp/testkit";
import { body, checkHealth, extProcClient, headers, healthClient, scrapeMetric, setHeader, writeStaticConfig } from "./helpers.ts";

const ROOT = `${import.meta.dir}/../../..`;
const WORKERS = [`${LOOPBACK}.8.11`, `${LOOPBACK}.8.12`, `${LOOPBACK}.8.13`, `${LOOPBACK}.8.14`].map((ip, i) => ({ id: `worker-${i}`, ip, address: `${ip}:8000` }));
const KV_PORT = 15557;
// A and B share load; C and D are the same pair with replica-agg off.
const EPPS = { a: `${LOOPBACK}.8.2`, b: `${LOOPBACK}.8.3`, c: `${LOOPBACK}.8.4`, d: `${LOOPBACK}.8.5` } as const;
type EppName = keyof typeof EPPS;
const HEARTBEAT_MS = 300;
const TIMEOUT_MS = 1500;
const PICKS = 120;
const MAX_TOKENS = 16;
/** In flight at once: a seeded walk between these bounds, so the load rises and falls. */
const MIN_IN_FLIGHT = 4;
const MAX_IN_FLIGHT = 14;

const procs = new Map<string, ProcessHandle>();
const clients = new Map<EppName, ReturnType<typeof extProcClient>>();

function startEpp(name: EppName, peer: EppName, agg: boolean): ProcessHandle {
  const config = writeStaticConfig(
    WORKERS.map((w) => ({ id: w.id, address: w.address, kvEvents: `tcp://${w.ip}:${KV_PORT}` })),
    [`http://${EPPS[peer]}:9093`],
  );
  // The weights cost: it decides on the in-flight load replica-agg shares, which is what the spread
  // test measures. The latency cost decides on the prefill ahead, and these requests, never answered,
  // stop counting as prefill at their deadline (twice their predicted TTFT).
  const p = spawnBun(
    ["run", "epp", "--config", config, "--listen", EPPS[name], "--scrape-interval-ms", "0", "--cost", "weights", "--replica-agg", String(agg),
      "--replica-agg-heartbeat-ms", String(HEARTBEAT_MS), "--replica-agg-timeout-ms", String(TIMEOUT_MS)],
    {},
    { name: `epp-${name}`, cwd: ROOT },
  );
  procs.set(`epp-${name}`, p);
  return p;
}

async function ready(name: EppName): Promise<void> {
  const h = healthClient(9003, EPPS[name]);
  try {
    await waitFor(async () => (await checkHealth(h, "readiness").catch(() => "down")) === "SERVING", { message: `epp-${name} ready`, timeoutMs: 60_000 });
  } finally {
    h.close();
  }
  clients.get(name)?.close();
  clients.set(name, extProcClient(9002, EPPS[name]));
}

async function metric(name: EppName, metricName: string, labels = ""): Promise<number> {
  return (await scrapeMetric(`http://${EPPS[name]}:9090`, `${metricName}${labels}`)) ?? 0;
}

beforeAll(async () => {
  for (const w of WORKERS)
    procs.set(
      w.id,
      spawnBun(
        ["run", "mock-worker", "--listen", w.ip, "--port", "8000", "--kv-events", `tcp://${w.ip}:${KV_PORT}`, "--block-size", "16", "--speed", "1", "--model", "test-model"],
        { MOCK_WORKER_LOG_LEVEL: "warn" },
        { name: w.id, cwd: ROOT },
      ),
    );
  startEpp("a", "b", true);
  startEpp("b", "a", true);
  startEpp("c", "d", false);
  startEpp("d", "c", false);
  for (const w of WORKERS)
    await waitFor(() => fetch(`http://${w.address}/health`).then((r) => r.ok, () => false), { message: `${w.id} /health`, timeoutMs: 60_000 });
  for (const name of Object.keys(EPPS) as EppName[]) await ready(name);
  // Both agg replicas follow each other before anything is measured.
  for (const name of ["a", "b"] as const)
    await waitFor(async () => (await metric(name, "dynamo_epp_replica_agg_siblings_connected")) === 1, { message: `epp-${name} connected to its peer`, timeoutMs: 20_000 });
}, 120_000);

afterAll(async () => {
  for (const c of clients.values()) c.close();
  await killAll();
});

/** Routes one request over ext_proc: the chosen endpoint and the open stream (open = load held). */
async function route(name: EppName, prompt: number[], maxTokens: number) {
  const s = clients.get(name)!.open();
  s.send(headers());
  s.send(body({ model: "test-model", prompt, max_tokens: maxTokens }));
  const endpoint = setHeader((await s.next(15_000)).request_headers?.response, "x-gateway-destination-endpoint")!;
  await s.next(15_000); // the request body handed back
  return { endpoint, s };
}

type Spread = { meanMaxOverMean: number; leastLoadedPicks: number; picksPerWorker: number[] };
type Held = { replica: EppName; endpoint: string; s: Awaited<ReturnType<typeof route>>["s"] };

/** Ends a held request's response phase: its end releases the request's load in the replica (and its peers). */
function release(h: Held): void {
  h.s.send({ response_headers: { headers: { headers: [] }, end_of_stream: false } });
  h.s.send({ response_body: { body: new Uint8Array(0), end_of_stream: true } });
  h.s.end();
}

/** What `name` reports per worker address: its own requests in flight and its siblings'. */
async function loadView(name: EppName): Promise<Map<string, { own: number; sibling: number }>> {
  const rows = (await (await fetch(`http://${EPPS[name]}:9093/workers`)).json()) as { worker_id: string; active_requests: number; sibling_requests: number }[];
  const byId = new Map(WORKERS.map((w) => [w.id, w.address]));
  const view = new Map<string, { own: number; sibling: number }>();
  for (const r of rows) {
    const address = byId.get(r.worker_id)!;
    const v = view.get(address) ?? { own: 0, sibling: 0 };
    view.set(address, { own: v.own + r.active_requests, sibling: v.sibling + r.sibling_requests });
  }
  return view;
}

/** Waits until `name`'s view of the load is the held requests: its own, and (replica-agg) the others'. */
async function viewSettled(name: EppName, held: Held[], agg: boolean): Promise<void> {
  await waitFor(
    async () => {
      const view = await loadView(name);
      return WORKERS.every(({ address }) => {
        const own = held.filter((h) => h.endpoint === address && h.replica === name).length;
        const sibling = agg ? held.filter((h) => h.endpoint === address && h.replica !== name).length : 0;
        const v = view.get(address) ?? { own: 0, sibling: 0 };
        return v.own === own && v.sibling === sibling;
      });
    },
    { timeoutMs: 20_000, message: `epp-${name} sees the load in flight` },
  );
}

/**
 * Runs the seeded schedule through the replicas (pick i on replicas[i % n]); measures the spread.
 * Every run gets its own prompts (`promptSeed`): a prompt routed in an earlier run could be routed
 * back to the same worker by its prefix, whatever the load.
 */
async function runSchedule(replicas: EppName[], promptSeed: number, agg: boolean): Promise<Spread> {
  const rand = seededRandom(1);
  const promptRand = seededRandom(1000 + promptSeed);
  const held: Held[] = [];
  const picks = new Map(WORKERS.map((w) => [w.address, 0]));
  let ratioSum = 0;
  let leastLoaded = 0;
  let target = MIN_IN_FLIGHT;
  for (let i = 0; i < PICKS; i++) {
    const replica = replicas[i % replicas.length]!;
    await viewSettled(replica, held, agg);
    const prompt = Array.from({ length: 64 }, () => 1 + Math.floor(promptRand() * 50_000)); // 4 blocks, distinct
    const { endpoint, s } = await route(replica, prompt, MAX_TOKENS);
    const before = WORKERS.map((w) => held.filter((h) => h.endpoint === w.address).length);
    if (held.filter((h) => h.endpoint === endpoint).length === Math.min(...before)) leastLoaded++;
    held.push({ replica, endpoint, s });
    picks.set(endpoint, picks.get(endpoint)! + 1);
    const now = WORKERS.map((w) => held.filter((h) => h.endpoint === w.address).length);
    ratioSum += Math.max(...now) / (now.reduce((a, b) => a + b, 0) / now.length);
    // The seeded walk of the load: releases of seeded requests bring it down to the next target.
    target = Math.min(MAX_IN_FLIGHT, Math.max(MIN_IN_FLIGHT, target + Math.floor(rand() * 5) - 2));
    while (held.length > target) release(held.splice(Math.floor(rand() * held.length), 1)[0]!);
  }
  for (const h of held.splice(0)) release(h);
  for (const r of new Set(replicas)) await viewSettled(r, [], agg);
  return { meanMaxOverMean: ratioSum / PICKS, leastLoadedPicks: leastLoaded / PICKS, picksPerWorker: [...picks.values()] };
}

describe("replica-agg between two EPP processes", () => {
  test("with replica-agg, two replicas that have heard of each other's load spread picks as evenly as one replica taking all the traffic; without it, worse", async () => {
    const single = await runSchedule(["a"], 1, false);
    const receivedBefore = await metric("b", "dynamo_epp_replica_agg_messages_total", '{direction="received",kind="delta"}');
    const agg = await runSchedule(["a", "b"], 2, true);
    const noAgg = await runSchedule(["c", "d"], 3, false);
    const fmt = (s: Spread) => `max/mean ${s.meanMaxOverMean.toFixed(3)}, least-loaded picks ${(100 * s.leastLoadedPicks).toFixed(0)}%, picks ${s.picksPerWorker.join("/")}`;
    console.log(`spread over ${PICKS} picks: one replica: ${fmt(single)} | two, replica-agg: ${fmt(agg)} | two, no replica-agg: ${fmt(noAgg)}`);

    // The peers did talk during the agg run.
    expect(await metric("b", "dynamo_epp_replica_agg_messages_total", '{direction="received",kind="delta"}')).toBeGreaterThan(receivedBefore);
    // Knowing the whole load, a replica always picks a least-loaded worker: one replica, and each of two
    // sharing their load, alike.
    expect(single.leastLoadedPicks).toBe(1);
    expect(agg.leastLoadedPicks).toBe(1);
    // Two replicas that each know only their own half do not, and spread worse.
    expect(noAgg.leastLoadedPicks).toBeLessThan(1);
    expect(agg.meanMaxOverMean).toBeLessThan(noAgg.meanMaxOverMean);
  }, 180_000);

  test("a request routed by one replica counts as in flight with its prefix on the other: a sibling prompt follows it there before any KV event", async () => {
    /** Routes over ext_proc asking for the decision's explanation; the stream stays open (the request in flight). */
    const explained = async (name: EppName, prompt: number[]) => {
      const s = clients.get(name)!.open();
      const h = headers();
      h.request_headers!.headers!.headers!.push({ key: "x-kv-epp-explain", raw_value: new TextEncoder().encode("1") });
      s.send(h);
      s.send(body({ model: "test-model", prompt, max_tokens: 4 }));
      const routed = (await s.next(15_000)).request_headers?.response;
      await s.next(15_000);
      return { endpoint: setHeader(routed, "x-gateway-destination-endpoint")!, explanation: setHeader(routed, "x-kv-epp-decision")!, s };
    };
    const end = (s: Awaited<ReturnType<typeof explained>>["s"]) => {
      s.send({ response_headers: { headers: { headers: [] }, end_of_stream: false } });
      s.send({ response_body: { body: new Uint8Array(0), end_of_stream: true } });
      s.end();
    };
    const head = Array.from({ length: 128 }, (_, k) => 31_000 + k); // 8 blocks no worker has seen
    const sibling = [...head, ...Array.from({ length: 16 }, (_, k) => 32_000 + k)]; // + 1 block
    for (const [first, second, shared] of [["a", "b", true], ["c", "d", false]] as const) {
      const seed = shared ? 0 : 1;
      const p1 = head.map((t) => t + seed * 5000), p2 = sibling.map((t) => t + seed * 5000);
      // The first request is never sent to its worker: no KV event can tell anyone where it went.
      const one = await explained(first, p1);
      if (shared) await waitFor(async () => (await metric(second, "dynamo_epp_replica_agg_sibling_requests")) >= 1, { message: "the peer heard of the request", timeoutMs: 10_000 });
      const two = await explained(second, p2);
      if (shared) {
        // its 8 blocks pending there outweigh the peer's request load on that worker
        expect(two.endpoint).toBe(one.endpoint);
        expect(two.explanation).toMatch(/^chosen: worker=\S+ dp_rank=0 overlap=8\/9 /);
      } else expect(two.explanation).toMatch(/^chosen: worker=\S+ dp_rank=0 overlap=0\/9 /);
      end(one.s);
      end(two.s);
    }
  }, 60_000);

  test("a peer's load is dropped when it goes silent past the timeout, restored when it speaks again, dropped when it is killed; a restarted peer starts from zero", async () => {
    const held = [];
    for (let i = 0; i < 6; i++) held.push(await route("b", Array.from({ length: 64 }, (_, k) => 7000 + i * 100 + k), 5));
    const peerRequests = () => metric("a", "dynamo_epp_replica_agg_sibling_requests");
    await waitFor(async () => (await peerRequests()) === 6, { message: "epp-a sees epp-b's 6 requests", timeoutMs: 10_000 });
    const blocks = (await (await fetch(`http://${EPPS.a}:9093/workers`)).json()) as { sibling_blocks: number }[];
    expect(blocks.reduce((n, w) => n + w.sibling_blocks, 0)).toBe(6 * 4);

    // Frozen: the TCP session stays up, only the heartbeats stop.
    const b = procs.get("epp-b")!;
    const timeoutsBefore = await metric("a", "dynamo_epp_replica_agg_sibling_drops_total", '{reason="timeout"}');
    process.kill(-b.pid, "SIGSTOP");
    try {
      await waitFor(async () => (await peerRequests()) === 0, { message: "silent peer's load dropped", timeoutMs: TIMEOUT_MS + 10_000 });
      expect(await metric("a", "dynamo_epp_replica_agg_sibling_drops_total", '{reason="timeout"}')).toBe(timeoutsBefore + 1);
      expect(await metric("a", "dynamo_epp_replica_agg_siblings_connected")).toBe(1);
    } finally {
      process.kill(-b.pid, "SIGCONT");
    }
    await waitFor(async () => (await peerRequests()) === 6, { message: "load restored by the next snapshot", timeoutMs: 10_000 });

    // Killed: the session ends and the load goes with it.
    await b.kill("SIGKILL");
    await waitFor(async () => (await peerRequests()) === 0, { message: "killed peer's load dropped", timeoutMs: TIMEOUT_MS + 10_000 });
    await waitFor(async () => (await metric("a", "dynamo_epp_replica_agg_siblings_connected")) === 0, { message: "peer disconnected" });

    // Restarted on the same address: a new replica id, followed from zero.
    startEpp("b", "a", true);
    await ready("b");
    await waitFor(async () => (await metric("a", "dynamo_epp_replica_agg_siblings_connected")) === 1, { message: "restarted peer connected", timeoutMs: 20_000 });
    expect(await peerRequests()).toBe(0);
    const one = await route("b", Array.from({ length: 64 }, (_, k) => 9000 + k), 5);
    await waitFor(async () => (await peerRequests()) === 1, { message: "restarted peer's new request seen" });
    one.s.end();
    await waitFor(async () => (await peerRequests()) === 0, { message: "released request dropped from the peer's load" });
  }, 120_000);
});
