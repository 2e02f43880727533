// InferenceModelRewrites as llm-d's router keeps them: precedence among this pool's rules (the weighted pick
// of a target is @kv-epp/tokenizer's rewrite-rules.test.ts). The watch runs against the testkit's fake API server.
import { describe, expect, test } from "bun:test";
import { waitFor } from "@kv-epp/testkit";
import { kubeTestScope, NS, quiet } from "./kube-test-scope.ts";
import { ruleTarget } from "@kv-epp/tokenizer";
import { startModelRewriteWatch } from "./llmd-resources.ts";
import { ModelRewrites, type RewriteRule } from "./model-rewrites.ts";

const scope = kubeTestScope();
/** The target a body naming `model` gets from the rules `r` hands the body readers (undefined: no rule applies). */
const target = (r: ModelRewrites, model: string) => {
  const rules = r.rules();
  return rules && ruleTarget(rules, model);
};

const rewrite = (name: string, created: string, rules: RewriteRule[], poolRef: Record<string, string> | null = { name: "pool" }, meta: Record<string, unknown> = {}) =>
  ({
    apiVersion: "llm-d.ai/v1alpha2",
    kind: "InferenceModelRewrite",
    metadata: { name, namespace: NS, creationTimestamp: created, ...meta },
    spec: { poolRef, rules },
  }) as never;
const exact = (model: string, ...targets: string[]): RewriteRule => ({ matches: [{ model: { type: "Exact", value: model } }], targets: targets.map((modelRewrite) => ({ modelRewrite })) });
const generic = (...targets: string[]): RewriteRule => ({ targets: targets.map((modelRewrite) => ({ modelRewrite })) });
const T0 = "2026-01-01T00:00:00Z";
const T1 = "2026-01-02T00:00:00Z";

describe("precedence, as llm-d's rewrite store", () => {
  test("an exact match wins over a generic rule, whatever their age; a model no exact rule names takes the oldest generic rule", () => {
    const r = new ModelRewrites();
    r.setWatched([rewrite("old-generic", T0, [generic("base")]), rewrite("new-exact", T1, [exact("chat", "chat-v2")])], "pool");
    expect(target(r, "chat")).toEqual({ target: "chat-v2", rewrite: "new-exact" });
    expect(target(r, "other")).toEqual({ target: "base", rewrite: "old-generic" });
  });

  test("between resources, the oldest wins; within one, the first rule in its list", () => {
    const r = new ModelRewrites();
    r.setWatched(
      [
        rewrite("newer", T1, [exact("chat", "from-newer")]),
        rewrite("older", T0, [exact("chat", "first"), exact("chat", "second"), { matches: [{ model: { value: "a" } }, { model: { value: "b" } }], targets: [{ modelRewrite: "ab" }] }]),
      ],
      "pool",
    );
    expect(target(r, "chat")?.target).toBe("first");
    expect([target(r, "a")?.target, target(r, "b")?.target]).toEqual(["ab", "ab"]); // matches are ORed
  });

  test("only this pool's rewrites (a poolRef naming it, the default group when unset), none being deleted; no rule: undefined", () => {
    const r = new ModelRewrites();
    r.setWatched(
      [
        rewrite("other-pool", T0, [exact("chat", "x")], { name: "other" }),
        rewrite("no-ref", T0, [exact("chat", "x")], null),
        rewrite("other-group", T0, [exact("chat", "x")], { name: "pool", group: "example.com" }),
        rewrite("leaving", T0, [exact("chat", "x")], { name: "pool" }, { deletionTimestamp: T1 }),
      ],
      "pool",
    );
    expect(target(r, "chat")).toBeUndefined();
    r.setWatched([rewrite("mine", T0, [exact("chat", "y")], { name: "pool", group: "inference.networking.k8s.io" })], "pool");
    expect(target(r, "chat")?.target).toBe("y");
  });

  test("the model names of every rule of the pool, winning or not, are its configured names (kept out of the label bound)", () => {
    const r = new ModelRewrites();
    r.setWatched(
      [
        rewrite("newer", T1, [exact("chat", "from-newer")]),
        rewrite("older", T0, [exact("chat", "first"), generic("base", "base-canary")]),
        rewrite("other-pool", T0, [exact("elsewhere", "x")], { name: "other" }),
      ],
      "pool",
    );
    expect([...r.modelNames()].sort()).toEqual(["base", "base-canary", "chat", "first", "from-newer"]);
    expect(r.modelNames()).toBe(r.modelNames());
  });

  test("a rule without targets resolves to the empty model (llm-d answers 400)", () => {
    const r = new ModelRewrites();
    r.setWatched([rewrite("empty", T0, [{ matches: [{ model: { value: "chat" } }] }])], "pool");
    expect(target(r, "chat")).toEqual({ target: "", rewrite: "empty" });
  });
});

test("the watch follows the pool's InferenceModelRewrites as they change", async () => {
  const api = await scope.api();
  api.upsert(rewrite("canary", T0, [exact("chat", "chat-v1")]));
  const into = new ModelRewrites();
  let changes = 0;
  const w = startModelRewriteWatch({ kubeConfig: api.kubeConfig, namespace: NS, poolName: "pool", log: quiet, into, onChange: () => changes++, onError: () => {} });
  scope.onCleanup(() => w.stop());
  await waitFor(() => changes > 0, { message: "the first list" });
  expect(target(into, "chat")?.target).toBe("chat-v1");
  api.upsert(rewrite("canary", T0, [exact("chat", "chat-v2")]));
  await waitFor(() => target(into, "chat")?.target === "chat-v2", { message: "the rule changed" });
  api.remove("InferenceModelRewrite", NS, "canary");
  await waitFor(() => target(into, "chat") === undefined, { message: "the rewrite deleted" });
});
