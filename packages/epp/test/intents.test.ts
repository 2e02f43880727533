// The EPP's attachment-intents wiring: a discovery that refuses the host advertisement puts the host in
// `retrying` (counted in io_errors{where="intents"}, logged once per state change) and the EPP is ready
// anyway; the merge's unroutable/aliases lists are logged when they change, not on every reconcile.
import { afterEach, expect, test } from "bun:test";
import { connectHttpDiscovery, registerWorkerIntents, serveDiscoveryStore } from "@kv-epp/intents";
import { waitFor } from "@kv-epp/testkit";
import type { EppHandle } from "../src/main.ts";
import { BLOCK, capturingLog, FakeWorkerEvents, HOST, hungServer, MODEL, quietLog, scrapeMetric, startTestEpp } from "./helpers.ts";

const cleanup: (() => Promise<unknown>)[] = [];
afterEach(async () => {
  for (const c of cleanup.splice(0).reverse()) await c().catch(() => {});
});

async function ioErrors(epp: EppHandle): Promise<number> {
  return (await scrapeMetric(`http://${HOST}:${epp.ports.metrics}`, 'dynamo_epp_io_errors_total{where="intents"}')) ?? 0;
}

test("a discovery that refuses the host: retrying counted per attempt, logged once, then ready", async () => {
  const store = serveDiscoveryStore({ hostname: HOST });
  cleanup.push(() => store.close());
  // A proxy in front of the store that refuses the first two host advertisements.
  let refuse = 2;
  const proxy = Bun.serve({
    hostname: HOST,
    port: 0,
    idleTimeout: 0,
    fetch: async (req) => {
      const url = new URL(req.url);
      if (req.method === "POST" && url.pathname === "/v1/records" && refuse > 0) {
        refuse--;
        return new Response(JSON.stringify({ error: "unavailable" }), { status: 503 });
      }
      return fetch(`${store.url}${url.pathname}${url.search}`, { method: req.method, headers: req.headers, body: req.body });
    },
  });
  cleanup.push(async () => proxy.stop(true));
  const { log, lines } = capturingLog();
  const epp = await startTestEpp([], { log, flags: ["--intent-discovery", `http://${HOST}:${proxy.port}`] });
  cleanup.push(() => epp.stop({ graceMs: 0 }));
  // Ready while the host is still retrying in the background.
  expect(await ioErrors(epp)).toBeGreaterThanOrEqual(1);
  await waitFor(() => lines.some((l) => l.msg === "attachment intents host state" && l.state === "ready"), { message: "the host ready", timeoutMs: 15_000 });
  expect(await ioErrors(epp)).toBe(2);
  expect(lines.filter((l) => l.msg === "attachment intents unavailable, retrying in the background").length).toBe(1);
}, 30_000);

test("unroutable and aliased intent workers are logged when the merge's lists change", async () => {
  const store = serveDiscoveryStore({ hostname: HOST });
  cleanup.push(() => store.close());
  const kv = await FakeWorkerEvents.start();
  cleanup.push(() => kv.close());
  const { log, lines } = capturingLog();
  const address = `${HOST}:18000`;
  const epp = await startTestEpp([{ id: "listed", address, kvEvents: kv.endpoint }], {
    log,
    flags: ["--intent-discovery", store.url],
  });
  cleanup.push(() => epp.stop({ graceMs: 0 }));
  const register = (workerId: string, addr?: string) => registerIntent(store.url, workerId, kv.endpoint, addr);
  const logged = (msg: string) => lines.filter((l) => l.msg === msg);
  await register("alias-of-listed", address);
  await waitFor(() => logged("intent workers merged into listed workers").length > 0, { message: "the alias logged", timeoutMs: 15_000 });
  expect(logged("intent workers merged into listed workers")[0]!.aliases).toEqual([{ intentWorker: "alias-of-listed", worker: "listed" }]);

  await register("no-address");
  await waitFor(() => logged("intent workers not routable (no listener)").length > 0, { message: "the unroutable worker logged", timeoutMs: 15_000 });
  expect(logged("intent workers not routable (no listener)")[0]!.unroutable).toEqual([{ id: "no-address", reason: "no-address" }]);
  // That reconcile left the aliases as they were: not logged again.
  expect(logged("intent workers merged into listed workers").length).toBe(1);
  // The aliased intent states the listed worker's source: still one worker, one listener.
  expect(epp.workers.candidates().map((c) => c.workerId)).toEqual(["listed"]);
}, 30_000);

/**
 * Registers one worker's intent (rank 0 publishing on `kvEvents`) in the store at `url`, once the EPP's
 * host advertisement is there (a worker finds its host first).
 */
async function registerIntent(url: string, workerId: string, kvEvents: string, address?: string): Promise<void> {
  const discovery = await connectHttpDiscovery({ url, log: quietLog });
  cleanup.push(() => discovery.close());
  await waitFor(async () => (await discovery.list({ kind: "host" })).length > 0, { message: "the EPP's host advertisement", timeoutMs: 20_000 });
  const owner = await registerWorkerIntents({
    discovery,
    workerId,
    controlTarget: "dynamo-epp",
    model: MODEL,
    blockSize: BLOCK,
    topic: "",
    ranks: [{ rank: 0, kvEvents }],
    ...(address ? { address } : {}),
    log: quietLog,
  });
  cleanup.push(() => owner.close());
}

/**
 * A discovery store on `port` again, once the port is free: the port nothing listened on may meanwhile be some
 * socket's ephemeral source port on a busy machine (EADDRINUSE for a moment).
 */
async function serveStoreOn(port: number): Promise<ReturnType<typeof serveDiscoveryStore>> {
  let store: ReturnType<typeof serveDiscoveryStore> | undefined;
  await waitFor(() => {
    try {
      store = serveDiscoveryStore({ hostname: HOST, port });
      return true;
    } catch (err) {
      if ((err as { code?: string }).code !== "EADDRINUSE") throw err;
      return false;
    }
  }, { message: `port ${port} free for the discovery store`, timeoutMs: 10_000 });
  return store!;
}

test("a discovery store down at start and one that restarts are reopened: intents are not lost for good", async () => {
  // A port nothing listens on yet: the store comes up there after the EPP is ready.
  const probe = serveDiscoveryStore({ hostname: HOST });
  const port = Number(new URL(probe.url).port);
  await probe.close();
  const kv = await FakeWorkerEvents.start();
  cleanup.push(() => kv.close());
  const { log, lines } = capturingLog();
  const epp = await startTestEpp([], { log, flags: ["--intent-discovery", `http://${HOST}:${port}`] });
  cleanup.push(() => epp.stop({ graceMs: 0 }));
  expect(lines.some((l) => l.msg === "attachment intents unavailable, retrying in the background")).toBe(true);
  expect(await ioErrors(epp)).toBeGreaterThanOrEqual(1);

  let store = await serveStoreOn(port);
  cleanup.push(() => store.close());
  await registerIntent(store.url, "late", kv.endpoint, `${HOST}:18001`);
  await waitFor(() => epp.workers.candidates().some((c) => c.workerId === "late"), { message: "the intent worker from the late store", timeoutMs: 20_000 });
  expect(lines.some((l) => l.msg === "attachment intents discovery open again")).toBe(true);

  // The store restarts empty: the EPP's lease ends, it reopens and sees what is registered anew.
  await store.close();
  store = await serveStoreOn(port);
  cleanup.push(() => store.close());
  await waitFor(() => lines.some((l) => l.msg === "attachment intents: the discovery lease ended, reopening"), { message: "the lost lease noticed", timeoutMs: 15_000 });
  await registerIntent(store.url, "after-restart", kv.endpoint, `${HOST}:18002`);
  await waitFor(() => epp.workers.candidates().some((c) => c.workerId === "after-restart"), { message: "the intent worker after the restart", timeoutMs: 20_000 });
}, 60_000);

test("a discovery store that accepts and never answers holds neither readiness nor shutdown", async () => {
  const hung = await hungServer();
  cleanup.push(() => hung.close());
  const { log, lines } = capturingLog();
  // Without the bounds either await below never returns and the test's timeout fails it.
  const epp = await startTestEpp([], { log, flags: ["--intent-discovery", hung.url] });
  expect(lines.some((l) => l.msg === "attachment intents discovery still connecting; not waiting for it")).toBe(true);
  await epp.stop({ graceMs: 0 });
  expect(lines.some((l) => l.msg === "stopped")).toBe(true);
}, 40_000);
