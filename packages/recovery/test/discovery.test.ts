import { afterEach, describe, expect, test } from "bun:test";
import type { V1EndpointSlice } from "@kubernetes/client-node";
import { type FakeKubeApi, startFakeKubeApi, LOOPBACK } from "@kv-epp/testkit";
import { endpointSliceDiscovery, peersFromSlices } from "../src/discovery/endpoint-slices.ts";
import { dumpHandler, type PeerDiscovery, runRecovery, staticPeerDiscovery } from "../src/index.ts";
import { capturingLogger, MapIndex, quietLogger, sampleIndex, until } from "./helpers.ts";

const NS = "llm";
const SERVICE = "dynamo-epp-peer";

type Ep = { ip: string; ready?: boolean; serving?: boolean; terminating?: boolean };
function slice(name: string, eps: Ep[], port: number, opts: { service?: string; portName?: string } = {}): V1EndpointSlice {
  return {
    apiVersion: "discovery.k8s.io/v1",
    kind: "EndpointSlice",
    metadata: { name, namespace: NS, labels: { "kubernetes.io/service-name": opts.service ?? SERVICE } },
    addressType: "IPv4",
    ports: [
      { name: "replica-agg", port: 9092, protocol: "TCP" },
      { name: opts.portName ?? "selection-http", port, protocol: "TCP" },
    ],
    endpoints: eps.map((e) => ({ addresses: [e.ip], conditions: { ready: e.ready, serving: e.serving, terminating: e.terminating } })),
  };
}

describe("peersFromSlices", () => {
  test("eligible = ready && serving && !terminating, never this pod, selection-http port by name", () => {
    const slices = [
      slice("a", [
        { ip: "10.0.0.1", ready: true, serving: true, terminating: false },
        { ip: "10.0.0.2", ready: false, serving: false },
        { ip: "10.0.0.3", ready: true, serving: true, terminating: true },
        { ip: "10.0.0.4", ready: true }, // serving defaults to ready, terminating to false
        { ip: "10.0.0.5" }, // unknown readiness: not a candidate
        { ip: "10.0.0.9", ready: true, serving: true }, // this pod
      ], 9093),
      slice("b", [{ ip: "10.0.1.1", ready: true, serving: true }], 19093),
      slice("c", [{ ip: "10.0.2.1", ready: true, serving: true }], 9093, { portName: "http" }), // no selection-http port
    ];
    expect(peersFromSlices(slices, "10.0.0.9").map((p) => p.url)).toEqual(["http://10.0.0.1:9093", "http://10.0.0.4:9093", "http://10.0.1.1:19093"]);
  });
});

let kube: FakeKubeApi | null = null;
const stops: (() => unknown)[] = [];
afterEach(async () => {
  for (const s of stops.splice(0)) await s();
  await kube?.close();
  kube = null;
});

function discovery(podIp?: string): PeerDiscovery {
  const d = endpointSliceDiscovery({ kubeConfig: kube!.kubeConfig, namespace: NS, service: SERVICE, podIp, logger: quietLogger(), retryMs: 50 });
  stops.push(() => d.stop());
  return d;
}

describe("EndpointSlice discovery against a fake API server", () => {
  test("lists, then follows watch updates of the peer Service's slices only", async () => {
    kube = await startFakeKubeApi();
    kube.upsert(slice("peer-1", [{ ip: `${LOOPBACK}.3.10`, ready: true, serving: true }, { ip: `${LOOPBACK}.3.11`, ready: false }], 9093) as never);
    kube.upsert(slice("other", [{ ip: `${LOOPBACK}.3.20`, ready: true, serving: true }], 9093, { service: "dynamo-epp" }) as never);
    const d = discovery(`${LOOPBACK}.3.9`);
    let changes = 0;
    d.onChange(() => changes++);
    await d.start();
    expect(d.peers().map((p) => p.id)).toEqual([`${LOOPBACK}.3.10:9093`]);

    kube.upsert(slice("peer-1", [{ ip: `${LOOPBACK}.3.10`, ready: true, serving: true }, { ip: `${LOOPBACK}.3.11`, ready: true, serving: true }, { ip: `${LOOPBACK}.3.9`, ready: true }], 9093) as never);
    await until(() => d.peers().length === 2, "the second peer to become ready");
    expect(d.peers().map((p) => p.id)).toEqual([`${LOOPBACK}.3.10:9093`, `${LOOPBACK}.3.11:9093`]);

    kube.remove("EndpointSlice", NS, "peer-1");
    await until(() => d.peers().length === 0, "the slice deletion");
    expect(changes).toBe(2);
  });

  test("keeps following after the watch is dropped and history compacted (410 Gone → relist)", async () => {
    kube = await startFakeKubeApi();
    kube.upsert(slice("peer-1", [{ ip: `${LOOPBACK}.3.10`, ready: true, serving: true }], 9093) as never);
    const d = discovery();
    await d.start();
    kube.compact();
    kube.dropWatches();
    kube.upsert(slice("peer-2", [{ ip: `${LOOPBACK}.3.12`, ready: true, serving: true }], 9093) as never);
    await until(() => d.peers().length === 2, "the slice created while the watch was down", 20_000);
  });

  test("the initial sync waits for the API instead of deciding on an unknown peer set", async () => {
    kube = await startFakeKubeApi({ authorize: () => allowed });
    let allowed = false;
    kube.upsert(slice("peer-1", [{ ip: `${LOOPBACK}.3.10`, ready: true, serving: true }], 9093) as never);
    const d = discovery();
    let synced = false;
    const started = d.start().then(() => (synced = true));
    await until(() => kube!.requests.length >= 2, "a couple of refused lists");
    expect(synced).toBe(false);
    allowed = true;
    await started;
    expect(d.peers().map((p) => p.id)).toEqual([`${LOOPBACK}.3.10:9093`]);
  });

  test("recovers from the serving peer of a slice; a not-ready peer is never a candidate", async () => {
    kube = await startFakeKubeApi();
    const hits = { ready: 0, notReady: 0 };
    const serve = (host: string, key: keyof typeof hits) => {
      const h = dumpHandler({ source: sampleIndex(), ready: () => true, logger: quietLogger() });
      const s = Bun.serve({ hostname: host, port: 0, fetch: (r) => (hits[key]++, h(r)) });
      stops.push(() => s.stop(true));
      return s.port!;
    };
    const port = serve(`${LOOPBACK}.3.2`, "ready");
    // The not-ready peer would even serve a dump: it must still never be asked.
    const port2 = serve(`${LOOPBACK}.3.3`, "notReady");
    kube.upsert(slice("s1", [{ ip: `${LOOPBACK}.3.2`, ready: true, serving: true }], port) as never);
    kube.upsert(slice("s2", [{ ip: `${LOOPBACK}.3.3`, ready: false, serving: false }], port2) as never);
    const target = new MapIndex();
    const out = await runRecovery({ discovery: discovery(`${LOOPBACK}.3.1`), target, timeoutMs: 5000, logger: quietLogger() });
    expect(out).toMatchObject({ kind: "recovered", peer: `${LOOPBACK}.3.2:${port}`, events: 6 });
    expect(hits).toEqual({ ready: 1, notReady: 0 });
    expect(target.snapshot()).toEqual(sampleIndex().snapshot());
  });
});

describe("shutdown during discovery", () => {
  test("an abort while discovery is still starting (API server away) ends recovery at once and stops the discovery", async () => {
    let stopped = false;
    const stuck: PeerDiscovery = {
      description: "never starts",
      start: () => new Promise(() => {}),
      peers: () => [],
      onChange: () => () => {},
      stop: async () => void (stopped = true),
    };
    const abort = new AbortController();
    const run = runRecovery({ discovery: stuck, target: new MapIndex(), timeoutMs: 60_000, logger: quietLogger(), signal: abort.signal });
    await Bun.sleep(50);
    abort.abort(new Error("shutting down"));
    await expect(run).rejects.toThrow("shutting down");
    expect(stopped).toBe(true);
  });
});

describe("cold start with static peers (deadlock regression, rule 8)", () => {
  async function coldStart(n: number) {
    const replicas = Array.from({ length: n }, (_, i) => {
      const state = { ready: false };
      const index = new MapIndex();
      const h = dumpHandler({ source: index, ready: () => state.ready, logger: quietLogger() });
      const server = Bun.serve({ hostname: `${LOOPBACK}.3.${40 + i}`, port: 0, fetch: h });
      stops.push(() => server.stop(true));
      return { state, index, url: `http://${LOOPBACK}.3.${40 + i}:${server.port}` };
    });
    const runs = replicas.map((r) => {
      const { logger, lines } = capturingLogger();
      const d = staticPeerDiscovery({ peers: replicas.filter((o) => o !== r).map((o) => o.url), logger, probeTimeoutMs: 2000 });
      stops.push(() => d.stop());
      return { r, d, logger, lines };
    });
    // All replicas start together: every probe happens while every peer is still cold (answers 503).
    await Promise.all(runs.map((x) => x.d.start()));
    const outcomes = await Promise.all(
      runs.map(async (x) => {
        const out = await runRecovery({ discovery: x.d, target: x.r.index, timeoutMs: 5000, logger: x.logger });
        x.r.state.ready = true;
        return out;
      }),
    );
    return { outcomes, runs };
  }

  for (const n of [2, 3]) {
    test(`${n} replicas listing each other all become ready with empty_bootstrap`, async () => {
      const { outcomes, runs } = await coldStart(n);
      expect(outcomes).toEqual(Array(n).fill({ kind: "empty_bootstrap", reason: "no_serving_peer" }));
      for (const x of runs) expect(x.lines.some((l) => l.level === 40 && l.msg.includes("EMPTY KV index"))).toBe(true);
    });
  }

  test("a not-ready (503) static peer is never a candidate; a serving one is", async () => {
    const cold = Bun.serve({ hostname: `${LOOPBACK}.3.50`, port: 0, fetch: dumpHandler({ source: sampleIndex(), ready: () => false, logger: quietLogger() }) });
    const warm = Bun.serve({ hostname: `${LOOPBACK}.3.51`, port: 0, fetch: dumpHandler({ source: sampleIndex(), ready: () => true, logger: quietLogger() }) });
    stops.push(() => cold.stop(true), () => warm.stop(true));
    const d = staticPeerDiscovery({ peers: [`http://${LOOPBACK}.3.50:${cold.port}`, `http://${LOOPBACK}.3.51:${warm.port}/`, `http://${LOOPBACK}.3.52:1`], logger: quietLogger() });
    stops.push(() => d.stop());
    await d.start();
    expect(d.peers().map((p) => p.url)).toEqual([`http://${LOOPBACK}.3.51:${warm.port}`]);
    const out = await runRecovery({ discovery: d, target: new MapIndex(), timeoutMs: 5000, logger: quietLogger() });
    expect(out).toMatchObject({ kind: "recovered", peer: `http://${LOOPBACK}.3.51:${warm.port}` });
  });

  test("a peer we cannot dump from (another token, another service) is not serving; a cold one with another token says 503", async () => {
    let heads = 0;
    const other = Bun.serve({ hostname: `${LOOPBACK}.3.53`, port: 0, fetch: () => (heads++, new Response("nope", { status: 404 })) });
    const coldOtherToken = Bun.serve({ hostname: `${LOOPBACK}.3.54`, port: 0, fetch: dumpHandler({ source: sampleIndex(), ready: () => false, token: "theirs", logger: quietLogger() }) });
    const warmOtherToken = Bun.serve({ hostname: `${LOOPBACK}.3.55`, port: 0, fetch: dumpHandler({ source: sampleIndex(), ready: () => true, token: "theirs", logger: quietLogger() }) });
    stops.push(() => other.stop(true), () => coldOtherToken.stop(true), () => warmOtherToken.stop(true));
    expect((await fetch(`http://${LOOPBACK}.3.54:${coldOtherToken.port}/dump`, { method: "HEAD" })).status).toBe(503);
    const peers = [`http://${LOOPBACK}.3.53:${other.port}`, `http://${LOOPBACK}.3.54:${coldOtherToken.port}`, `http://${LOOPBACK}.3.55:${warmOtherToken.port}`];
    const d = staticPeerDiscovery({ peers, token: "ours", logger: quietLogger() });
    stops.push(() => d.stop());
    await d.start();
    expect(d.peers()).toEqual([]);
    const out = await runRecovery({ discovery: d, target: new MapIndex(), timeoutMs: 5000, logger: quietLogger() });
    expect(out).toEqual({ kind: "empty_bootstrap", reason: "no_serving_peer" });
    // Re-probed on its period (1 s by default), not back to back.
    const before = heads;
    await Bun.sleep(700);
    expect(heads - before).toBeLessThanOrEqual(2);
  });

  test("a serving peer whose re-probes go unanswered stays serving through the grace period; one that refuses connections leaves at once", async () => {
    let hang = false;
    let headsWhileHanging = 0;
    const peer = Bun.serve({
      hostname: `${LOOPBACK}.3.56`,
      port: 0,
      fetch: (req) => {
        if (!hang) return new Response(null, { status: 200 });
        headsWhileHanging++;
        return new Promise<Response>((resolve) => req.signal.addEventListener("abort", () => resolve(new Response(null, { status: 200 }))));
      },
    });
    stops.push(() => peer.stop(true));
    const url = `http://${LOOPBACK}.3.56:${peer.port}`;
    const patient = staticPeerDiscovery({ peers: [url], logger: quietLogger(), probeTimeoutMs: 100, pollMs: 20, unansweredGraceMs: 600_000 });
    const impatient = staticPeerDiscovery({ peers: [url], logger: quietLogger(), probeTimeoutMs: 100, pollMs: 20, unansweredGraceMs: 0 });
    stops.push(() => patient.stop(), () => impatient.stop());
    await Promise.all([patient.start(), impatient.start()]);
    expect(patient.peers().map((p) => p.url)).toEqual([url]);
    expect(impatient.peers().map((p) => p.url)).toEqual([url]);
    hang = true;
    // Without a grace period the first unanswered re-probe takes the peer out.
    await until(() => impatient.peers().length === 0, "the impatient discovery drops the silent peer");
    await impatient.stop();
    // A discovery's next probe waits for its last: a third arrival means two went unanswered.
    headsWhileHanging = 0;
    await until(() => headsWhileHanging >= 3, "unanswered re-probes");
    expect(patient.peers().map((p) => p.url)).toEqual([url]);
    // A peer that is gone (connection refused) is an answer: it leaves at once.
    peer.stop(true);
    await until(() => patient.peers().length === 0, "the refused peer leaves");
  });
});
