import { describe, expect, test } from "bun:test";
import fc from "fast-check";
import { choose, cost } from "./cost.ts";
import { parseVllmMetrics } from "./worker-metrics.ts";

const W = { prefillLoadScale: 1, decodeLoadScale: 1, queueWeight: 0, temperature: 0 };

describe("cost and choice", () => {
  test("cost = prefill_load_scale * max(request_blocks - overlap, 0) + decode load", () => {
    expect(cost({ ...W, prefillLoadScale: 2 }, 10, { overlap: 4, activeBlocks: 3, waiting: 0 })).toBe(2 * 6 + 3);
    expect(cost(W, 10, { overlap: 12, activeBlocks: 0, waiting: 0 })).toBe(0);
    expect(cost({ ...W, queueWeight: 5 }, 0, { overlap: 0, activeBlocks: 0, waiting: 2 })).toBe(10);
  });

  test("temperature 0 always picks a minimum-cost candidate", () => {
    fc.assert(
      fc.property(fc.array(fc.integer({ min: 0, max: 50 }), { minLength: 1, maxLength: 20 }), fc.double({ min: 0, max: 0.999999, noNaN: true }), (costs, r) => {
        const i = choose(costs, 0, () => r);
        expect(costs[i]).toBe(Math.min(...costs));
      }),
    );
  });

  test("ties are broken at random over every tied candidate", () => {
    const seen = new Set<number>();
    let s = 1;
    const random = () => ((s = (s * 48271) % 2147483647) / 2147483647);
    for (let k = 0; k < 400; k++) seen.add(choose([3, 1, 1, 5, 1], 0, random));
    expect(seen).toEqual(new Set([1, 2, 4]));
  });

  test("with a temperature, lower cost is chosen more often but not always", () => {
    let s = 7;
    const random = () => ((s = (s * 48271) % 2147483647) / 2147483647);
    const counts = [0, 0];
    for (let k = 0; k < 2000; k++) counts[choose([0, 10], 0.5, random)]!++;
    expect(counts[0]!).toBeGreaterThan(counts[1]!);
    expect(counts[1]!).toBeGreaterThan(0);
  });

  test("vLLM metrics: running, waiting and KV usage, summed over label sets", () => {
    const m = parseVllmMetrics(
      [
        "# HELP vllm:num_requests_running x",
        'vllm:num_requests_running{model_name="m",engine="0"} 3',
        'vllm:num_requests_running{model_name="m",engine="1"} 2',
        'vllm:num_requests_waiting{model_name="m"} 7',
        'vllm:kv_cache_usage_perc{model_name="m"} 0.25',
        "other_metric 99",
      ].join("\n"),
    );
    expect(m).toMatchObject({ running: 5, waiting: 7, kvUsage: 0.25 });
  });
});
