import { expect, test } from "bun:test";
import { Registry } from "prom-client";
import { poolMetrics } from "../src/index";

test("pool waits are told apart up to seconds: the budget has no upper bound", async () => {
  const registry = new Registry();
  const observe = poolMetrics(registry);
  for (const ms of [200, 600, 2000]) observe.wait!(ms);
  const text = await registry.metrics();
  const line = (le: string) => text.split("\n").find((l) => l.startsWith(`dynamo_epp_tokenizer_pool_wait_seconds_bucket{le="${le}"}`));
  const bucket = (le: string) => Number(line(le)?.split(" ")[1]);
  expect([bucket("0.1"), bucket("0.25"), bucket("0.5"), bucket("1"), bucket("2.5"), bucket("+Inf")]).toEqual([0, 1, 1, 2, 3, 3]);
});
