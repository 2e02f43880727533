// The HTTP-served store: the in-memory semantics across processes, a lease that is an open stream.
import { afterAll, afterEach, beforeAll, describe, expect, test } from "bun:test";
import { killAll, spawnBun, waitFor, LOOPBACK } from "@kv-epp/testkit";
import {
  advertiseHost,
  connectHttpDiscovery,
  findHost,
  IntentWatcher,
  parseDiscoveryConfig,
  RecordExistsError,
  serveDiscoveryStore,
  type AttachmentIntent,
  type DiscoveryServer,
} from "../src/index.ts";
import { capturingLogger, HOST, WORKER } from "./fixtures.ts";

let server: DiscoveryServer;
beforeAll(() => {
  server = serveDiscoveryStore({ hostname: `${LOOPBACK}.7.2` });
});
afterEach(() => killAll("SIGKILL", 1000));
afterAll(() => server.close());

/** A store that grants the lease (its first line, then silence) and answers everything else with `other`. */
function leaseOnlyStore(other: () => Response) {
  return Bun.serve({
    hostname: `${LOOPBACK}.7.3`,
    port: 0,
    idleTimeout: 0,
    fetch: (req) =>
      new URL(req.url).pathname === "/v1/lease"
        ? new Response(new ReadableStream({ start: (c) => c.enqueue(new TextEncoder().encode('{"lease":"p"}\n')) }))
        : other(),
  });
}

describe("HTTP store lease liveness", () => {
  test("a producer that stops renewing (alive to TCP, not running) loses its lease and records", async () => {
    const store = serveDiscoveryStore({ hostname: `${LOOPBACK}.7.3`, heartbeatMs: 50, leaseTtlMs: 300 });
    // A lease opened by hand and never renewed: what a frozen (SIGSTOP) process's lease looks like.
    const abort = new AbortController();
    const res = await fetch(`${store.url}/v1/lease?producer=frozen`, { signal: abort.signal });
    const reader = res.body!.getReader();
    await reader.read();
    const post = await fetch(`${store.url}/v1/records`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ producer: "frozen", kind: "intent", name: "kvi-frozen", payload: {} }),
    });
    expect(post.status).toBe(201);
    expect(store.store.snapshot("intent").map((r) => r.name)).toEqual(["kvi-frozen"]);
    await waitFor(() => store.store.snapshot("intent").length === 0, { message: "lease ended", timeoutMs: 3000 });
    // A client that renews keeps its lease past the TTL.
    const live = await connectHttpDiscovery({ url: store.url, producer: "live", renewMs: 50 });
    await live.register({ kind: "intent", name: "kvi-live", payload: {} });
    await Bun.sleep(700);
    expect(live.lease.aborted).toBe(false);
    expect(store.store.snapshot("intent").map((r) => r.name)).toEqual(["kvi-live"]);
    await live.close();
    abort.abort();
    await store.close();
  });

  test("a store that goes silent (frozen, or cut off behind a half-open connection) ends the client's lease", async () => {
    const silent = leaseOnlyStore(() => Response.json({ renewed: true }));
    const d = await connectHttpDiscovery({ url: `http://${LOOPBACK}.7.3:${silent.port}`, producer: "p", renewMs: 50, silenceMs: 300 });
    expect(d.lease.aborted).toBe(false);
    await waitFor(() => d.lease.aborted, { message: "lease ended", timeoutMs: 3000 });
    expect(String(d.lease.reason)).toContain("silent");
    await d.close();
    silent.stop(true);
  });
});

describe("HTTP discovery watch", () => {
  test("closing a watch before its first snapshot settles its ready (a stop does not hang)", async () => {
    // The watch keeps failing: no snapshot ever comes.
    const store = leaseOnlyStore(() => new Response("unavailable", { status: 503 }));
    const d = await connectHttpDiscovery({ url: `http://${LOOPBACK}.7.3:${store.port}`, producer: "p", retryMs: 20 });
    const w = d.listAndWatch({ kind: "intent" }, () => {});
    await Bun.sleep(100);
    w.close();
    expect(await Promise.race([w.ready.then(() => "settled"), Bun.sleep(1000).then(() => "hanging")])).toBe("settled");
    await d.close().catch(() => {});
    store.stop(true);
  });
});

describe("HTTP-served discovery store", () => {
  test("register, list, unregister and a taken name behave as in memory", async () => {
    const a = await connectHttpDiscovery({ url: server.url, producer: "a" });
    const b = await connectHttpDiscovery({ url: server.url, producer: "b" });
    const reg = await a.register({ kind: "intent", name: "kv-intent-1", payload: { x: 1 } });
    expect(await b.list({ kind: "intent" })).toEqual([{ kind: "intent", name: "kv-intent-1", payload: { x: 1 }, producer: "a" }]);
    await expect(b.register({ kind: "intent", name: "kv-intent-1", payload: {} })).rejects.toThrow(RecordExistsError);
    expect(await b.unregister({ ...reg, producer: "b" })).toBe("missing"); // not b's to withdraw
    expect(await a.unregister(reg)).toBe("removed");
    expect(await a.unregister(reg)).toBe("missing");
    await a.close();
    await b.close();
  });

  test("closing a client ends its lease: its records go and its own lease signal fires", async () => {
    const a = await connectHttpDiscovery({ url: server.url, producer: "closer" });
    const watcher = await connectHttpDiscovery({ url: server.url });
    await advertiseHost({ discovery: a, hostInstance: "closing-host" });
    expect((await findHost(watcher, "closing-host", capturingLogger().log)).producer).toBe("closer");
    await a.close();
    expect(a.lease.aborted).toBe(true);
    await waitFor(async () => (await watcher.list({ kind: "host" })).length === 0);
    await watcher.close();
  });

  test("a worker process registers two ranks; the host sees both; the process is killed and the host detaches", async () => {
    const epp = await connectHttpDiscovery({ url: server.url, producer: "epp" });
    await advertiseHost({ discovery: epp, hostInstance: HOST });
    let desired: AttachmentIntent[] = [];
    const w = new IntentWatcher({ discovery: epp, hostInstance: HOST, onChange: (d) => (desired = d) });
    await w.start();
    const proc = spawnBun([`${import.meta.dir}/http-worker.ts`], { STORE_URL: server.url }, { name: "http-worker" });
    await proc.waitForLog(/registered ranks 0,1/);
    await waitFor(() => desired.length === 2);
    expect(desired.map((d) => [d.workerId, d.dpRank, d.producer])).toEqual([
      [WORKER, 0, "worker-proc"],
      [WORKER, 1, "worker-proc"],
    ]);
    await proc.kill("SIGKILL");
    await waitFor(() => desired.length === 0);
    w.close();
    await epp.close();
  });

  test("the discovery flag names kubernetes or an HTTP store, and a bad value is named", () => {
    expect(parseDiscoveryConfig("kubernetes", { POD_NAME: "p", POD_UID: "u", POD_NAMESPACE: "ns" })).toEqual({
      kind: "kubernetes",
      namespace: "ns",
      pod: { name: "p", uid: "u" },
    });
    expect(parseDiscoveryConfig(`http://${LOOPBACK}.7.2:7070`, {})).toEqual({ kind: "http", url: `http://${LOOPBACK}.7.2:7070` });
    expect(() => parseDiscoveryConfig("etcd://x", {})).toThrow('invalid discovery "etcd://x"');
  });
});
