import { expect, test } from "bun:test";
import { Registry } from "prom-client";
import { llmdSeries, poolFigures } from "./llmd-metrics.ts";

test("the pool's gauges carry the pool's name; with no endpoint scraped the means are absent, not the last ones", async () => {
  const registry = new Registry();
  const s = llmdSeries(registry);
  poolFigures(s, "pool-a", [{ kvUsage: 0.1, waiting: 1, running: 4 }, undefined, { kvUsage: 0.2, waiting: 2, running: 5 }]);
  let text = await registry.metrics();
  expect(text).toContain('llm_d_epp_ready_endpoints{name="pool-a"} 3');
  expect(text).toContain('inference_pool_ready_pods{name="pool-a"} 3');
  // Over the two scraped: 0.15000000000000002 rounds to 0.15.
  expect(text).toContain('llm_d_epp_average_kv_cache_utilization{name="pool-a"} 0.15');
  expect(text).toContain('inference_pool_average_queue_size{name="pool-a"} 1.5');
  expect(text).toContain('llm_d_epp_average_running_requests{name="pool-a"} 4.5');
  poolFigures(s, "pool-a", [undefined]);
  text = await registry.metrics();
  expect(text).toContain('llm_d_epp_ready_endpoints{name="pool-a"} 1');
  expect(text).not.toMatch(/^(llm_d_epp|inference_pool)_average_\w+\{/m);
});
