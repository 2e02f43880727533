import { expect, test } from "bun:test";
import { Handoff } from "./handoff.ts";

const never = () => new AbortController().signal;

test("a value put first is kept until taken; a taker first gets the next value put, the longest-waiting taker first", async () => {
  const h = new Handoff<string>();
  expect(h.put("a", "kept")).toBe(false);
  expect(h.size).toBe(1);
  expect(await h.take("a", never())).toBe("kept");
  expect(h.size).toBe(0);
  const first = h.take("b", never());
  const second = h.take("b", never());
  expect(h.put("b", "one")).toBe(true);
  expect(h.put("b", "two")).toBe(true);
  expect([await first, await second]).toEqual(["one", "two"]);
  expect(h.size).toBe(0);
});

test("withdraw drops only the value still kept; an aborted taker leaves, and the value put after is kept", async () => {
  const h = new Handoff<{ n: number }>();
  const v = { n: 1 };
  h.put("k", v);
  expect(h.withdraw("k", { n: 1 })).toBe(false);
  expect(h.withdraw("k", v)).toBe(true);
  expect(h.withdraw("k", v)).toBe(false);
  const ac = new AbortController();
  const taken = h.take("k", ac.signal);
  ac.abort(new Error("gone"));
  await expect(taken).rejects.toThrow("gone");
  expect(h.put("k", v)).toBe(false);
  expect(h.drain()).toEqual([v]);
  expect(h.size).toBe(0);
  await expect(h.take("k", ac.signal)).rejects.toThrow("gone");
});
