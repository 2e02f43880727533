// The rule that applies to a body's model, and the weighted pick of its target (llm-d's selectWeightedModel).
import { describe, expect, test } from "bun:test";
import { ruleTarget, weightedTarget, type RewriteRules, type TargetModel } from "./rewrite-rules";

test("an exact rule over the generic one, which also takes a body naming no model; no rule: undefined", () => {
  const rules: RewriteRules = { exact: new Map([["chat", { rewrite: "canary", targets: [{ modelRewrite: "chat-v2" }] }]]), generic: { rewrite: "all", targets: [{ modelRewrite: "base" }] } };
  expect(ruleTarget(rules, "chat")).toEqual({ target: "chat-v2", rewrite: "canary" });
  expect([ruleTarget(rules, "other")?.target, ruleTarget(rules, undefined)?.target]).toEqual(["base", "base"]);
  expect(ruleTarget({ exact: rules.exact }, "other")).toBeUndefined();
  expect(ruleTarget({ exact: new Map([["chat", { rewrite: "empty", targets: [] }]]) }, "chat")).toEqual({ target: "", rewrite: "empty" });
});

describe("the weighted pick, as llm-d's selectWeightedModel", () => {
  /** How often each target is picked over `n` evenly spread draws. */
  const shares = (targets: TargetModel[], n = 1000) => {
    const count: Record<string, number> = {};
    for (let i = 0; i < n; i++) {
      const t = weightedTarget(targets, () => (i + 0.5) / n);
      count[t] = (count[t] ?? 0) + 1;
    }
    return count;
  };

  test("weight / sum of the weights", () => {
    expect(shares([{ modelRewrite: "a", weight: 1 }, { modelRewrite: "b", weight: 3 }])).toEqual({ a: 250, b: 750 });
  });

  test("no weights: evenly; mixed weights: an unweighted target is never picked", () => {
    expect(shares([{ modelRewrite: "a" }, { modelRewrite: "b" }])).toEqual({ a: 500, b: 500 });
    expect(shares([{ modelRewrite: "a" }, { modelRewrite: "b", weight: 5 }, { modelRewrite: "c" }])).toEqual({ b: 1000 });
  });
});
