import { expect, test } from "bun:test";
import { TimingModel } from "../src/index.ts";

test("prefill costs only uncached tokens (at least one), decode slows with the batch, speed scales all", () => {
  const t = new TimingModel({ speed: 1, prefillBaseMs: 2, prefillMsPerToken: 0.5, decodeMsPerToken: 10, decodeBatchFactor: 0.1 });
  expect(t.prefillMs(100, 0)).toBe(52);
  expect(t.prefillMs(100, 96)).toBe(4);
  expect(t.prefillMs(100, 100)).toBe(2.5);
  expect(t.decodeMsPerToken(1)).toBe(10);
  expect(t.decodeMsPerToken(11)).toBe(20);
  expect(t.requestMs(100, 0, 3)).toEqual({ ttftMs: 52, totalMs: 72 });
  const instant = new TimingModel({ speed: 0 });
  expect(instant.requestMs(10_000, 0, 500, 64)).toEqual({ ttftMs: 0, totalMs: 0 });
  expect(new TimingModel({ speed: 2, prefillBaseMs: 1, prefillMsPerToken: 0 }).prefillMs(5, 0)).toBe(2);
});
