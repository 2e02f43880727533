import { describe, expect, test } from "bun:test";
import { Backoff, pause, sleep } from "../src/index.ts";

describe("Backoff", () => {
  test("grows by its factor to the cap and reset() starts over", () => {
    const b = new Backoff({ initialMs: 10, factor: 3, maxMs: 50 });
    expect([b.next(), b.next(), b.next(), b.peek()]).toEqual([10, 30, 50, 50]);
    b.reset();
    expect(b.next()).toBe(10);
  });
  test("doubles by default; jitter stays within ±jitter of the unjittered delay", () => {
    const b = new Backoff({ initialMs: 100, maxMs: 1_000, jitter: 0.2 });
    for (const base of [100, 200, 400, 800, 1_000, 1_000]) {
      const d = b.next();
      expect(d).toBeGreaterThanOrEqual(base * 0.8);
      expect(d).toBeLessThanOrEqual(base * 1.2);
    }
  });
});

describe("sleep", () => {
  test("rejects with the abort reason, at once when already aborted", async () => {
    const c = new AbortController();
    const p = sleep(60_000, c.signal);
    c.abort(new Error("stop"));
    await expect(p).rejects.toThrow("stop");
    await expect(sleep(1, c.signal)).rejects.toThrow("stop");
  });
  test("resolves after the time; a later abort changes nothing", async () => {
    const c = new AbortController();
    await sleep(1, c.signal);
    c.abort(new Error("late"));
    await expect(sleep(0)).resolves.toBeUndefined();
  });
  test("pause resolves false on abort instead of rejecting", async () => {
    const c = new AbortController();
    const p = pause(60_000, c.signal);
    c.abort();
    expect(await p).toBe(false);
    expect(await pause(1, new AbortController().signal)).toBe(true);
  });
});
