// The exact recovery handoff end to end: mock workers (two, two DP ranks each, small caches so stores
// evict) take requests without pause while replica B recovers from replica A's /dump; once the traffic
// stops, B's index equals A's and both equal the workers' caches, block for block and copy for copy.
// Then the same with a hole (B's subscriptions held back past its dump, repaired by replay), without a
// replay endpoint (the ranks dropped and counted), with a worker restarting mid-recovery or after the dump
// before B reaches it, and over three rounds of rolling replacement.
import { afterEach, expect, setDefaultTimeout, test } from "bun:test";
import { createServer, connect, type Socket } from "node:net";
import { startMockWorker, type MockWorker } from "@kv-epp/mock-worker";
import { waitFor, LOOPBACK } from "@kv-epp/testkit";
import { describeDiff, diffIndexViews, fetchIndexView, fetchWorkerTruth, type TruthWorker } from "./kv-truth.ts";
import type { EppHandle } from "../src/main.ts";
import { BLOCK, HOST, scrapeMetric, startTestEpp, type TestWorker } from "./helpers.ts";

setDefaultTimeout(60_000);

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

type Cluster = { mocks: MockWorker[]; truth: TruthWorker[]; direct: TestWorker[] };

/** Two mock workers with two ranks each on fixed ports (rank r on port + r, as the EPP expects). */
async function cluster(ip: string, opts: { replay?: boolean } = {}): Promise<Cluster> {
  const mocks: MockWorker[] = [];
  for (const [i, port] of [5557, 5567].entries()) {
    const m = await startMockWorker({
      listen: ip, port: 0, kvEvents: `tcp://${ip}:${port}`, replay: opts.replay === false ? undefined : `tcp://${ip}:${port + 100}`,
      speed: 0, blockSize: BLOCK, capacityBlocks: 48, dpSize: 2, logLevel: "silent", workerId: `w${i}`,
    });
    cleanups.push(() => m.close());
    mocks.push(m);
  }
  return {
    mocks,
    truth: mocks.map((m, i) => ({ id: `w${i}`, url: m.url })),
    direct: mocks.map((m, i) => ({
      id: `w${i}`, address: `${ip}:${8000 + i}`, kvEvents: `tcp://${ip}:${[5557, 5567][i]}`, dpSize: 2,
      ...(opts.replay === false ? {} : { replay: `tcp://${ip}:${[5657, 5667][i]}` }),
    })),
  };
}

/** Requests without pause (4 at a time) over random ranks and prompts with shared prefixes. */
function traffic(c: Cluster) {
  let running = true;
  let sent = 0;
  let seed = 1;
  const rnd = () => ((seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31);
  // A quarter of the requests repeat a recent one exactly: a prompt of whole blocks sent again caches a
  // second copy of its last block (vLLM does not deduplicate), so copy counts are in play.
  const recent: { m: MockWorker; rank: number; prompt: number[] }[] = [];
  const one = async () => {
    while (running) {
      let r = recent.length > 0 && rnd() < 0.25 ? recent[Math.floor(rnd() * recent.length)] : undefined;
      if (!r) {
        const prefix = Array.from({ length: BLOCK * 2 }, (_, i) => (Math.floor(rnd() * 6) * 1000 + i) % 50000);
        const tail = Array.from({ length: BLOCK * (1 + Math.floor(rnd() * 3)) }, () => Math.floor(rnd() * 50000));
        r = { m: c.mocks[Math.floor(rnd() * c.mocks.length)]!, rank: Math.floor(rnd() * 2), prompt: [...prefix, ...tail] };
        recent.push(r);
        if (recent.length > 8) recent.shift();
      }
      const res = await fetch(`${r.m.url}/v1/completions`, {
        method: "POST",
        headers: { "content-type": "application/json", "x-data-parallel-rank": String(r.rank) },
        body: JSON.stringify({ prompt: r.prompt, max_tokens: 1 }),
      });
      await res.arrayBuffer();
      sent++;
      await Bun.sleep(1);
    }
  };
  const loops = Array.from({ length: 4 }, one);
  return { sent: () => sent, stop: async () => ((running = false), await Promise.all(loops)) };
}

const selectionUrl = (e: EppHandle) => `http://${HOST}:${e.ports.selection}`;

type WorkerRow = { worker_id: string; dp_rank: number; connected: boolean; cursor: string | null; complete: boolean; handoff: string | null; replays: number; restarts: number; resets: number };
const workersOf = async (e: EppHandle) => (await (await fetch(`${selectionUrl(e)}/workers`)).json()) as WorkerRow[];

/** Once traffic stopped: every rank's cursor has reached the last batch the worker published. */
async function caughtUp(e: EppHandle, c: Cluster): Promise<void> {
  await waitFor(async () => {
    const { nextSeq } = await fetchWorkerTruth(c.truth);
    const rows = await workersOf(e);
    return rows.every((r) => r.cursor !== null && BigInt(r.cursor) === nextSeq.get(`${r.worker_id}/${r.dp_rank}`)! - 1n);
  }, { timeoutMs: 15_000, message: `replica on ${e.ports.selection} caught up with every rank` });
}

async function expectExact(c: Cluster, replicas: EppHandle[]): Promise<void> {
  for (const e of replicas) await caughtUp(e, c);
  const { view: truth } = await fetchWorkerTruth(c.truth);
  let blocks = 0;
  let copies = 0;
  for (const e of replicas) {
    const d = diffIndexViews(truth, await fetchIndexView(selectionUrl(e)));
    expect(d.equal, `replica on ${e.ports.selection}: ${describeDiff(d)}`).toBe(true);
    blocks = d.blocks;
    copies = d.copies;
    expect((await workersOf(e)).every((r) => r.complete)).toBe(true);
  }
  expect(blocks).toBeGreaterThan(50);
  // Some blocks are held twice (repeated prompts), and every replica agrees with the workers on each count.
  expect(copies).toBeGreaterThan(blocks);
}

/** A recovery peer in front of `upstream`: takes its dump at once, answers only after `holdMs`. */
function heldPeer(upstream: () => string, holdMs: number, ip: string) {
  let fetched = 0;
  const server = Bun.serve({
    hostname: ip,
    port: 0,
    fetch: async (req) => {
      const url = `${upstream()}/dump`;
      if (req.method === "HEAD") return fetch(url, { method: "HEAD" });
      const body = await (await fetch(url)).arrayBuffer();
      fetched++;
      await Bun.sleep(holdMs);
      return new Response(body, { headers: { "content-type": "application/json" } });
    },
  });
  cleanups.push(() => server.stop(true));
  return { url: `http://${ip}:${server.port}`, fetched: () => fetched };
}

/** TCP proxies on port and port + 1 that hold every connection until opened (a subscription held back). */
async function heldSubscriptions(ip: string, port: number, upstreamIp: string, upstreamPort: number) {
  let opened = false;
  const waiting: (() => void)[] = [];
  const sockets: Socket[] = [];
  const servers = await Promise.all(
    [0, 1].map(
      (r) =>
        new Promise<ReturnType<typeof createServer>>((resolve) => {
          const s = createServer((client) => {
            sockets.push(client);
            client.pause();
            const pipe = () => {
              const up = connect(upstreamPort + r, upstreamIp);
              sockets.push(up);
              up.on("error", () => client.destroy());
              client.on("error", () => up.destroy());
              client.pipe(up);
              up.pipe(client);
              client.resume();
            };
            if (opened) pipe();
            else waiting.push(pipe);
          });
          s.listen(port + r, ip, () => resolve(s));
        }),
    ),
  );
  cleanups.push(() => {
    for (const s of sockets) s.destroy();
    for (const s of servers) s.close();
  });
  return {
    open: () => {
      opened = true;
      for (const w of waiting.splice(0)) w();
    },
  };
}

/** The cluster on `ip`, replica A serving it, and requests under way. */
async function servingUnderLoad(ip: string) {
  const c = await cluster(ip);
  const a = await startTestEpp(c.direct);
  cleanups.push(() => a.stop({ graceMs: 200 }));
  const load = traffic(c);
  cleanups.push(() => load.stop());
  return { c, a, load };
}

/** The workers as B lists them: their PUB sockets reached through proxies on `proxyIp`, held until open(). */
async function heldWorkers(c: Cluster, ip: string, proxyIp: string) {
  const held = [await heldSubscriptions(proxyIp, 5557, ip, 5557), await heldSubscriptions(proxyIp, 5567, ip, 5567)];
  return { workers: c.direct.map((w) => ({ ...w, kvEvents: w.kvEvents.replace(ip, proxyIp) })), open: () => held.forEach((h) => h.open()) };
}

test("B recovers from A while workers publish without pause: both equal the workers' caches exactly", async () => {
  const { c, a, load } = await servingUnderLoad(`${LOOPBACK}.4.91`);
  await waitFor(() => load.sent() > 100, { message: "traffic under way" });
  // The dump is taken at once and delivered 400 ms later: B's buffer then overlaps it and runs past it.
  const peer = heldPeer(() => selectionUrl(a), 400, `${LOOPBACK}.4.92`);
  const b = await startTestEpp(c.direct, { peers: [peer.url] });
  cleanups.push(() => b.stop({ graceMs: 200 }));
  expect((await b.ready).kind).toBe("recovered");
  await waitFor(() => load.sent() > 400, { message: "traffic after B's recovery" });
  await load.stop();
  await expectExact(c, [a, b]);
  const outcome = (await (await fetch(`${selectionUrl(b)}/recovery`)).json()) as { outcome: { kind: string; events: number }; handoff: Record<string, number> };
  expect(outcome.outcome).toMatchObject({ kind: "recovered", peer: peer.url });
  // Every rank went on from the peer's cursor; none needed more than its own buffer.
  expect(outcome.handoff).toMatchObject({ exact: 4, dropped: 0, unknown: 0, pending: 0 });
  expect(await scrapeMetric(`http://${HOST}:${b.ports.metrics}`, 'dynamo_epp_kv_handoff_total{outcome="exact"}')).toBe(4);
  expect(await scrapeMetric(`http://${HOST}:${b.ports.metrics}`, "dynamo_epp_kv_recovery_events")).toBe(outcome.outcome.events);
});

test("a hole nobody buffered (B's subscriptions held back past its dump) is repaired by replay", async () => {
  const { c, a, load } = await servingUnderLoad(`${LOOPBACK}.4.93`);
  await waitFor(() => load.sent() > 100, { message: "traffic under way" });
  // B reaches the workers' PUB sockets only through proxies that open after its recovery.
  const held = await heldWorkers(c, `${LOOPBACK}.4.93`, `${LOOPBACK}.4.94`);
  const b = await startTestEpp(held.workers, { peers: [selectionUrl(a)], flags: ["--subscribe-wait-ms", "50"] });
  cleanups.push(() => b.stop({ graceMs: 200 }));
  expect((await b.ready).kind).toBe("recovered");
  const sentAtRecovery = load.sent();
  await waitFor(() => load.sent() > sentAtRecovery + 100, { message: "events B's listeners never see" });
  held.open();
  await waitFor(async () => (await workersOf(b)).every((r) => r.handoff === "replayed"), { message: "every rank's hole replayed" });
  await load.stop();
  await expectExact(c, [a, b]);
  expect(await scrapeMetric(`http://${HOST}:${b.ports.metrics}`, 'dynamo_epp_kv_handoff_total{outcome="replayed"}')).toBe(4);
});

test("without a replay endpoint the hole cannot be filled: the ranks' blocks are dropped, counted and not claimed complete", async () => {
  const c = await cluster(`${LOOPBACK}.4.95`, { replay: false });
  const a = await startTestEpp(c.direct);
  cleanups.push(() => a.stop({ graceMs: 200 }));
  // A's view must be complete to hand over. Without replay, a stream caught after its seq 0 is not (the
  // subscription lands a moment after the handshake): a cache reset (AllBlocksCleared) makes it so.
  await waitFor(async () => {
    for (const m of c.mocks) await fetch(`${m.url}/reset_prefix_cache`, { method: "POST" });
    await Bun.sleep(20);
    return (await workersOf(a)).every((r) => r.complete);
  }, { message: "A's view of every rank complete" });
  const load = traffic(c);
  cleanups.push(() => load.stop());
  await waitFor(() => load.sent() > 100, { message: "traffic under way" });
  const held = await heldWorkers(c, `${LOOPBACK}.4.95`, `${LOOPBACK}.4.96`);
  const b = await startTestEpp(held.workers, { peers: [selectionUrl(a)], flags: ["--subscribe-wait-ms", "50"] });
  cleanups.push(() => b.stop({ graceMs: 200 }));
  expect((await b.ready).kind).toBe("recovered");
  const recoveredBlocks = (await workersOf(b)).map((r) => r.cursor);
  expect(recoveredBlocks.every((x) => x !== null)).toBe(true);
  const sentAtRecovery = load.sent();
  await waitFor(() => load.sent() > sentAtRecovery + 100, { message: "events B's listeners never see" });
  held.open();
  await waitFor(async () => (await workersOf(b)).every((r) => r.handoff === "dropped"), { message: "every rank dropped" });
  await load.stop();
  const rows = await workersOf(b);
  expect(rows.every((r) => !r.complete)).toBe(true);
  const metrics = `http://${HOST}:${b.ports.metrics}`;
  expect(await scrapeMetric(metrics, 'dynamo_epp_kv_handoff_total{outcome="dropped"}')).toBe(4);
  expect(await scrapeMetric(metrics, "dynamo_epp_kv_handoff_dropped_blocks_total")).toBeGreaterThan(0);
  // What B holds is only what it saw after the hole: a subset of the truth, never a block the workers lack
  // that B could not know was gone.
  await expectExact(c, [a]);
  const { view: truth } = await fetchWorkerTruth(c.truth);
  const d = diffIndexViews(truth, await fetchIndexView(selectionUrl(b)));
  expect(d.missing).toBeGreaterThan(0);
  // and B's own dump says so: a joiner recovering from B would not keep these ranks
  const text = await (await fetch(`${selectionUrl(b)}/dump`)).text();
  expect(text).toContain('"complete":false');
  expect(text).not.toContain('"complete":true');
});

test("a worker restarting mid-recovery resets its ranks on both sides; its new stream makes both exact again", async () => {
  const { c, a, load } = await servingUnderLoad(`${LOOPBACK}.4.97`);
  await waitFor(() => load.sent() > 100, { message: "traffic under way" });
  const peer = heldPeer(() => selectionUrl(a), 600, `${LOOPBACK}.4.98`);
  const b = await startTestEpp(c.direct, { peers: [peer.url], waitReady: false });
  cleanups.push(() => b.stop({ graceMs: 200 }));
  await waitFor(() => peer.fetched() > 0, { message: "A's dump taken" });
  // Worker 1 restarts while B's dump is in flight: seq starts again at 0, the cache empty, nothing announced.
  const restarted = await fetch(`${c.mocks[1]!.url}/admin/faults`, { method: "POST", body: JSON.stringify({ action: "restart" }), headers: { "content-type": "application/json" } });
  expect(restarted.status).toBe(200);
  expect((await b.ready).kind).toBe("recovered");
  await waitFor(() => load.sent() > 600, { message: "traffic after the restart", timeoutMs: 30_000 });
  await load.stop();
  await expectExact(c, [a, b]);
  // A saw w1's seq go backwards and reset its ranks. B either did too (its handoff decided exact before the
  // restart reached its stream, then reset live), or its first w1 batch was the new stream's seq 0 (reset).
  const rowsA = await workersOf(a);
  expect(rowsA.filter((r) => r.worker_id === "w1").every((r) => r.restarts >= 1 && r.resets >= 1)).toBe(true);
  expect(rowsA.filter((r) => r.worker_id === "w0").every((r) => r.restarts === 0)).toBe(true);
  const rowsB = await workersOf(b);
  expect(rowsB.filter((r) => r.worker_id === "w1").every((r) => (r.handoff === "exact" && r.restarts >= 1) || r.handoff === "reset"), JSON.stringify(rowsB)).toBe(true);
  expect(rowsB.filter((r) => r.worker_id === "w0").map((r) => r.handoff)).toEqual(["exact", "exact"]);
});

test("a worker restarting after B's dump, reached by B only later: its new stream below the peer's cursor rebuilds the ranks, not skipped", async () => {
  const { c, a, load } = await servingUnderLoad(`${LOOPBACK}.4.103`);
  await waitFor(async () => (await workersOf(a)).every((r) => r.cursor !== null && BigInt(r.cursor) >= 10n), { message: "A's cursors past 10" });
  // B reaches the workers only through proxies that open after its recovery (its listeners connect late).
  const held = await heldWorkers(c, `${LOOPBACK}.4.103`, `${LOOPBACK}.4.104`);
  const b = await startTestEpp(held.workers, { peers: [selectionUrl(a)], flags: ["--subscribe-wait-ms", "50"] });
  cleanups.push(() => b.stop({ graceMs: 200 }));
  expect((await b.ready).kind).toBe("recovered");
  await load.stop();
  // Worker 1 restarts and publishes a few batches (seqs 0.. below the cursors B took over) before B reaches it.
  const restarted = await fetch(`${c.mocks[1]!.url}/admin/faults`, { method: "POST", body: JSON.stringify({ action: "restart" }), headers: { "content-type": "application/json" } });
  expect(restarted.status).toBe(200);
  const request = async (m: MockWorker, rank: number, i: number) => {
    const prompt = Array.from({ length: BLOCK * 2 }, (_, t) => (rank * 7919 + i * 131 + t) % 50000);
    const res = await fetch(`${m.url}/v1/completions`, { method: "POST", headers: { "content-type": "application/json", "x-data-parallel-rank": String(rank) }, body: JSON.stringify({ prompt, max_tokens: 1 }) });
    await res.arrayBuffer();
  };
  for (const rank of [0, 1]) for (let i = 0; i < 2; i++) await request(c.mocks[1]!, rank, i);
  held.open();
  await waitFor(async () => (await workersOf(b)).every((r) => r.connected), { message: "B's listeners connected" });
  // Until A's listeners are back too (they redial with backoff) and have seen w1's new stream.
  let i = 2;
  await waitFor(async () => {
    for (const m of c.mocks) for (const rank of [0, 1]) await request(m, rank, i);
    i++;
    return (await workersOf(a)).filter((r) => r.worker_id === "w1").every((r) => r.restarts >= 1);
  }, { message: "A saw w1 restart" });
  // Skipped as "already in the dump", w1's new batches would never reach B, which would keep the old process's blocks.
  await expectExact(c, [a, b]);
  const rowsB = await workersOf(b);
  expect(rowsB.filter((r) => r.worker_id === "w1").map((r) => r.handoff), JSON.stringify(rowsB)).toEqual(["reset", "reset"]);
});

test("three rounds of rolling replacement under load: each new replica recovers from the last, all exact", async () => {
  const c = await cluster(`${LOOPBACK}.4.99`);
  let serving = await startTestEpp(c.direct);
  let stopServing = () => serving.stop({ graceMs: 200 });
  cleanups.push(() => stopServing());
  const load = traffic(c);
  cleanups.push(() => load.stop());
  await waitFor(() => load.sent() > 100, { message: "traffic under way" });
  for (let round = 0; round < 3; round++) {
    const next = await startTestEpp(c.direct, { peers: [selectionUrl(serving)] });
    expect((await next.ready).kind).toBe("recovered");
    const before = load.sent();
    await waitFor(() => load.sent() > before + 100, { message: `traffic after round ${round}` });
    const rows = await workersOf(next);
    expect(rows.every((r) => r.handoff === "exact" || r.handoff === "replayed"), JSON.stringify(rows)).toBe(true);
    await stopServing();
    serving = next;
    stopServing = () => next.stop({ graceMs: 200 });
  }
  await load.stop();
  await expectExact(c, [serving]);
});

test("ranks the peer has and this replica does not list are neither taken over nor claimed in its own dump", async () => {
  const c = await cluster(`${LOOPBACK}.4.101`);
  const a = await startTestEpp(c.direct);
  cleanups.push(() => a.stop({ graceMs: 200 }));
  const load = traffic(c);
  cleanups.push(() => load.stop());
  await waitFor(() => load.sent() > 100, { message: "traffic under way" });
  const b = await startTestEpp(c.direct.slice(0, 1), { peers: [selectionUrl(a)] });
  cleanups.push(() => b.stop({ graceMs: 200 }));
  expect((await b.ready).kind).toBe("recovered");
  await load.stop();
  const recovery = (await (await fetch(`${selectionUrl(b)}/recovery`)).json()) as { handoff: Record<string, number> };
  expect(Object.values(recovery.handoff).reduce((x, y) => x + y, 0)).toBe(2);
  const dump = await (await fetch(`${selectionUrl(b)}/dump`)).text();
  expect(dump).toContain('"worker_id":"w0"');
  expect(dump).not.toContain('"worker_id":"w1"');
  await caughtUp(b, { ...c, truth: c.truth.slice(0, 1) });
  const { view } = await fetchWorkerTruth(c.truth.slice(0, 1));
  const d = diffIndexViews(view, await fetchIndexView(selectionUrl(b)));
  expect(d.equal, describeDiff(d)).toBe(true);
});
