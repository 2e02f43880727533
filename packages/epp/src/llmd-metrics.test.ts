import { expect, test } from "bun:test";
import { Registry } from "prom-client";
import { llmdSeries, poolFigures } from "./llmd-metrics.ts";

test("the pool's gauges carry the pool's name and count the endpoints with a current scrape; with none the means and spreads are absent, not the last ones", async () => {
  const registry = new Registry();
  const s = llmdSeries(registry);
  poolFigures(s, "pool-a", [{ kvUsage: 0.1, waiting: 1, running: 4 }, undefined, { kvUsage: 0.2, waiting: 2, running: 5 }]);
  let text = await registry.metrics();
  // As llm-d counts the pods whose metrics are fresh: not the one whose last scrape failed.
  expect(text).toContain('llm_d_epp_ready_endpoints{name="pool-a"} 2');
  expect(text).toContain('inference_pool_ready_pods{name="pool-a"} 2');
  // Over the two scraped: 0.15000000000000002 rounds to 0.15.
  expect(text).toContain('llm_d_epp_average_kv_cache_utilization{name="pool-a"} 0.15');
  expect(text).toContain('inference_pool_average_queue_size{name="pool-a"} 1.5');
  expect(text).toContain('llm_d_epp_average_running_requests{name="pool-a"} 4.5');
  // Sample standard deviations (n - 1): sqrt(2 x 0.05^2) = 0.0707..., sqrt(2 x 0.5^2) = 0.7071...
  expect(text).toContain('llm_d_epp_std_dev_kv_cache_utilization{name="pool-a"} 0.07');
  expect(text).toContain('llm_d_epp_std_dev_queue_size{name="pool-a"} 0.71');
  expect(text).toContain('llm_d_epp_std_dev_running_requests{name="pool-a"} 0.71');
  // One endpoint: no spread (llm-d divides by at least 1).
  poolFigures(s, "pool-a", [{ kvUsage: 0.3, waiting: 7, running: 1 }]);
  text = await registry.metrics();
  expect(text).toContain('llm_d_epp_std_dev_queue_size{name="pool-a"} 0');
  expect(text).toContain('llm_d_epp_average_queue_size{name="pool-a"} 7');
  poolFigures(s, "pool-a", [undefined]);
  text = await registry.metrics();
  expect(text).toContain('llm_d_epp_ready_endpoints{name="pool-a"} 0');
  expect(text).not.toMatch(/^(llm_d_epp|inference_pool)_(average|std_dev)_\w+\{/m);
});

test("with scraping off every routable endpoint counts as ready, and there are no means or spreads", async () => {
  const registry = new Registry();
  const s = llmdSeries(registry);
  poolFigures(s, "pool-a", [undefined, undefined, undefined], false);
  const text = await registry.metrics();
  expect(text).toContain('llm_d_epp_ready_endpoints{name="pool-a"} 3');
  expect(text).toContain('inference_pool_ready_pods{name="pool-a"} 3');
  expect(text).not.toMatch(/^(llm_d_epp|inference_pool)_(average|std_dev)_\w+\{/m);
});
