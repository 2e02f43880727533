// Process level: four mock workers, EPP replicas as processes, each "pod" on its own loopback
// address (127.0.8.x) with the standard ports. The test plays the gateway: it asks a replica over
// ext_proc, calls the chosen worker, and ends the ext_proc response phase when the worker has answered.
//
// The measure of spread: at every pick, max / mean in-flight requests over the four workers (in-flight
// = routed by any replica and not answered yet, counted by the test), averaged over the picks. All
// prompts are distinct and equally long, so the cost function ranks workers by in-flight load alone
// and one replica taking all the traffic always picks a least-loaded worker (also reported: the share of
// picks that went to a worker with the fewest requests in flight). The same seeded schedule
// (arrivals every GAP_MS, output lengths) is run three ways: one replica; two replicas alternating with
// replica-agg; two replicas alternating without it.
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
const GAP_MS = 40;

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

/**
 * Runs the seeded schedule through the replicas (request i to replicas[i % n]); measures the spread.
 * Every run gets its own prompts (`promptSeed`): a prompt a worker cached in an earlier run would be
 * routed back to it by the prefill term, whatever the load.
 */
async function runSchedule(replicas: EppName[], promptSeed: number): Promise<Spread> {
  const rand = seededRandom(1);
  const promptRand = seededRandom(1000 + promptSeed);
  const inflight = new Map(WORKERS.map((w) => [w.address, 0]));
  const picks = new Map(WORKERS.map((w) => [w.address, 0]));
  let ratioSum = 0;
  let leastLoaded = 0;
  const started = performance.now();
  const requests: Promise<void>[] = [];
  for (let i = 0; i < PICKS; i++) {
    const prompt = Array.from({ length: 64 }, () => 1 + Math.floor(promptRand() * 50_000)); // 4 blocks, distinct
    const maxTokens = 10 + Math.floor(rand() * 60); // 100-700 ms at --speed 1
    const wait = started + i * GAP_MS - performance.now();
    if (wait > 0) await Bun.sleep(wait);
    requests.push(
      (async () => {
        const { endpoint, s } = await route(replicas[i % replicas.length]!, prompt, maxTokens);
        const before = [...inflight.values()];
        if (inflight.get(endpoint)! === Math.min(...before)) leastLoaded++;
        inflight.set(endpoint, inflight.get(endpoint)! + 1);
        picks.set(endpoint, picks.get(endpoint)! + 1);
        const now = [...inflight.values()];
        ratioSum += Math.max(...now) / (now.reduce((a, b) => a + b, 0) / now.length);
        try {
          const res = await fetch(`http://${endpoint}/v1/completions`, {
            method: "POST",
            headers: { "content-type": "application/json" },
            body: JSON.stringify({ model: "test-model", prompt, max_tokens: maxTokens }),
          });
          await res.arrayBuffer();
        } finally {
          inflight.set(endpoint, inflight.get(endpoint)! - 1);
          // The response phase: its end releases the request's load in the replica (and its peers).
          s.send({ response_headers: { headers: { headers: [] }, end_of_stream: false } });
          s.send({ response_body: { body: new Uint8Array(0), end_of_stream: true } });
          s.end();
        }
      })(),
    );
  }
  await Promise.all(requests);
  return { meanMaxOverMean: ratioSum / PICKS, leastLoadedPicks: leastLoaded / PICKS, picksPerWorker: [...picks.values()] };
}

describe("replica-agg between two EPP processes", () => {
  test("with replica-agg, two replicas spread picks as evenly as one replica taking all the traffic; without it, worse", async () => {
    const single = await runSchedule(["a"], 1);
    const receivedBefore = await metric("b", "dynamo_epp_replica_agg_messages_total", '{direction="received",kind="delta"}');
    const agg = await runSchedule(["a", "b"], 2);
    const noAgg = await runSchedule(["c", "d"], 3);
    const fmt = (s: Spread) => `max/mean ${s.meanMaxOverMean.toFixed(3)}, least-loaded picks ${(100 * s.leastLoadedPicks).toFixed(0)}%, picks ${s.picksPerWorker.join("/")}`;
    console.log(`spread over ${PICKS} picks: one replica: ${fmt(single)} | two, replica-agg: ${fmt(agg)} | two, no replica-agg: ${fmt(noAgg)}`);

    // The peers did talk during the agg run.
    expect(await metric("b", "dynamo_epp_replica_agg_messages_total", '{direction="received",kind="delta"}')).toBeGreaterThan(receivedBefore);
    // As even as one replica, within a tolerance for scheduling noise on a shared machine (picks on two
    // replicas can be concurrent; one replica serialises them)...
    expect(agg.meanMaxOverMean).toBeLessThanOrEqual(single.meanMaxOverMean + 0.08);
    // ...and not worse than two replicas that each know only their own half of the load.
    expect(agg.meanMaxOverMean).toBeLessThanOrEqual(noAgg.meanMaxOverMean + 0.02);
    expect(agg.leastLoadedPicks).toBeGreaterThanOrEqual(noAgg.leastLoadedPicks);
  }, 120_000);

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
