import { describe, expect, test } from "bun:test";
import { hasCriticalObjective, shedReason } from "./gaie-headers.ts";

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
