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
