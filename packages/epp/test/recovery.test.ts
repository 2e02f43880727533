// Recovery wired into the EPP: replica B recovers A's index from A's /dump before it is ready, and
// live events published while B's dump is in flight are applied on top (subscribe first).
import { afterAll, expect, test } from "bun:test";
import { waitFor, LOOPBACK } from "@kv-epp/testkit";
import { FakeWorkerEvents, HOST, capturingLog, postJson, startTestEpp, tokens } from "./helpers.ts";

const cleanups: (() => unknown)[] = [];
afterAll(async () => {
  for (const c of cleanups.reverse()) await c();
});

/** The dump's events as a sorted list, u64 kept exact (as strings) and event ids ignored. */
async function canonicalDump(selectionPort: number): Promise<string[]> {
  const text = await (await fetch(`http://${HOST}:${selectionPort}/dump`)).text();
  const safe = text.replace(/([:\[,]\s*)(\d{15,})/g, '$1"$2"');
  const doc = JSON.parse(safe) as Record<string, { block_size: number; events: { event: { event_id: unknown } }[] }>;
  const out: string[] = [];
  for (const [key, m] of Object.entries(doc))
    for (const e of m.events) out.push(JSON.stringify([key, m.block_size, { ...e, event: { ...e.event, event_id: 0 } }]));
  return out.sort();
}

test("B recovers A's index, and events published during B's recovery are present afterwards", async () => {
  const ev = [await FakeWorkerEvents.start(), await FakeWorkerEvents.start()];
  cleanups.push(() => Promise.all(ev.map((e) => e.close())));
  const workers = [
    { id: "worker-a", address: `${LOOPBACK}.4.21:8000`, kvEvents: ev[0]!.endpoint },
    { id: "worker-b", address: `${LOOPBACK}.4.22:8000`, kvEvents: ev[1]!.endpoint },
  ];
  const a = await startTestEpp(workers);
  cleanups.push(() => a.stop({ graceMs: 500 }));
  await waitFor(() => ev.every((e) => e.pub.subscriberCount === 1), { message: "A subscribed" });
  const p1 = tokens(128, 1);
  const p2 = tokens(64, 2);
  const scoreOf = async (port: number, ids: number[]) => (await postJson(`http://${HOST}:${port}/score`, { token_ids: ids })).body.scores;
  await ev[0]!.storeUntil(p1, async () => (await scoreOf(a.ports.selection, p1))["worker-a"]?.["0"] === 8);
  await ev[1]!.storeUntil(p2, async () => (await scoreOf(a.ports.selection, p2))["worker-b"]?.["0"] === 4);

  // A peer in front of A that fetches A's dump at once but holds the body until released, so the
  // snapshot predates the live event published meanwhile.
  let release!: () => void;
  const released = new Promise<void>((r) => (release = r));
  let fetched = false;
  const proxy = Bun.serve({
    hostname: HOST,
    port: 0,
    fetch: async (req) => {
      const upstream = `http://${HOST}:${a.ports.selection}/dump`;
      if (req.method === "HEAD") return fetch(upstream, { method: "HEAD" });
      const body = await (await fetch(upstream)).text();
      fetched = true;
      await released;
      return new Response(body, { headers: { "content-type": "application/json" } });
    },
  });
  cleanups.push(() => proxy.stop(true));

  const logB = capturingLog();
  const b = await startTestEpp(workers, { peers: [`http://${HOST}:${proxy.port}`], waitReady: false, log: logB.log });
  cleanups.push(() => b.stop({ graceMs: 500 }));
  await waitFor(() => fetched && ev.every((e) => e.pub.subscriberCount === 2), { message: "B subscribed, dump snapshotted" });
  // Live only, not in the held snapshot, published once B's subscription (which lands just after its
  // handshake) reached the publisher: B receives it while still recovering.
  await waitFor(() => ev[0]!.pub.subscribedCount === 2, { message: "B's subscription reached worker-a's publisher" });
  const p3 = tokens(80, 3);
  await ev[0]!.storeUntil(p3, async () => (await scoreOf(a.ports.selection, p3))["worker-a"]?.["0"] === 5);
  expect((await fetch(`http://${HOST}:${b.ports.selection}/dump`)).status).toBe(503);
  release();

  const outcome = await b.ready;
  expect(outcome.kind).toBe("recovered");
  // Applied from B's buffer right after the dump: nothing is published any more.
  await waitFor(async () => (await scoreOf(b.ports.selection, p3))["worker-a"]?.["0"] === 5, { message: "B has p3" });
  expect((await scoreOf(b.ports.selection, p1))["worker-a"]?.["0"]).toBe(8);
  expect(await canonicalDump(b.ports.selection)).toEqual(await canonicalDump(a.ports.selection));

  // The order the logs tell: subscribed, then the dump (with its figures), then recovered.
  const msgs = logB.lines.map((l) => l.msg);
  const at = (m: string) => msgs.indexOf(m);
  expect(at("listeners subscribed")).toBeGreaterThanOrEqual(0);
  expect(at("dump fetched from peer")).toBeGreaterThan(at("listeners subscribed"));
  expect(at("recovered")).toBeGreaterThan(at("dump fetched from peer"));
  expect(logB.lines[at("dump fetched from peer")]).toMatchObject({ peer: `http://${HOST}:${proxy.port}`, events: expect.any(Number), bytes: expect.any(Number), ms: expect.any(Number) });
});

test("two cold replicas listing each other as static peers never wait on each other", async () => {
  const start = (me: string, peer: string) =>
    startTestEpp([], { host: me, peers: [`http://${peer}:9093`], waitReady: false, flags: ["--selection-port", "9093"] });
  const [a, b] = await Promise.all([start(`${LOOPBACK}.4.61`, `${LOOPBACK}.4.62`), start(`${LOOPBACK}.4.62`, `${LOOPBACK}.4.61`)]);
  cleanups.push(() => a.stop({ graceMs: 200 }), () => b.stop({ graceMs: 200 }));
  const outcomes = (await Promise.all([a.ready, b.ready])).map((o) => o.kind).sort();
  // The first to finish bootstraps empty; the other may then see it serving and recover its empty dump.
  expect([["empty_bootstrap", "empty_bootstrap"], ["empty_bootstrap", "recovered"]]).toContainEqual(outcomes);
  expect(a.health.ready && b.health.ready).toBe(true);
});
