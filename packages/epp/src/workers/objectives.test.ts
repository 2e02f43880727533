// InferenceObjectives as llm-d's router keeps them: this pool's objectives give the priorities, the
// static option the rest. Against the testkit's fake API server (real HTTP list and watch).
import { describe, expect, test } from "bun:test";
import { waitFor, type FakeKubeApi } from "@kv-epp/testkit";
import { kubeTestScope, NS, quiet } from "./kube-test-scope.ts";
import { startObjectiveWatch } from "./llmd-resources.ts";
import { ObjectivePriorities, objectivePriorities } from "./objectives.ts";

const scope = kubeTestScope();

const objective = (name: string, priority: number | undefined, poolRef: Record<string, string> = { name: "pool" }, group = "llm-d.ai", meta: Record<string, unknown> = {}) =>
  ({
    apiVersion: `${group}/v1alpha2`,
    kind: "InferenceObjective",
    metadata: { name, namespace: NS, ...meta },
    spec: { ...(priority === undefined ? {} : { priority }), poolRef },
  }) as never;

function watch(api: FakeKubeApi) {
  const seen = { sets: [] as Record<string, number>[], errors: [] as unknown[] };
  const w = startObjectiveWatch({
    kubeConfig: api.kubeConfig,
    namespace: NS,
    poolName: "pool",
    log: quiet,
    onPriorities: (m) => seen.sets.push(Object.fromEntries(m)),
    onError: (err) => seen.errors.push(err),
    backoff: { initialMs: 50, maxMs: 200 },
  });
  scope.onCleanup(() => w.stop());
  return Object.assign(seen, { last: () => seen.sets.at(-1) });
}

const listed = (api: FakeKubeApi, group: string) => api.requests.filter((r) => r.plural === "inferenceobjectives" && r.group === group && r.verb === "list");

test("only this pool's objectives count (poolRef name and group, the CRD's default group when unset), not those being deleted; an unset priority is 0", () => {
  const m = objectivePriorities(
    [
      objective("chat", 10),
      objective("batch", -5, { name: "pool", group: "inference.networking.k8s.io", kind: "InferencePool" }),
      objective("plain", undefined),
      objective("elsewhere", 7, { name: "other-pool" }),
      objective("wrong-group", 7, { name: "pool", group: "example.com" }),
      objective("leaving", 3, { name: "pool" }, "llm-d.ai", { deletionTimestamp: "2026-12-05T00:00:00Z" }),
    ],
    "pool",
  );
  expect(Object.fromEntries(m)).toEqual({ chat: 10, batch: -5, plain: 0 });
});

test("the resource wins over --objective-priorities; the option gives the names no resource gives", () => {
  const p = new ObjectivePriorities(new Map([["chat", 1], ["batch", -1]]));
  expect([p.current().get("chat"), p.current().get("batch"), p.current().size]).toEqual([1, -1, 2]);
  p.setWatched(new Map([["chat", 10], ["gold", 100]]));
  expect(Object.fromEntries(p.current())).toEqual({ chat: 10, batch: -1, gold: 100 });
  expect([...p.current().values()].some((v) => v > 50)).toBe(true);
  p.setWatched(new Map());
  expect(Object.fromEntries(p.current())).toEqual({ chat: 1, batch: -1 });
});

describe("startObjectiveWatch", () => {
  test("follows llm-d.ai's InferenceObjectives naming this pool as they are created, changed and deleted", async () => {
    const api = await scope.api();
    api.upsert(objective("chat", 10));
    api.upsert(objective("elsewhere", 7, { name: "other-pool" }));
    const w = watch(api);
    await waitFor(() => w.sets.length > 0, { message: "the first list" });
    expect(w.last()).toEqual({ chat: 10 });
    api.upsert(objective("batch", -2));
    await waitFor(() => w.last()?.batch === -2, { message: "batch added" });
    api.upsert(objective("chat", 20));
    await waitFor(() => w.last()?.chat === 20, { message: "chat changed" });
    api.upsert(objective("batch", -2, { name: "other-pool" }));
    await waitFor(() => w.last()?.batch === undefined, { message: "batch moved to another pool" });
    api.remove("InferenceObjective", NS, "chat");
    await waitFor(() => JSON.stringify(w.last()) === "{}", { message: "chat deleted" });
    expect(w.errors).toEqual([]);
  });

  test("both groups served: llm-d.ai is followed and the older group's objects are ignored, as llm-d does", async () => {
    const api = await scope.api();
    api.upsert(objective("legacy", 5, { name: "pool" }, "inference.networking.x-k8s.io"));
    api.upsert(objective("chat", 10));
    const w = watch(api);
    await waitFor(() => w.sets.length > 0, { message: "the first list" });
    expect(w.last()).toEqual({ chat: 10 });
    expect(listed(api, "inference.networking.x-k8s.io")).toEqual([]);
  });

  test("llm-d.ai not listable (403 here; 404 when its CRD is missing): the older inference.networking.x-k8s.io group is followed", async () => {
    const api = await scope.api({ authorize: (r) => r.group !== "llm-d.ai" });
    api.upsert(objective("legacy", 5, { name: "pool" }, "inference.networking.x-k8s.io"));
    const w = watch(api);
    await waitFor(() => w.sets.length > 0, { message: "the older group listed" });
    expect(w.last()).toEqual({ legacy: 5 });
    api.upsert(objective("legacy", 6, { name: "pool" }, "inference.networking.x-k8s.io"));
    await waitFor(() => w.last()?.legacy === 6, { message: "watched in the older group" });
    expect(listed(api, "llm-d.ai").length).toBe(1); // given up at once, not retried
    expect(w.errors).toEqual([]);
  });

  test("neither group listable: nothing is published, nothing retried, no error (the static option alone)", async () => {
    const api = await scope.api({ authorize: (r) => r.plural !== "inferenceobjectives" });
    const w = watch(api);
    await waitFor(() => listed(api, "inference.networking.x-k8s.io").length === 1, { message: "both groups tried" });
    await Bun.sleep(300); // several backoff periods
    expect(api.requests.filter((r) => r.plural === "inferenceobjectives").length).toBe(2);
    expect([w.sets, w.errors]).toEqual([[], []]);
  });
});
