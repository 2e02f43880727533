// replica-agg's socket and discovery layers on loopback (127.0.8.x): what the pure state tests cannot see.
import { afterEach, describe, expect, test } from "bun:test";
import type { V1EndpointSlice } from "@kubernetes/client-node";
import { PubSocket } from "@kv-epp/kv-events";
import { startFakeKubeApi, waitFor, type FakeKubeApi, LOOPBACK } from "@kv-epp/testkit";
import pino from "pino";
import { ActiveLoad, AGG_TOPIC, PeerLoads } from "@kv-epp/routing";
import { workerKeyOf } from "@kv-epp/protocol";
import { kubeSources } from "../kube-sources.ts";
import { endpointSlicePeers, staticPeers } from "./discovery.ts";
import { AggPublisher } from "./publisher.ts";
import { AggSubscribers, type DropReason } from "./peers.ts";

const log = pino({ level: "silent" });
const W0 = workerKeyOf("w-0", 0);
const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

function subscribers(state: PeerLoads) {
  const seen = { malformed: 0, dropped: [] as [DropReason, number][] };
  const subs = new AggSubscribers({
    state,
    timeoutMs: 2000,
    log,
    events: { received: () => {}, sequence: () => {}, malformed: () => seen.malformed++, dropped: (r, n) => seen.dropped.push([r, n]) },
  });
  cleanups.push(() => subs.close());
  return { subs, seen };
}

describe("replica-agg over ZMTP", () => {
  test("a peer's adds, prefill completions and frees reach the subscriber; leaving the peer set drops its load", async () => {
    const load = new ActiveLoad();
    const pub = await AggPublisher.bind({ endpoint: `tcp://${LOOPBACK}.8.20:0`, replica: "peer", load, heartbeatMs: 100, log });
    cleanups.push(() => pub.close());
    const state = new PeerLoads("me");
    const { subs, seen } = subscribers(state);
    subs.reconcile([{ id: "s", endpoint: pub.endpoint }]);
    await waitFor(() => subs.connected === 1, { message: "connected" });

    const lease = load.acquire(W0, 10, 4);
    await waitFor(() => state.of(W0).blocks === 10 && state.of(W0).prefillBlocks === 4, { message: "request added" });
    lease.prefilled();
    await waitFor(() => state.of(W0).prefillBlocks === 0, { message: "prefill completed" });
    lease.release();
    await waitFor(() => state.of(W0).requests === 0, { message: "request freed" });

    load.acquire(W0, 7);
    await waitFor(() => state.of(W0).blocks === 7, { message: "second request added" });
    subs.reconcile([]);
    expect(state.of(W0).blocks).toBe(0);
    expect(seen.dropped).toEqual([["removed", 1]]);
    expect(subs.known).toBe(0);
  });

  test("load changes cost no message while no one subscribes, and are sent once a subscriber has joined", async () => {
    const load = new ActiveLoad();
    const sent: string[] = [];
    const pub = await AggPublisher.bind({ endpoint: `tcp://${LOOPBACK}.8.22:0`, replica: "peer", load, heartbeatMs: 60_000, log, onSent: (m) => sent.push(m.kind) });
    cleanups.push(() => pub.close());
    expect(sent).toEqual(["snapshot"]); // at bind, for a peer already connected
    load.acquire(W0, 3).release();
    await Bun.sleep(20); // a flush would have run by now (one event-loop turn)
    expect(sent).toEqual(["snapshot"]);

    const state = new PeerLoads("me");
    const { subs } = subscribers(state);
    subs.reconcile([{ id: "s", endpoint: pub.endpoint }]);
    await waitFor(() => pub.subscribers === 1, { message: "subscribed" });
    load.acquire(W0, 5);
    await waitFor(() => sent.includes("delta"), { message: "delta sent" });
  });

  test("malformed messages are counted and skipped; the session and later messages are unaffected", async () => {
    const raw = new PubSocket();
    const endpoint = await raw.bind(`tcp://${LOOPBACK}.8.21:0`);
    cleanups.push(() => raw.close());
    const state = new PeerLoads("me");
    const { subs, seen } = subscribers(state);
    subs.reconcile([{ id: "s", endpoint }]);
    await waitFor(() => {
      raw.send([Buffer.from(AGG_TOPIC), Buffer.from("not msgpack \xc1")]);
      return seen.malformed > 0;
    }, { message: "malformed message seen" });
    expect(subs.connected).toBe(1);
    expect(state.requestCount).toBe(0);
  });
});

describe("peer sets", () => {
  test("static: every listed endpoint except this replica's own", () => {
    const s = staticPeers([`tcp://${LOOPBACK}.8.2:9092`, `tcp://${LOOPBACK}.8.3:9092`, `tcp://${LOOPBACK}.8.3:19092`], { hosts: [`${LOOPBACK}.8.3`], port: 9092 });
    expect(s.peers()).toEqual([
      { id: `tcp://${LOOPBACK}.8.2:9092`, endpoint: `tcp://${LOOPBACK}.8.2:9092` },
      { id: `tcp://${LOOPBACK}.8.3:19092`, endpoint: `tcp://${LOOPBACK}.8.3:19092` },
    ]);
  });

  let kube: FakeKubeApi | undefined;
  afterEach(async () => {
    await kube?.close();
    kube = undefined;
  });

  test("Kubernetes: the peer Service's EndpointSlices, port named replica-agg, ready endpoints other than this pod", async () => {
    kube = await startFakeKubeApi();
    const slice = (ips: string[]): V1EndpointSlice => ({
      apiVersion: "discovery.k8s.io/v1",
      kind: "EndpointSlice",
      metadata: { name: "peers", namespace: "llm", labels: { "kubernetes.io/service-name": "dynamo-epp-peer" } },
      addressType: "IPv4",
      ports: [{ name: "selection-http", port: 9093, protocol: "TCP" }, { name: "replica-agg", port: 19092, protocol: "TCP" }],
      endpoints: ips.map((ip) => ({ addresses: [ip], conditions: { ready: true } })),
    });
    kube.upsert(slice([`${LOOPBACK}.8.30`, `${LOOPBACK}.8.31`]) as never);
    const src = endpointSlicePeers(kubeSources(kube.kubeConfig), { namespace: "llm", service: "dynamo-epp-peer", podIp: `${LOOPBACK}.8.30`, logger: log });
    cleanups.push(() => src.stop());
    let changes = 0;
    src.onChange(() => changes++);
    await src.start();
    expect(src.peers()).toEqual([{ id: `${LOOPBACK}.8.31:19092`, endpoint: `tcp://${LOOPBACK}.8.31:19092` }]);
    kube.upsert(slice([`${LOOPBACK}.8.30`, `${LOOPBACK}.8.31`, `${LOOPBACK}.8.32`]) as never);
    await waitFor(() => src.peers().length === 2, { message: "a third replica in the slice" });
    expect(changes).toBe(1);
  });
});
