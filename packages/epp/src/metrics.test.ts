import { expect, test } from "bun:test";
import { createMetrics, routingMetrics } from "./metrics.ts";

test("a rank's routing series go when it leaves the pool; the others' stay", async () => {
  const m = createMetrics();
  const r = routingMetrics(m);
  r.cachedTokens({ workerId: "a", dpRank: 0 }, 0, false);
  r.observedTtft({ workerId: "a", dpRank: 0 }, 0.1);
  r.cachedTokens({ workerId: "b", dpRank: 1 }, 16, true);
  expect(await m.registry.metrics()).toContain('worker="a"');
  r.forgetRank({ workerId: "a", dpRank: 0 });
  const text = await m.registry.metrics();
  expect(text).not.toContain('worker="a"');
  expect(text).toContain('dynamo_epp_cached_tokens_predictions_total{worker="b",dp_rank="1"} 1');
  expect(text).toContain('dynamo_epp_cached_tokens_mispredictions_total{worker="b",dp_rank="1"} 1');
});

test("the cgroup's CPU throttling is exported as read at scrape time, and not at all where the cgroup does not tell it", async () => {
  let stat = "nr_periods 10\nnr_throttled 2\nthrottled_usec 150000\n";
  const m = createMetrics((path) => (path === "/sys/fs/cgroup/cpu.stat" ? stat : null));
  expect(await m.registry.metrics()).toContain("dynamo_epp_cpu_throttled_seconds_total 0.15");
  stat = "nr_periods 30\nnr_throttled 5\nthrottled_usec 400000\n";
  const text = await m.registry.metrics();
  expect(text).toContain("dynamo_epp_cpu_throttled_seconds_total 0.4");
  expect(text).toContain("dynamo_epp_cpu_throttled_periods_total 5");
  expect(await createMetrics(() => null).registry.metrics()).not.toContain("dynamo_epp_cpu_throttled");
});
