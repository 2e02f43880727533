import { expect, test } from "bun:test";
import pino from "pino";
import { throttledWarn } from "./log-throttle.ts";

test("one line per reason per interval, then the next says how many were left out", async () => {
  const lines: { reason: string; suppressed?: number }[] = [];
  const warn = throttledWarn(pino({}, { write: (s: string) => void lines.push(JSON.parse(s)) }), "rejected", 50);
  for (let i = 0; i < 100; i++) warn("a");
  warn("b");
  expect(lines.map((l) => l.reason)).toEqual(["a", "b"]);
  await Bun.sleep(60);
  warn("a");
  expect(lines.at(-1)).toMatchObject({ reason: "a", suppressed: 99 });
});
