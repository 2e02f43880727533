import { describe, expect, test } from "bun:test";
import { BoundedLabels, DEFAULT_FAIRNESS_ID, hasCriticalObjective, requestClass, shedReason } from "./gaie-headers.ts";

describe("shedReason: lower priorities are shed first", () => {
  const at = (inflight: number, priority: number, criticalKnown: boolean, queuesFull = false) =>
    shedReason({ priority, inflight, maxInflight: 10, queuesFull, criticalKnown });

  test("sheddable from 80% of the cap, standard from 90% when a critical objective exists, critical only at the cap", () => {
    expect(at(7, -1, true)).toBeUndefined();
    expect(at(8, -1, true)).toContain("sheddable");
    expect(at(8, 0, true)).toBeUndefined();
    expect(at(9, 0, true)).toContain("standard");
    expect(at(9, 3, true)).toBeUndefined();
    expect(at(10, 3, true)).toBe("too many requests in flight");
  });

  test("without critical objectives standard requests run up to the cap, as with no objectives at all", () => {
    expect(at(9, 0, false)).toBeUndefined();
    expect(at(10, 0, false)).toBe("too many requests in flight");
  });

  test("full queues shed sheddable requests only; no cap sheds nothing else", () => {
    expect(at(0, -1, false, true)).toContain("queue");
    expect(at(0, 0, false, true)).toBeUndefined();
    expect(shedReason({ priority: 0, inflight: 1e6, maxInflight: 0, queuesFull: false, criticalKnown: true })).toBeUndefined();
  });

  test("a critical objective is one with a positive priority", () => {
    expect(hasCriticalObjective(new Map([["batch", -1], ["chat", 0]]))).toBe(false);
    expect(hasCriticalObjective(new Map([["batch", -1], ["chat", 5]]))).toBe(true);
  });
});

describe("requestClass", () => {
  const priorities = new Map([["batch", -1], ["chat", 5]]);
  const header = (v: string) => [{ key: "x-gateway-inference-objective", raw_value: Buffer.from(v) }];

  test("an objective's priority is the configured one; an unknown objective, a number included, is standard", () => {
    expect(requestClass({ headers: header("batch") }, priorities).priority).toBe(-1);
    expect(requestClass({ headers: header("chat") }, priorities).priority).toBe(5);
    expect(requestClass({ headers: header("other") }, priorities).priority).toBe(0);
    // A client naming a number gets no priority of its own choosing (it would skip the shedding of standard traffic).
    expect(requestClass({ headers: header("100") }, priorities).priority).toBe(0);
    expect(requestClass({ headers: header("-1") }, priorities).priority).toBe(0);
  });

  test("the x-llm-d-* name wins over the x-gateway-* alias; no fairness id is GAIE's default flow", () => {
    const both = { headers: [{ key: "x-llm-d-inference-objective", raw_value: Buffer.from("chat") }, ...header("batch")] };
    expect(requestClass(both, priorities).priority).toBe(5);
    expect(requestClass(undefined, priorities)).toEqual({ modelRewrite: undefined, priority: 0, fairnessId: DEFAULT_FAIRNESS_ID });
  });
});

describe("BoundedLabels", () => {
  test("pinned names stay themselves through a flood of invented ones, and take no place in the bound", () => {
    const labels = new BoundedLabels(3, 8);
    labels.pin(["served", "rewrite-target-long", ""]);
    expect(["a", "b", "c", "d"].map((n) => labels.label(n))).toEqual(["a", "b", "c", "other"]);
    expect(labels.label("served")).toBe("served");
    // A pinned name is bounded in length as any other, and stays pinned at that length.
    expect(labels.label("rewrite-target-long")).toBe("rewrite-");
    expect(labels.label("")).toBe("other");
  });
});
