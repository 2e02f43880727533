import { afterEach, beforeEach, describe, expect, test } from "bun:test";
import { existsSync } from "node:fs";
import { dirname, join } from "node:path";
import {
  CoreV1Api,
  CustomObjectsApi,
  DiscoveryV1Api,
  makeInformer,
  PatchStrategy,
  setHeaderOptions,
  Watch,
  type KubernetesObject,
  type V1Pod,
} from "@kubernetes/client-node";
import { killAll, spawnBun, startFakeKubeApi, waitFor, type FakeKubeApi, type KubeObject, LOOPBACK } from "../src/index.ts";

const NS = "kv";

function pod(name: string, labels: Record<string, string>, ip = `${LOOPBACK}.5.10`): KubeObject {
  return {
    apiVersion: "v1",
    kind: "Pod",
    metadata: { name, namespace: NS, labels },
    spec: { containers: [{ name: "main", image: "x" }] },
    status: { phase: "Running", podIP: ip, conditions: [{ type: "Ready", status: "True" }] },
  };
}

type Seen = { type: "add" | "update" | "delete"; name: string; rv: string };

function podInformer(api: FakeKubeApi, labelSelector?: string) {
  const core = api.kubeConfig.makeApiClient(CoreV1Api);
  const informer = makeInformer(api.kubeConfig, `/api/v1/namespaces/${NS}/pods`, () => core.listNamespacedPod({ namespace: NS, labelSelector }), labelSelector);
  const seen: Seen[] = [];
  const errors: unknown[] = [];
  for (const type of ["add", "update", "delete"] as const) {
    informer.on(type, (o: KubernetesObject) => seen.push({ type, name: o.metadata?.name ?? "", rv: o.metadata?.resourceVersion ?? "" }));
  }
  informer.on("error", (e: unknown) => errors.push(e));
  return { informer, seen, errors };
}

let api: FakeKubeApi;
const stops: (() => Promise<void> | void)[] = [];

beforeEach(async () => {
  api = await startFakeKubeApi();
});

afterEach(async () => {
  for (const s of stops.splice(0)) await s();
  await api.close();
  await killAll();
});

describe("fake kube api with @kubernetes/client-node informers", () => {
  test("an informer sees ADDED, MODIFIED and DELETED for pods written by the harness and by the client", async () => {
    api.upsert(pod("a", { app: "w" }));
    const { informer, seen, errors } = podInformer(api);
    await informer.start();
    stops.push(() => informer.stop());
    expect(seen).toEqual([{ type: "add", name: "a", rv: expect.any(String) }]);

    api.upsert({ ...pod("a", { app: "w" }), status: { phase: "Running", podIP: `${LOOPBACK}.5.11` } });
    const core = api.kubeConfig.makeApiClient(CoreV1Api);
    await core.createNamespacedPod({ namespace: NS, body: pod("b", { app: "w" }) as V1Pod });
    await waitFor(() => seen.length >= 3);
    expect(informer.get("a", NS)?.status?.podIP).toBe(`${LOOPBACK}.5.11`);

    await core.deleteNamespacedPod({ namespace: NS, name: "a" });
    await waitFor(() => seen.some((s) => s.type === "delete"));
    expect(seen.map((s) => `${s.type}:${s.name}`)).toEqual(["add:a", "update:a", "add:b", "delete:a"]);
    expect(informer.list(NS).map((p) => p.metadata?.name)).toEqual(["b"]);
    expect(errors).toEqual([]);
    // resourceVersions grow strictly along the stream
    const rvs = seen.map((s) => Number(s.rv));
    expect([...rvs].sort((x, y) => x - y)).toEqual(rvs);
  }, 30_000);

  test("a label-selected informer loses an object whose labels stop matching", async () => {
    api.upsert(pod("a", { app: "w" }));
    api.upsert(pod("other", { app: "z" }));
    const { informer, seen } = podInformer(api, "app=w");
    await informer.start();
    stops.push(() => informer.stop());
    expect(seen.map((s) => s.name)).toEqual(["a"]);
    api.upsert(pod("a", { app: "gone" }));
    await waitFor(() => seen.length === 2);
    expect(seen[1]).toMatchObject({ type: "delete", name: "a" });
    api.upsert(pod("other", { app: "w" }));
    await waitFor(() => seen.length === 3);
    expect(seen[2]).toMatchObject({ type: "add", name: "other" });
  }, 30_000);

  test("after compaction a resumed watch gets 410 and the informer relists, reporting what it missed", async () => {
    api.upsert(pod("a", { app: "w" }));
    api.upsert(pod("b", { app: "w" }));
    const { informer, seen, errors } = podInformer(api);
    await informer.start();
    stops.push(() => informer.stop());
    const listsBefore = api.requests.filter((r) => r.verb === "list").length;

    // Drop the stream, change state while the informer is away, and forget the history it would replay.
    api.dropWatches();
    api.remove("Pod", NS, "a");
    api.upsert(pod("c", { app: "w" }));
    api.compact();

    await waitFor(() => seen.some((s) => s.type === "delete" && s.name === "a") && seen.some((s) => s.name === "c"));
    expect(api.requests.filter((r) => r.verb === "list").length).toBe(listsBefore + 1);
    expect(informer.list(NS).map((p) => p.metadata?.name).sort()).toEqual(["b", "c"]);
    expect(errors).toEqual([]);
  }, 30_000);

  test("a raw watch from a compacted resourceVersion receives an ERROR event with code 410", async () => {
    const first = api.upsert(pod("a", { app: "w" }));
    api.upsert(pod("b", { app: "w" }));
    api.compact();
    const events: { type: string; code?: number }[] = [];
    const done = Promise.withResolvers<unknown>();
    await new Watch(api.kubeConfig).watch(
      `/api/v1/namespaces/${NS}/pods`,
      { resourceVersion: first.metadata!.resourceVersion },
      (type, obj) => events.push({ type, code: (obj as { code?: number }).code }),
      (err) => done.resolve(err),
    );
    await done.promise;
    expect(events).toEqual([{ type: "ERROR", code: 410 }]);
  }, 30_000);

  test("a watch resumed from a retained resourceVersion replays exactly the later events", async () => {
    const first = api.upsert(pod("a", { app: "w" }));
    api.upsert(pod("b", { app: "w" }));
    api.remove("pods", NS, "a");
    const events: string[] = [];
    const ctl = await new Watch(api.kubeConfig).watch(`/api/v1/namespaces/${NS}/pods`, { resourceVersion: first.metadata!.resourceVersion }, (type, obj) =>
      events.push(`${type}:${(obj as KubernetesObject).metadata?.name}`),
    () => {});
    stops.push(() => ctl.abort());
    await waitFor(() => events.length === 2);
    expect(events).toEqual(["ADDED:b", "DELETED:a"]);
  }, 30_000);

  test("bookmarks arrive when asked for and carry the current resourceVersion", async () => {
    await api.close();
    api = await startFakeKubeApi({ bookmarkIntervalMs: 50 });
    api.upsert(pod("a", { app: "w" }));
    const bookmarks: string[] = [];
    const ctl = await new Watch(api.kubeConfig).watch(
      `/api/v1/namespaces/${NS}/pods`,
      { resourceVersion: String(api.resourceVersion), allowWatchBookmarks: true },
      (type, obj) => type === "BOOKMARK" && bookmarks.push((obj as KubernetesObject).metadata?.resourceVersion ?? ""),
      () => {},
    );
    stops.push(() => ctl.abort());
    await waitFor(() => bookmarks.length >= 1);
    expect(bookmarks[0]).toBe(String(api.resourceVersion));
  }, 30_000);

  test("EndpointSlices list by service-name label through DiscoveryV1Api", async () => {
    const slice = (name: string, service: string, ready: boolean) => ({
      apiVersion: "discovery.k8s.io/v1",
      kind: "EndpointSlice",
      metadata: { name, namespace: NS, labels: { "kubernetes.io/service-name": service } },
      addressType: "IPv4",
      endpoints: [{ addresses: [`${LOOPBACK}.5.2`], conditions: { ready, serving: ready, terminating: false } }],
      ports: [{ name: "selection-http", port: 9093, protocol: "TCP" }],
    });
    api.upsert(slice("peer-1", "dynamo-epp-peer", true));
    api.upsert(slice("other-1", "dynamo-epp", false));
    const discovery = api.kubeConfig.makeApiClient(DiscoveryV1Api);
    const list = await discovery.listNamespacedEndpointSlice({ namespace: NS, labelSelector: "kubernetes.io/service-name=dynamo-epp-peer" });
    expect(list.items.map((s) => s.metadata?.name)).toEqual(["peer-1"]);
    expect(list.items[0]?.endpoints?.[0]?.conditions?.ready).toBe(true);
    expect(Number(list.metadata?.resourceVersion)).toBe(api.resourceVersion);
  }, 30_000);

  test("InferencePools and unknown custom resources work through CustomObjectsApi, including patches", async () => {
    const custom = api.kubeConfig.makeApiClient(CustomObjectsApi);
    const group = "inference.networking.k8s.io";
    await custom.createNamespacedCustomObject({
      group,
      version: "v1",
      namespace: NS,
      plural: "inferencepools",
      body: { apiVersion: `${group}/v1`, kind: "InferencePool", metadata: { name: "pool" }, spec: { selector: { matchLabels: { app: "w" } }, targetPorts: [{ number: 8000 }] } },
    });
    const got = await custom.getNamespacedCustomObject({ group, version: "v1", namespace: NS, plural: "inferencepools", name: "pool" });
    expect(got.spec.targetPorts[0].number).toBe(8000);

    await custom.patchNamespacedCustomObject(
      { group, version: "v1", namespace: NS, plural: "inferencepools", name: "pool", body: { spec: { targetPorts: [{ number: 8001 }] } } },
      setHeaderOptions("Content-Type", PatchStrategy.MergePatch),
    );
    await custom.patchNamespacedCustomObject({
      group, version: "v1", namespace: NS, plural: "inferencepools", name: "pool",
      body: [{ op: "add", path: "/metadata/labels", value: { tier: "gold" } }],
    });
    const after = api.get("InferencePool", NS, "pool")!;
    expect((after.spec as { targetPorts: { number: number }[] }).targetPorts[0]!.number).toBe(8001);
    expect(after.metadata?.labels).toEqual({ tier: "gold" });
    expect(after.metadata?.generation).toBe(2);

    await custom.createNamespacedCustomObject({
      group: "kv-epp.dev", version: "v1alpha1", namespace: NS, plural: "widgets",
      body: { apiVersion: "kv-epp.dev/v1alpha1", kind: "Widget", metadata: { name: "w1" } },
    });
    const widgets = await custom.listNamespacedCustomObject({ group: "kv-epp.dev", version: "v1alpha1", namespace: NS, plural: "widgets" });
    expect(widgets.kind).toBe("WidgetList");
    expect(widgets.items.map((w: KubernetesObject) => w.metadata?.name)).toEqual(["w1"]);
  }, 30_000);

  test("writes follow API semantics: 409 on a stale update, 404 on a missing object, finalizers, owner garbage collection", async () => {
    const core = api.kubeConfig.makeApiClient(CoreV1Api);
    const owner = await core.createNamespacedPod({ namespace: NS, body: pod("owner", {}) as V1Pod });
    const stale = structuredClone(owner);
    await core.replaceNamespacedPod({ namespace: NS, name: "owner", body: { ...owner, metadata: { ...owner.metadata, labels: { x: "1" } } } });
    await expect(core.replaceNamespacedPod({ namespace: NS, name: "owner", body: stale })).rejects.toMatchObject({ code: 409 });
    await expect(core.readNamespacedPod({ namespace: NS, name: "nope" })).rejects.toMatchObject({ code: 404 });

    await core.createNamespacedConfigMap({
      namespace: NS,
      body: { metadata: { name: "owned", ownerReferences: [{ apiVersion: "v1", kind: "Pod", name: "owner", uid: owner.metadata!.uid! }] }, data: { k: "v" } },
    });
    await core.createNamespacedConfigMap({ namespace: NS, body: { metadata: { name: "held", finalizers: ["testkit/hold"] } } });

    // Owned by two pods (a record shared by replicas): it outlives the first owner, losing that
    // reference, and goes with the last, as Kubernetes' garbage collector does.
    const second = await core.createNamespacedPod({ namespace: NS, body: pod("second-owner", {}) as V1Pod });
    const ref = (o: V1Pod) => ({ apiVersion: "v1", kind: "Pod", name: o.metadata!.name!, uid: o.metadata!.uid! });
    await core.createNamespacedConfigMap({ namespace: NS, body: { metadata: { name: "shared", ownerReferences: [ref(owner), ref(second)] } } });

    await core.deleteNamespacedPod({ namespace: NS, name: "owner" });
    expect(api.get("ConfigMap", NS, "owned")).toBeUndefined();
    expect(api.get("ConfigMap", NS, "shared")?.metadata?.ownerReferences).toEqual([ref(second)]);
    await core.deleteNamespacedPod({ namespace: NS, name: "second-owner" });
    expect(api.get("ConfigMap", NS, "shared")).toBeUndefined();

    await core.deleteNamespacedConfigMap({ namespace: NS, name: "held" });
    const held = await core.readNamespacedConfigMap({ namespace: NS, name: "held" });
    expect(held.metadata?.deletionTimestamp).toBeDefined();
    await core.replaceNamespacedConfigMap({ namespace: NS, name: "held", body: { ...held, metadata: { ...held.metadata, finalizers: [] } } });
    expect(api.get("ConfigMap", NS, "held")).toBeUndefined();
  }, 30_000);

  test("the status subresource changes only status", async () => {
    const core = api.kubeConfig.makeApiClient(CoreV1Api);
    const p = await core.createNamespacedPod({ namespace: NS, body: pod("s", { app: "w" }) as V1Pod });
    await core.replaceNamespacedPodStatus({ namespace: NS, name: "s", body: { ...p, metadata: { ...p.metadata, labels: { app: "changed" } }, status: { phase: "Failed" } } });
    const after = api.get("pods", NS, "s")!;
    expect(after.metadata?.labels).toEqual({ app: "w" });
    expect((after.status as { phase: string }).phase).toBe("Failed");
  }, 30_000);

  test("an authorize hook answers 403 for what it refuses", async () => {
    await api.close();
    api = await startFakeKubeApi({ authorize: (r) => r.verb === "get" || r.verb === "list" || r.verb === "watch" });
    const core = api.kubeConfig.makeApiClient(CoreV1Api);
    await core.listNamespacedPod({ namespace: NS });
    await expect(core.createNamespacedPod({ namespace: NS, body: pod("x", {}) as V1Pod })).rejects.toMatchObject({ code: 403 });
    expect(api.requests.map((r) => `${r.verb}:${r.status}`)).toEqual(["list:200", "create:403"]);
  }, 30_000);

  test("a child process finds the server through KUBECONFIG (writeKubeconfig)", async () => {
    api.upsert(pod("from-parent", { app: "w" }));
    const path = join(api.kubeconfigPath, "..", "second-kubeconfig");
    api.writeKubeconfig(path);
    const child = spawnBun([join(import.meta.dir, "fixtures", "list-pods.ts"), NS], { KUBECONFIG: path }, { name: "list-pods" });
    expect(await child.waitForLog(/^pods:/)).toBe("pods: from-parent");
    expect(await child.exited).toBe(0);
  }, 30_000);

  test("close() removes the kubeconfig files the server wrote", async () => {
    const perUser = api.kubeconfigFor("system:serviceaccount:kv:epp");
    expect([existsSync(api.kubeconfigPath), existsSync(perUser)]).toEqual([true, true]);
    await api.close();
    expect(existsSync(dirname(api.kubeconfigPath))).toBe(false);
  });
});
