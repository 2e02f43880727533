import { afterEach, describe, expect, test } from "bun:test";
import { CoreV1Api, KubeConfig, type V1ConfigMap } from "@kubernetes/client-node";
import { type FakeKubeApi, type FakeKubeApiOptions, startFakeKubeApi, waitFor } from "@kv-epp/testkit";
import { listWatch, type ListWatch, type ListWatchOptions } from "../src/index.ts";

const NS = "llm";
const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function fakeApi(o: FakeKubeApiOptions = {}): Promise<FakeKubeApi> {
  const api = await startFakeKubeApi(o);
  cleanups.push(() => api.close());
  return api;
}

const configMap = (name: string, data: Record<string, string> = {}, labels: Record<string, string> = { app: "x" }) =>
  ({ apiVersion: "v1", kind: "ConfigMap", metadata: { name, namespace: NS, labels }, data }) as never;

type Seen = { snapshots: string[][]; errors: { err: unknown; synced: boolean; attempt: number }[] };

function watchConfigMaps(kubeConfig: KubeConfig, extra: Partial<ListWatchOptions<V1ConfigMap>> = {}): ListWatch<V1ConfigMap> & Seen {
  const core = kubeConfig.makeApiClient(CoreV1Api);
  const seen: Seen = { snapshots: [], errors: [] };
  const lw = listWatch<V1ConfigMap>({
    kubeConfig,
    path: `/api/v1/namespaces/${NS}/configmaps`,
    labelSelector: "app=x",
    list: () => core.listNamespacedConfigMap({ namespace: NS, labelSelector: "app=x" }),
    onSnapshot: (items) => seen.snapshots.push(items.map((c) => `${c.metadata!.name}=${JSON.stringify(c.data ?? {})}`).sort()),
    onError: (err, info) => seen.errors.push({ err, ...info }),
    backoff: { initialMs: 50, maxMs: 400 },
    ...extra,
  });
  cleanups.push(() => lw.stop());
  return Object.assign(lw, seen);
}

const verbs = (api: FakeKubeApi, verb: string) => api.requests.filter((r) => r.plural === "configmaps" && r.verb === verb).length;

describe("listWatch against the fake API server", () => {
  test("the first snapshot is the whole listed set, then every watched change; other labels are not seen", async () => {
    const api = await fakeApi();
    api.upsert(configMap("a"));
    api.upsert(configMap("b"));
    api.upsert(configMap("other", {}, { app: "y" }));
    const lw = watchConfigMaps(api.kubeConfig);
    expect(await lw.synced).toBe(true);
    expect(lw.snapshots).toEqual([["a={}", "b={}"]]);
    expect(lw.fresh).toBe(true);

    api.upsert(configMap("c", { k: "1" }));
    await waitFor(() => lw.snapshots.length === 2, { message: "the added object" });
    api.remove("ConfigMap", NS, "a");
    await waitFor(() => lw.snapshots.length === 3, { message: "the deletion" });
    expect(lw.snapshots.slice(1)).toEqual([["a={}", "b={}", 'c={"k":"1"}'], ["b={}", 'c={"k":"1"}']]);
    expect(lw.items().map((c) => c.metadata!.name).sort()).toEqual(["b", "c"]);
    expect(lw.errors).toEqual([]);
  });

  test("a failed first list publishes nothing (unknown is not empty) and is retried until a list succeeds", async () => {
    let denied = 0;
    const api = await fakeApi({ authorize: (r) => !(r.verb === "list" && denied++ < 2) });
    api.upsert(configMap("a"));
    const lw = watchConfigMaps(api.kubeConfig);
    expect(await lw.synced).toBe(true);
    expect(lw.errors.map((e) => [e.attempt, e.synced])).toEqual([[1, false], [2, false]]);
    expect(lw.snapshots).toEqual([["a={}"]]);
  });

  test("an ended watch resumes from the last version without a relist, and misses nothing", async () => {
    const api = await fakeApi();
    api.upsert(configMap("a"));
    const lw = watchConfigMaps(api.kubeConfig);
    await lw.synced;
    await waitFor(() => verbs(api, "watch") === 1);
    api.dropWatches();
    api.upsert(configMap("b")); // written while no watch is open
    await waitFor(() => lw.snapshots.some((s) => s.includes("b={}")), { message: "the object written between watches" });
    expect(verbs(api, "list")).toBe(1);
    expect(verbs(api, "watch")).toBe(2);
    expect(lw.errors).toEqual([]);
  });

  test("a 410 Gone relists, and the relist's changes come as one snapshot", async () => {
    const api = await fakeApi();
    api.upsert(configMap("a"));
    api.upsert(configMap("b"));
    const lw = watchConfigMaps(api.kubeConfig);
    await lw.synced;
    await waitFor(() => verbs(api, "watch") === 1);
    api.compact();
    api.dropWatches();
    api.remove("ConfigMap", NS, "a");
    api.upsert(configMap("c"));
    api.compact(); // the resumed watch's version is gone too
    await waitFor(() => verbs(api, "list") === 2, { message: "the relist" });
    await waitFor(() => lw.snapshots.at(-1)!.join() === "b={},c={}", { message: "the relisted set" });
    // No half-applied set (b alone, or a, b and c) was ever published.
    expect(lw.snapshots.every((s) => s.join() === "a={},b={}" || s.join() === "b={},c={}")).toBe(true);
    expect(lw.errors).toEqual([]);
  });

  test("after an error the cache is not fresh until a relist succeeds, and the last set is not published again", async () => {
    let refuse = false;
    const api = await fakeApi({ authorize: () => !refuse });
    api.upsert(configMap("a"));
    const lw = watchConfigMaps(api.kubeConfig);
    await lw.synced;
    await waitFor(() => verbs(api, "watch") === 1);
    refuse = true;
    api.dropWatches();
    await waitFor(() => lw.errors.length >= 2, { message: "the resumed watch and a relist refused" });
    expect(lw.fresh).toBe(false);
    expect(lw.errors.every((e) => e.synced)).toBe(true);
    expect(lw.snapshots).toEqual([["a={}"]]); // the last known set stays, unpublished again
    api.upsert(configMap("b"));
    refuse = false;
    await waitFor(() => lw.fresh && lw.snapshots.length === 2, { message: "a relist that succeeded" });
    expect(lw.snapshots[1]).toEqual(["a={}", "b={}"]);
  });

  test("giveUpBeforeSync stops the loop before the first list and rejects synced", async () => {
    const api = await fakeApi({ authorize: () => false });
    const lw = watchConfigMaps(api.kubeConfig, { giveUpBeforeSync: () => true });
    await expect(lw.synced).rejects.toMatchObject({ code: 403 });
    const requests = api.requests.length;
    await Bun.sleep(200); // several backoff periods: nothing more is asked
    expect(api.requests.length).toBe(requests);
    expect(lw.snapshots).toEqual([]);
  });

  test("stop before the first list: synced resolves false and no request follows", async () => {
    const api = await fakeApi({ authorize: () => false });
    const lw = watchConfigMaps(api.kubeConfig);
    await waitFor(() => lw.errors.length >= 1);
    await lw.stop();
    expect(await lw.synced).toBe(false);
    const requests = api.requests.length;
    await Bun.sleep(200);
    expect(api.requests.length).toBe(requests);
  });

  test("an API server that ends every watch at once is not hammered: those restarts back off", async () => {
    let watches = 0;
    const server = Bun.serve({
      hostname: "127.0.0.1",
      port: 0,
      fetch(req) {
        const url = new URL(req.url);
        if (url.searchParams.get("watch") === "true") {
          watches++;
          return new Response("", { headers: { "content-type": "application/json" } });
        }
        return Response.json({ kind: "ConfigMapList", apiVersion: "v1", metadata: { resourceVersion: "7" }, items: [] });
      },
    });
    cleanups.push(() => server.stop(true));
    const kc = new KubeConfig();
    kc.loadFromOptions({
      clusters: [{ name: "c", server: `http://127.0.0.1:${server.port}`, skipTLSVerify: true }],
      users: [{ name: "u", token: "t" }],
      contexts: [{ name: "x", cluster: "c", user: "u" }],
      currentContext: "x",
    });
    const lw = watchConfigMaps(kc, { backoff: { initialMs: 100, maxMs: 10_000 } });
    expect(await lw.synced).toBe(true);
    await Bun.sleep(1000);
    // Pauses of ~100, 200, 400 ms fit in a second: a handful of watches, not hundreds.
    expect(watches).toBeGreaterThanOrEqual(2);
    expect(watches).toBeLessThanOrEqual(6);
    expect(lw.snapshots).toEqual([[]]);
  });
});
