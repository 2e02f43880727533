// Reading the EPP's own pick histogram from its /metrics text.
import { describe, expect, test } from "bun:test";
import { histogramQuantile, parseHistogram, PICK_HISTOGRAM } from "./epp-metrics.ts";

// As prom-client writes it, with a neighbour whose name shares the prefix.
const exposition = `# HELP dynamo_epp_pick_duration_seconds time from a complete request body to the decision
# TYPE dynamo_epp_pick_duration_seconds histogram
dynamo_epp_pick_duration_seconds_bucket{le="0.0005"} 40
dynamo_epp_pick_duration_seconds_bucket{le="0.001"} 90
dynamo_epp_pick_duration_seconds_bucket{le="0.005"} 98
dynamo_epp_pick_duration_seconds_bucket{le="0.01"} 100
dynamo_epp_pick_duration_seconds_bucket{le="+Inf"} 100
dynamo_epp_pick_duration_seconds_sum 0.07
dynamo_epp_pick_duration_seconds_count 100
dynamo_epp_pick_duration_seconds_extra_count 7
dynamo_epp_overlap_ratio_bucket{le="1"} 3
`;

describe("EPP pick histogram", () => {
  test("buckets, count and sum are read; other metrics are not", () => {
    const h = parseHistogram(exposition, PICK_HISTOGRAM)!;
    expect(h.count).toBe(100);
    expect(h.sum).toBeCloseTo(0.07);
    expect(h.buckets.map((b) => b.le)).toEqual([0.0005, 0.001, 0.005, 0.01, Infinity]);
    expect(parseHistogram(exposition, "dynamo_epp_absent")).toBeUndefined();
  });

  test("quantiles interpolate inside the bucket they fall in", () => {
    const h = parseHistogram(exposition, PICK_HISTOGRAM)!;
    // rank 50 of 100: 10 of the 50 in (0.5 ms, 1 ms]
    expect(histogramQuantile(h, 0.5)).toBeCloseTo(0.0005 + 0.0005 * (10 / 50));
    // rank 99: 1 of the 2 in (5 ms, 10 ms]
    expect(histogramQuantile(h, 0.99)).toBeCloseTo(0.0075);
    expect(histogramQuantile(h, 0.2)).toBeCloseTo(0.00025);
  });

  test("a quantile in the +Inf bucket is the highest finite bound; an empty histogram has none", () => {
    const h = { buckets: [{ le: 0.01, count: 1 }, { le: Infinity, count: 4 }], count: 4, sum: 1 };
    expect(histogramQuantile(h, 0.99)).toBe(0.01);
    expect(histogramQuantile({ buckets: [{ le: Infinity, count: 0 }], count: 0, sum: 0 }, 0.5)).toBeNaN();
  });
});
