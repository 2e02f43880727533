// The Kubernetes backend against the fake API server (real HTTP, @kubernetes/client-node for real).
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { createServer, request } from "node:http";
import type { AddressInfo } from "node:net";
import { KubeConfig } from "@kubernetes/client-node";
import { startFakeKubeApi, waitFor, type FakeKubeApi, LOOPBACK } from "@kv-epp/testkit";
import { kubernetesDiscovery } from "../src/discovery/kubernetes.ts";
import { HOLDERS_ANNOTATION, HOST_LABEL, PAYLOAD_ANNOTATION, RECORD_LABEL, VERSION_LABEL } from "../src/discovery/lease-names.ts";
import {
  advertiseHost,
  findHost,
  intentRecordName,
  IntentWatcher,
  openDiscovery,
  RecordExistsError,
  registerIntents,
  registerWorkerIntents,
  startIntentHost,
  type AttachmentIntent,
  type IntentHostState,
  type DiscoveryRecord,
} from "../src/index.ts";
import { capturingLogger, descriptor, HOST, WORKER } from "./fixtures.ts";

const NS = "kv";
let api: FakeKubeApi;
let podSeq = 0;

beforeAll(async () => {
  api = await startFakeKubeApi({ host: `${LOOPBACK}.7.1`, namespace: NS, bookmarkIntervalMs: 200 });
});
afterAll(async () => {
  await api.close();
});

/** A pod object in the fake cluster, and a discovery client running "in" it. */
function podClient(name = `pod-${++podSeq}`) {
  const pod = api.upsert({ apiVersion: "v1", kind: "Pod", metadata: { name, namespace: NS, uid: `uid-${name}` }, status: { phase: "Running" } });
  const discovery = kubernetesDiscovery({ kubeConfig: api.kubeConfig, namespace: NS, pod: { name, uid: pod.metadata!.uid! }, retryMs: 50 });
  return { name, discovery };
}

/** Intent Leases owned by one pod. */
const intentsOf = (pod: string) =>
  api.list("Lease", NS).filter((l) => l.metadata?.labels?.[RECORD_LABEL] === "attachment-intent" && l.metadata.ownerReferences?.some((r) => r.name === pod));

describe("Kubernetes discovery: records are Leases owned by the registering pod", () => {
  test("register writes a labelled Lease with the payload and an owner reference; list reads it back; unregister removes it", async () => {
    const { name, discovery } = podClient();
    const reg = await discovery.register({ kind: "intent", name: "kv-intent-abc", payload: { hello: "world" }, host: "Dynamo_EPP", version: 1 });
    const lease = api.get("Lease", NS, "kv-intent-abc")!;
    expect(lease.metadata?.labels?.[RECORD_LABEL]).toBe("attachment-intent");
    expect(lease.metadata?.labels?.[HOST_LABEL]).toBe("dynamo-epp");
    expect(lease.metadata?.labels?.[VERSION_LABEL]).toBe("1");
    expect((lease.spec as { holderIdentity?: string; leaseDurationSeconds?: number }).holderIdentity).toBe(name);
    expect((lease.spec as { leaseDurationSeconds?: number }).leaseDurationSeconds).toBe(30);
    expect(JSON.parse(lease.metadata!.annotations![PAYLOAD_ANNOTATION]!)).toEqual({ hello: "world" });
    expect(lease.metadata?.ownerReferences).toEqual([{ apiVersion: "v1", kind: "Pod", name, uid: `uid-${name}` }]);
    const listed = await discovery.list({ kind: "intent" });
    expect(listed.find((r) => r.name === "kv-intent-abc")).toEqual({ kind: "intent", name: "kv-intent-abc", payload: { hello: "world" }, producer: discovery.producer });
    expect(await discovery.list({ kind: "host" })).not.toContainEqual(expect.objectContaining({ name: "kv-intent-abc" }));
    expect(await discovery.unregister(reg)).toBe("removed");
    expect(await discovery.unregister(reg)).toBe("missing");
    await expect(discovery.register({ kind: "intent", name: "Not_A_Name", payload: {} })).rejects.toThrow("not a valid object name");
    await discovery.close();
  });

  test("openDiscovery, told kubernetes, opens this backend (loaded only then) on the given client configuration", async () => {
    const discovery = await openDiscovery({ kind: "kubernetes", namespace: NS }, { kubeConfig: api.kubeConfig, producer: "opened" });
    await discovery.register({ kind: "intent", name: "kv-intent-opened", payload: 1 });
    expect(api.get("Lease", NS, "kv-intent-opened")?.metadata?.labels?.[RECORD_LABEL]).toBe("attachment-intent");
    expect(discovery.producer).toBe("opened");
    await discovery.close();
  });

  test("a name already taken is an error unless the record is shared", async () => {
    const a = podClient();
    const b = podClient();
    await a.discovery.register({ kind: "intent", name: "kv-intent-dup", payload: 1 });
    await expect(b.discovery.register({ kind: "intent", name: "kv-intent-dup", payload: 2 })).rejects.toThrow(RecordExistsError);
    api.remove("Pod", NS, a.name);
    expect(api.get("Lease", NS, "kv-intent-dup")).toBeUndefined();
    await a.discovery.close();
    await b.discovery.close();
  });

  test("replicas share the host advertisement: it lives while any holder's pod does", async () => {
    const a = podClient("epp-a");
    const b = podClient("epp-b");
    const adA = await advertiseHost({ discovery: a.discovery, hostInstance: HOST });
    await advertiseHost({ discovery: b.discovery, hostInstance: HOST });
    const name = adA.registration.name;
    expect(JSON.parse(api.get("Lease", NS, name)!.metadata!.annotations![HOLDERS_ANNOTATION]!)).toEqual([a.discovery.producer, b.discovery.producer]);
    expect(api.get("Lease", NS, name)!.metadata!.ownerReferences!.map((r) => r.name)).toEqual(["epp-a", "epp-b"]);
    const worker = podClient();
    expect((await findHost(worker.discovery, HOST, capturingLogger().log)).hostInstance).toBe(HOST);
    await adA.close(); // replica a leaves cleanly: b still holds it
    expect(api.get("Lease", NS, name)!.metadata!.ownerReferences!.map((r) => r.name)).toEqual(["epp-b"]);
    api.remove("Pod", NS, "epp-b"); // replica b dies: the garbage collector takes the advertisement
    expect(api.get("Lease", NS, name)).toBeUndefined();
    await expect(findHost(worker.discovery, HOST, capturingLogger().log)).rejects.toThrow("found 0");
    for (const c of [a, b, worker]) await c.discovery.close();
  });

  test("an undecodable payload reaches the reader as undecodable, not as an error", async () => {
    const w = podClient();
    api.upsert({
      apiVersion: "coordination.k8s.io/v1",
      kind: "Lease",
      metadata: { name: "kv-host-broken", namespace: NS, labels: { [RECORD_LABEL]: "kv-host" }, annotations: { [PAYLOAD_ANNOTATION]: "{not json" } },
      spec: {},
    });
    const { log, lines } = capturingLogger();
    await expect(findHost(w.discovery, HOST, log)).rejects.toThrow("found 0");
    expect(lines.some((l) => l.msg === "skipping undecodable host advertisement" && l.record === "kv-host-broken")).toBe(true);
    api.remove("Lease", NS, "kv-host-broken");
    await w.discovery.close();
  });

  test("listAndWatch delivers whole snapshots, level-triggered, and survives a dropped watch", async () => {
    const w = podClient();
    const snapshots: DiscoveryRecord[][] = [];
    const watch = w.discovery.listAndWatch({ kind: "intent" }, (s) => snapshots.push(s));
    await watch.ready;
    const names = () => (snapshots.at(-1) ?? []).map((r) => r.name).sort();
    const before = names();
    const other = podClient();
    await other.discovery.register({ kind: "intent", name: "kv-intent-w1", payload: {} });
    await waitFor(() => names().includes("kv-intent-w1"));
    api.dropWatches();
    await other.discovery.register({ kind: "intent", name: "kv-intent-w2", payload: {} });
    await waitFor(() => names().includes("kv-intent-w2"));
    api.remove("Pod", NS, other.name);
    await waitFor(() => names().join() === before.join());
    watch.close();
    await w.discovery.close();
    await other.discovery.close();
  });
});

describe("intents over Kubernetes", () => {
  test("two ranks register; the host attaches to both; the worker pod dies and the host detaches", async () => {
    const epp = podClient("epp-0");
    const host = await advertiseHost({ discovery: epp.discovery, hostInstance: HOST });
    let desired: AttachmentIntent[] = [];
    const watcher = new IntentWatcher({ discovery: epp.discovery, hostInstance: HOST, onChange: (d) => (desired = d) });
    await watcher.start();
    const worker = podClient(WORKER);
    const owner = await registerIntents({ discovery: worker.discovery, workerId: WORKER, controlTarget: HOST, descriptors: [descriptor(0), descriptor(1)] });
    expect(owner.managedRanks()).toEqual([0, 1]);
    expect(intentsOf(WORKER).length).toBe(2);
    await waitFor(() => desired.length === 2);
    expect(desired.map((d) => [d.workerId, d.dpRank, d.endpoint, d.producer])).toEqual([
      [WORKER, 0, `tcp://${LOOPBACK}.7.1:5557`, worker.discovery.producer],
      [WORKER, 1, `tcp://${LOOPBACK}.7.1:5558`, worker.discovery.producer],
    ]);
    api.remove("Pod", NS, WORKER);
    await waitFor(() => desired.length === 0);
    expect(intentsOf(WORKER)).toEqual([]);
    // The dead process's close finds its intents already missing: success, no retries.
    await owner.close();
    watcher.close();
    await host.close();
    await epp.discovery.close();
    await worker.discovery.close();
  });

  test("close withdraws the intents through the API", async () => {
    const epp = podClient();
    const host = await advertiseHost({ discovery: epp.discovery, hostInstance: "epp-close" });
    const worker = podClient();
    const owner = await registerIntents({
      discovery: worker.discovery,
      workerId: WORKER,
      controlTarget: "epp-close",
      descriptors: [descriptor(0), descriptor(1), descriptor(2)],
    });
    expect(intentsOf(worker.name).length).toBe(3);
    await owner.close();
    expect(intentsOf(worker.name)).toEqual([]);
    const deletes = api.requests.filter((r) => r.verb === "delete" && r.plural === "leases" && r.name?.startsWith("kvi-"));
    expect(deletes.slice(-3).map((r) => r.name)).toEqual([...owner.intents].reverse().map(intentRecordName));
    await host.close();
    await epp.discovery.close();
    await worker.discovery.close();
  });

  test("a restarted container withdraws its previous incarnation's intents, which its pod still owns", async () => {
    const epp = podClient();
    const host = await advertiseHost({ discovery: epp.discovery, hostInstance: "epp-restart" });
    const other = podClient("worker-other");
    await registerIntents({ discovery: other.discovery, workerId: "worker-other", controlTarget: "epp-restart", descriptors: [descriptor(0, { workerId: "worker-other" })] });
    const pod = podClient("worker-r");
    const ranks = (n: number) => Array.from({ length: n }, (_, r) => ({ rank: r, kvEvents: `tcp://${LOOPBACK}.7.1:${6000 + r}` }));
    const common = { workerId: "worker-r", controlTarget: "epp-restart", model: "m", blockSize: 16, topic: "" };
    await registerWorkerIntents({ ...common, discovery: pod.discovery, ranks: ranks(3) });
    await pod.discovery.close(); // the container crashes: nothing withdrawn, the pod lives on
    const again = kubernetesDiscovery({ kubeConfig: api.kubeConfig, namespace: NS, pod: { name: "worker-r", uid: "uid-worker-r" } });
    await registerWorkerIntents({ ...common, discovery: again, ranks: ranks(2) });
    const left = intentsOf("worker-r").map((l) => JSON.parse(l.metadata!.annotations![PAYLOAD_ANNOTATION]!) as AttachmentIntent);
    expect(left.map((i) => [i.dpRank, i.producer]).sort()).toEqual([
      [0, again.producer],
      [1, again.producer],
    ]);
    expect(intentsOf("worker-other").length).toBe(1);
    await host.close();
    for (const d of [epp.discovery, other.discovery, again]) await d.close();
  });

  test("a record not renewed within its lease is gone for readers; renewed ones stay", async () => {
    const w = podClient("worker-lease");
    const quick = kubernetesDiscovery({ kubeConfig: api.kubeConfig, namespace: NS, pod: { name: "worker-lease", uid: "uid-worker-lease" }, leaseDurationSeconds: 1 });
    const reader = kubernetesDiscovery({ kubeConfig: api.kubeConfig, namespace: NS, resyncMs: 50 });
    let seen: string[] = [];
    const watch = reader.listAndWatch({ kind: "intent" }, (s) => (seen = s.map((r) => r.name)));
    await watch.ready;
    await quick.register({ kind: "intent", name: "kvi-lease-test", payload: {} });
    await waitFor(() => seen.includes("kvi-lease-test"));
    const renewTime = () => (api.get("Lease", NS, "kvi-lease-test")!.spec as { renewTime: string }).renewTime;
    const first = renewTime();
    await waitFor(() => renewTime() !== first, { message: "renewed" });
    expect(seen).toContain("kvi-lease-test");
    // The process dies, its pod lives on: nothing deletes the record, its lease runs out.
    await quick.close();
    await waitFor(() => !seen.includes("kvi-lease-test"), { message: "expired for the watcher" });
    expect((await reader.list({ kind: "intent" })).map((r) => r.name)).not.toContain("kvi-lease-test");
    expect(api.get("Lease", NS, "kvi-lease-test")).toBeDefined();
    watch.close();
    await reader.close();
    await w.discovery.close();
  });
});

describe("the registration's lease on Kubernetes", () => {
  test("close stops retrying withdrawals once the API has been unreachable for a whole lease", async () => {
    const gone = await startFakeKubeApi({ host: `${LOOPBACK}.7.1`, namespace: NS });
    gone.upsert({ apiVersion: "v1", kind: "Pod", metadata: { name: "w", namespace: NS, uid: "uid-w" } });
    const epp = kubernetesDiscovery({ kubeConfig: gone.kubeConfig, namespace: NS });
    await advertiseHost({ discovery: epp, hostInstance: HOST });
    const discovery = kubernetesDiscovery({ kubeConfig: gone.kubeConfig, namespace: NS, pod: { name: "w", uid: "uid-w" }, leaseDurationSeconds: 1 });
    const owner = await registerIntents({ discovery, workerId: WORKER, controlTarget: HOST, descriptors: [descriptor(0), descriptor(1)] });
    await gone.close();
    await owner.close(); // retries (100, 200, 400 ms, ...) until the lease, no longer renewable, ends
    expect(discovery.lease.aborted).toBe(true);
    expect(String(discovery.lease.reason)).toContain("not renewed");
    await discovery.close();
    await epp.close();
  });

  test("while the API server is gone, readers keep the last records instead of expiring them by age", async () => {
    const outage = await startFakeKubeApi({ host: `${LOOPBACK}.7.1`, namespace: NS, bookmarkIntervalMs: 200 });
    const writer = kubernetesDiscovery({ kubeConfig: outage.kubeConfig, namespace: NS, leaseDurationSeconds: 1 });
    const reader = kubernetesDiscovery({ kubeConfig: outage.kubeConfig, namespace: NS, resyncMs: 50, retryMs: 100 });
    let seen: string[] = [];
    let snapshots = 0;
    const watch = reader.listAndWatch({ kind: "intent" }, (snap) => {
      snapshots++;
      seen = snap.map((r) => r.name);
    });
    await watch.ready;
    await writer.register({ kind: "intent", name: "kvi-outage", payload: {} });
    await waitFor(() => seen.includes("kvi-outage"));
    await outage.close();
    // Two lease durations without renewals: by age the record would be gone.
    await Bun.sleep(2500);
    expect(seen).toEqual(["kvi-outage"]);
    watch.close();
    await reader.close();
    await writer.close().catch(() => {});
    expect(snapshots).toBeGreaterThan(0);
  });

  test("a watch the RBAC rules forbid fails its first snapshot instead of waiting forever", async () => {
    const strict = await startFakeKubeApi({ host: `${LOOPBACK}.7.1`, namespace: NS, authorize: (r) => !(r.plural === "leases" && (r.verb === "list" || r.verb === "watch")) });
    const d = kubernetesDiscovery({ kubeConfig: strict.kubeConfig, namespace: NS });
    const watcher = new IntentWatcher({ discovery: d, hostInstance: HOST, onChange: () => {} });
    await expect(watcher.start()).rejects.toThrow();
    watcher.close();
    await d.close();
    await strict.close();
  });

  test("a first list that fails for a while is retried: the first snapshot is the real one, not an empty guess", async () => {
    const behind = await startFakeKubeApi({ host: `${LOOPBACK}.7.1`, namespace: NS });
    behind.upsert({
      apiVersion: "coordination.k8s.io/v1",
      kind: "Lease",
      metadata: { name: "kvi-there", namespace: NS, labels: { [RECORD_LABEL]: "attachment-intent" }, annotations: { [PAYLOAD_ANNOTATION]: "{}" } },
      spec: {},
    });
    // A proxy in front answers 503 to lists until told otherwise (a 403 would rightly fail at once).
    // node:http, not Bun.serve: a streamed watch must get its headers before its first event.
    let failed = 0;
    let healthy = false;
    const target = new URL(behind.url);
    const proxy = createServer((req, res) => {
      const u = new URL(req.url ?? "/", "http://proxy");
      if (!healthy && u.pathname.endsWith("/leases") && u.searchParams.get("watch") === null) {
        failed++;
        res.writeHead(503, { "content-type": "application/json" });
        return void res.end(JSON.stringify({ kind: "Status", apiVersion: "v1", status: "Failure", code: 503, reason: "ServiceUnavailable" }));
      }
      const up = request({ host: target.hostname, port: target.port, path: req.url, method: req.method, headers: req.headers }, (r) => {
        res.writeHead(r.statusCode ?? 502, r.headers);
        res.flushHeaders();
        r.pipe(res);
      });
      req.pipe(up);
    });
    await new Promise<void>((resolve) => proxy.listen(0, `${LOOPBACK}.7.1`, resolve));
    const proxyPort = (proxy.address() as AddressInfo).port;
    const kubeConfig = new KubeConfig();
    kubeConfig.loadFromOptions({
      clusters: [{ name: "p", server: `http://${LOOPBACK}.7.1:${proxyPort}`, skipTLSVerify: true }],
      users: [{ name: "p", token: "t" }],
      contexts: [{ name: "p", cluster: "p", user: "p", namespace: NS }],
      currentContext: "p",
    });
    const d = kubernetesDiscovery({ kubeConfig, namespace: NS, retryMs: 20 });
    const snapshots: string[][] = [];
    const watch = d.listAndWatch({ kind: "intent" }, (recs) => snapshots.push(recs.map((r) => r.name)));
    await waitFor(() => failed >= 3);
    expect(snapshots).toEqual([]);
    healthy = true;
    await watch.ready;
    expect(snapshots[0]).toEqual(["kvi-there"]);
    watch.close();
    await d.close();
    proxy.closeAllConnections();
    await new Promise((resolve) => proxy.close(resolve));
    await behind.close();
  });
});

describe("deleted records come back while their producer lives", () => {
  test("a deleted host record is re-created by the next renewal, so new workers can register again", async () => {
    const epp = kubernetesDiscovery({ kubeConfig: api.kubeConfig, namespace: NS, pod: { name: "epp-renew", uid: "uid-epp-renew" }, leaseDurationSeconds: 1 });
    api.upsert({ apiVersion: "v1", kind: "Pod", metadata: { name: "epp-renew", namespace: NS, uid: "uid-epp-renew" } });
    const ad = await advertiseHost({ discovery: epp, hostInstance: "epp-renew" });
    const name = ad.registration.name;
    api.remove("Lease", NS, name);
    expect(api.get("Lease", NS, name)).toBeUndefined();
    await waitFor(() => api.get("Lease", NS, name) !== undefined, { message: "host record re-created" });
    const lease = api.get("Lease", NS, name)!;
    expect(JSON.parse(lease.metadata!.annotations![HOLDERS_ANNOTATION]!)).toEqual([epp.producer]);
    expect(lease.metadata!.ownerReferences!.map((r) => r.name)).toEqual(["epp-renew"]);
    const worker = podClient();
    const owner = await registerIntents({ discovery: worker.discovery, workerId: WORKER, controlTarget: "epp-renew", descriptors: [descriptor(0)] });
    expect(owner.managedRanks()).toEqual([0]);
    // Withdrawn by its producer, it stays withdrawn.
    await ad.close();
    await new Promise((r) => setTimeout(r, 700));
    expect(api.get("Lease", NS, name)).toBeUndefined();
    await owner.close();
    await worker.discovery.close();
    await epp.close();
  });

  test("a replica renewing a re-created shared record it is not listed in joins it again", async () => {
    const a = kubernetesDiscovery({ kubeConfig: api.kubeConfig, namespace: NS, pod: { name: "epp-ja", uid: "uid-epp-ja" }, leaseDurationSeconds: 1 });
    const b = kubernetesDiscovery({ kubeConfig: api.kubeConfig, namespace: NS, pod: { name: "epp-jb", uid: "uid-epp-jb" }, leaseDurationSeconds: 1 });
    for (const p of ["epp-ja", "epp-jb"]) api.upsert({ apiVersion: "v1", kind: "Pod", metadata: { name: p, namespace: NS, uid: `uid-${p}` } });
    const ad = await advertiseHost({ discovery: a, hostInstance: "epp-join" });
    await advertiseHost({ discovery: b, hostInstance: "epp-join" });
    const name = ad.registration.name;
    const holders = () => JSON.parse(api.get("Lease", NS, name)?.metadata?.annotations?.[HOLDERS_ANNOTATION] ?? "[]") as string[];
    api.remove("Lease", NS, name);
    await waitFor(() => holders().length === 2, { message: "both replicas hold the re-created record" });
    expect(holders().sort()).toEqual([a.producer, b.producer].sort());
    expect(api.get("Lease", NS, name)!.metadata!.ownerReferences!.map((r) => r.name).sort()).toEqual(["epp-ja", "epp-jb"]);
    await a.close();
    await b.close();
    api.remove("Lease", NS, name);
  });

  test("a deleted intent record is re-created by the next renewal; the host attaches again", async () => {
    const epp = podClient();
    const host = await advertiseHost({ discovery: epp.discovery, hostInstance: "epp-intent-renew" });
    let desired: AttachmentIntent[] = [];
    const watcher = new IntentWatcher({ discovery: epp.discovery, hostInstance: "epp-intent-renew", onChange: (d) => (desired = d) });
    await watcher.start();
    api.upsert({ apiVersion: "v1", kind: "Pod", metadata: { name: "worker-renew", namespace: NS, uid: "uid-worker-renew" } });
    const wd = kubernetesDiscovery({ kubeConfig: api.kubeConfig, namespace: NS, pod: { name: "worker-renew", uid: "uid-worker-renew" }, leaseDurationSeconds: 1 });
    const owner = await registerIntents({ discovery: wd, workerId: WORKER, controlTarget: "epp-intent-renew", descriptors: [descriptor(0), descriptor(1)] });
    await waitFor(() => desired.length === 2);
    const gone = intentRecordName(owner.intents[1]!);
    api.remove("Lease", NS, gone);
    await waitFor(() => desired.length === 1, { message: "detached" });
    await waitFor(() => desired.length === 2, { message: "re-created and attached again" });
    expect(api.get("Lease", NS, gone)!.metadata!.ownerReferences!.map((r) => r.name)).toEqual(["worker-renew"]);
    await owner.close();
    expect(intentsOf("worker-renew")).toEqual([]);
    await new Promise((r) => setTimeout(r, 700));
    expect(intentsOf("worker-renew")).toEqual([]); // withdrawn ones stay withdrawn
    watcher.close();
    await host.close();
    await wd.close();
    await epp.discovery.close();
  });

  test("joining a shared record that vanishes mid-join creates it instead of failing", async () => {
    let vanish = false;
    const racy = await startFakeKubeApi({
      host: `${LOOPBACK}.7.1`,
      namespace: NS,
      authorize: (r) => {
        // The join's read of the existing record: the record is deleted just before it is served.
        if (vanish && r.verb === "get" && r.plural === "leases") {
          vanish = false;
          racy.remove("Lease", NS, r.name!);
        }
        return true;
      },
    });
    const a = kubernetesDiscovery({ kubeConfig: racy.kubeConfig, namespace: NS, producer: "epp-a" });
    const b = kubernetesDiscovery({ kubeConfig: racy.kubeConfig, namespace: NS, producer: "epp-b" });
    const ad = await advertiseHost({ discovery: a, hostInstance: HOST });
    vanish = true;
    const adB = await advertiseHost({ discovery: b, hostInstance: HOST });
    expect(vanish).toBe(false); // the race did happen
    expect(JSON.parse(racy.get("Lease", NS, adB.registration.name)!.metadata!.annotations![HOLDERS_ANNOTATION]!)).toEqual(["epp-b"]);
    expect(ad.registration.name).toBe(adB.registration.name);
    await a.close();
    await b.close();
    await racy.close();
  });
});

describe("startIntentHost keeps trying in the background", () => {
  test("advertising and watching fail at start: it resolves (retrying), then advertises, watches and attaches once allowed", async () => {
    let forbid: "create" | "list" | "none" = "create";
    const strict = await startFakeKubeApi({
      host: `${LOOPBACK}.7.1`,
      namespace: NS,
      authorize: (r) =>
        !(r.plural === "leases" && ((forbid === "create" && r.verb === "create") || (forbid === "list" && (r.verb === "list" || r.verb === "watch")))),
    });
    const epp = kubernetesDiscovery({ kubeConfig: strict.kubeConfig, namespace: NS, producer: "epp-retry", retryMs: 20 });
    const states: IntentHostState["kind"][] = [];
    let desired: AttachmentIntent[] = [];
    const host = await startIntentHost({
      discovery: epp,
      hostInstance: HOST,
      onChange: (d) => (desired = d),
      retry: { initialMs: 20, maxMs: 80 },
      onState: (s) => states.push(s.kind),
    });
    expect(host.state().kind).toBe("retrying");
    const worker = kubernetesDiscovery({ kubeConfig: strict.kubeConfig, namespace: NS, producer: "worker-retry" });
    await expect(findHost(worker, HOST, capturingLogger().log)).rejects.toThrow("found 0");
    await waitFor(() => states.filter((s) => s === "retrying").length >= 3, { message: "several attempts while forbidden" });
    forbid = "list"; // the advertisement goes through, the watch does not yet
    await waitFor(() => strict.get("Lease", NS, "kvh-dynamo-epp") !== undefined, { message: "advertised" });
    expect(host.state().kind).toBe("retrying");
    forbid = "none";
    await host.ready;
    expect(host.state().kind).toBe("ready");
    expect(JSON.parse(strict.get("Lease", NS, "kvh-dynamo-epp")!.metadata!.annotations![HOLDERS_ANNOTATION]!)).toEqual(["epp-retry"]);
    const owner = await registerIntents({ discovery: worker, workerId: WORKER, controlTarget: HOST, descriptors: [descriptor(0), descriptor(1)] });
    await waitFor(() => desired.length === 2, { message: "attached" });
    await host.stop();
    expect(host.state().kind).toBe("stopped");
    expect(strict.get("Lease", NS, "kvh-dynamo-epp")).toBeUndefined();
    await owner.close();
    await worker.close();
    await epp.close();
    await strict.close();
  });

  test("with retry off, a failed start still rejects and leaves nothing behind", async () => {
    const strict = await startFakeKubeApi({ host: `${LOOPBACK}.7.1`, namespace: NS, authorize: (r) => !(r.plural === "leases" && r.verb === "watch") && !(r.plural === "leases" && r.verb === "list") });
    const epp = kubernetesDiscovery({ kubeConfig: strict.kubeConfig, namespace: NS, producer: "epp-once" });
    await expect(startIntentHost({ discovery: epp, hostInstance: HOST, onChange: () => {}, retry: false })).rejects.toThrow();
    expect(strict.get("Lease", NS, "kvh-dynamo-epp")).toBeUndefined();
    await epp.close();
    await strict.close();
  });

  test("stop while retrying ends the attempts", async () => {
    let attempts = 0;
    const strict = await startFakeKubeApi({
      host: `${LOOPBACK}.7.1`,
      namespace: NS,
      authorize: (r) => !(r.plural === "leases" && r.verb === "create" && ++attempts > 0),
    });
    const epp = kubernetesDiscovery({ kubeConfig: strict.kubeConfig, namespace: NS, producer: "epp-stop" });
    const host = await startIntentHost({ discovery: epp, hostInstance: HOST, onChange: () => {}, retry: { initialMs: 10, maxMs: 10 } });
    await waitFor(() => attempts >= 3);
    await host.stop();
    expect(host.state().kind).toBe("stopped");
    const after = attempts;
    await new Promise((r) => setTimeout(r, 100));
    expect(attempts).toBe(after);
    await epp.close();
    await strict.close();
  });
});
