// Reading the EPP's own histograms and counters from its /metrics text.
import { describe, expect, test } from "bun:test";
import {
  histogramQuantile, mergeHistograms, parseHistogram, parseHistograms, parseValues, PICK_HISTOGRAM, shareAbove, TOKENIZER_METRICS, WAIT_METRICS,
  type EppScrape,
} from "./epp-metrics.ts";
import { eppPickText, freshTokensText } from "./report.ts";

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

// The routing-quality families as prom-client writes them: labelled per worker rank.
const quality = `# TYPE dynamo_epp_cached_tokens_predictions_total counter
dynamo_epp_cached_tokens_predictions_total{worker="worker-0",dp_rank="0"} 5
dynamo_epp_cached_tokens_predictions_total{worker="worker-0",dp_rank="1"} 2
dynamo_epp_cached_tokens_predictions_total{worker="worker-1",dp_rank="0"} 3
dynamo_epp_observed_ttft_seconds_bucket{le="0.1",worker="worker-0",dp_rank="0"} 1
dynamo_epp_observed_ttft_seconds_bucket{le="+Inf",worker="worker-0",dp_rank="0"} 4
dynamo_epp_observed_ttft_seconds_sum{worker="worker-0",dp_rank="0"} 2.5
dynamo_epp_observed_ttft_seconds_count{worker="worker-0",dp_rank="0"} 4
dynamo_epp_observed_ttft_seconds_bucket{le="0.1",worker="worker-1",dp_rank="0"} 2
dynamo_epp_observed_ttft_seconds_bucket{le="+Inf",worker="worker-1",dp_rank="0"} 2
dynamo_epp_observed_ttft_seconds_sum{worker="worker-1",dp_rank="0"} 0.1
dynamo_epp_observed_ttft_seconds_count{worker="worker-1",dp_rank="0"} 2
dynamo_epp_inflight_requests 3
`;

describe("EPP routing-quality metrics", () => {
  test("labelled counters and histograms are summed per worker over its ranks; a gauge reads as is", () => {
    expect(parseValues(quality, "dynamo_epp_cached_tokens_predictions_total", "worker")).toEqual(new Map([["worker-0", 7], ["worker-1", 3]]));
    const ttft = parseHistograms(quality, "dynamo_epp_observed_ttft_seconds", "worker");
    expect(ttft.get("worker-0")).toEqual({ buckets: [{ le: 0.1, count: 1 }, { le: Infinity, count: 4 }], count: 4, sum: 2.5 });
    expect(ttft.get("worker-1")!.count).toBe(2);
    expect(parseValues(quality, "dynamo_epp_inflight_requests").get("")).toBe(3);
  });

  test("one worker's histograms from several replicas merge bucket by bucket", () => {
    const ttft = parseHistograms(quality, "dynamo_epp_observed_ttft_seconds", "worker");
    const m = mergeHistograms([ttft.get("worker-0")!, ttft.get("worker-1")!])!;
    expect(m).toEqual({ buckets: [{ le: 0.1, count: 3 }, { le: Infinity, count: 6 }], count: 6, sum: 2.6 });
    expect(mergeHistograms([])).toBeUndefined();
  });
});

const empty = { buckets: [{ le: Infinity, count: 0 }], count: 0, sum: 0 };
const base: EppScrape = {
  pick: empty, overlap: empty, inflight: 0,
  quality: { error: empty, predictions: new Map(), mispredictions: new Map(), ttft: new Map(), releasedWithoutResponseBody: 0 },
};

// The tokenizer pool's families as prom-client writes them (bucket bounds of the EPP's histogram).
const tokenization = `# TYPE dynamo_epp_tokenizer_fresh_tokens histogram
dynamo_epp_tokenizer_fresh_tokens_bucket{le="0"} 1
dynamo_epp_tokenizer_fresh_tokens_bucket{le="16"} 1
dynamo_epp_tokenizer_fresh_tokens_bucket{le="64"} 2
dynamo_epp_tokenizer_fresh_tokens_bucket{le="256"} 3
dynamo_epp_tokenizer_fresh_tokens_bucket{le="1024"} 4
dynamo_epp_tokenizer_fresh_tokens_bucket{le="+Inf"} 4
dynamo_epp_tokenizer_fresh_tokens_sum 800
dynamo_epp_tokenizer_fresh_tokens_count 4
# TYPE dynamo_epp_tokenizer_warmed_tokens_total counter
dynamo_epp_tokenizer_warmed_tokens_total 1200
# TYPE dynamo_epp_tokenizer_budget_fallbacks_total counter
dynamo_epp_tokenizer_budget_fallbacks_total{cause="budget"} 2
dynamo_epp_tokenizer_budget_fallbacks_total{cause="queue"} 1
# TYPE dynamo_epp_tokenizer_decided_early_total counter
dynamo_epp_tokenizer_decided_early_total 5
`;

describe("EPP fresh tokens per pick", () => {
  test("with reply warming as counted, and without: the warmed tokens would have been fresh too", () => {
    const fresh = parseHistogram(tokenization, TOKENIZER_METRICS.fresh)!;
    const warmedTokens = parseValues(tokenization, TOKENIZER_METRICS.warmed).get("")!;
    const fallbacks = parseValues(tokenization, TOKENIZER_METRICS.fallbacks).get("")!;
    const decided = parseValues(tokenization, TOKENIZER_METRICS.decided).get("")!;
    const scrape = { ...base, tokenization: { fresh, warmedTokens, fallbacks, decided } };
    expect(freshTokensText("epp-a", scrape)).toStartWith("epp-a: mean 200 with reply warming, 500 without (p50 ~64, p99 ~");
    expect(freshTokensText("epp-a", scrape)).toEndWith(
      "4 picks tokenized in full; 5 routed once their known prefix settled the pick; 3 more routed on their known prefix, over the tokenization budget)");
  });

  test("a replica without tokenization in a pool says so", () => {
    expect(freshTokensText("epp-a", base)).toBe("epp-a: no pick tokenized in the pool");
  });
});

// A pick's waits as prom-client writes them (the EPP's bucket bounds), beside a pick histogram with a 20 ms bound.
const waits = `dynamo_epp_pick_duration_seconds_bucket{le="0.005"} 90
dynamo_epp_pick_duration_seconds_bucket{le="0.02"} 97
dynamo_epp_pick_duration_seconds_bucket{le="0.05"} 100
dynamo_epp_pick_duration_seconds_bucket{le="+Inf"} 100
dynamo_epp_pick_duration_seconds_sum 0.5
dynamo_epp_pick_duration_seconds_count 100
dynamo_epp_tokenizer_pool_wait_seconds_bucket{le="0.001"} 95
dynamo_epp_tokenizer_pool_wait_seconds_bucket{le="0.01"} 100
dynamo_epp_tokenizer_pool_wait_seconds_bucket{le="+Inf"} 100
dynamo_epp_tokenizer_pool_wait_seconds_sum 0.1
dynamo_epp_tokenizer_pool_wait_seconds_count 100
dynamo_epp_event_loop_lag_seconds_bucket{le="0.001"} 1000
dynamo_epp_event_loop_lag_seconds_bucket{le="0.1"} 1000
dynamo_epp_event_loop_lag_seconds_bucket{le="+Inf"} 1010
dynamo_epp_event_loop_lag_seconds_sum 3
dynamo_epp_event_loop_lag_seconds_count 1010
`;

describe("what a pick waited for", () => {
  test("the share of picks over 20 ms, and the p99 of each wait", () => {
    const pick = parseHistogram(waits, PICK_HISTOGRAM)!;
    expect(shareAbove(pick, 0.02)).toBeCloseTo(0.03);
    expect(shareAbove(pick, 0.01)).toBeUndefined(); // not a bound of the histogram
    const scrape: EppScrape = { ...base, pick, waits: { pool: parseHistogram(waits, WAIT_METRICS.pool), loop: parseHistogram(waits, WAIT_METRICS.loop) } };
    // pool: rank 99 of 100, 4 of the 5 in (1 ms, 10 ms]; loop: rank 999.9 falls in the first bucket; past 100 ms only a bound
    expect(eppPickText("epp-a", scrape)).toBe(
      "epp-a: p50 2.8 ms, p99 40.0 ms (100 picks, 3.0% over 20 ms; waiting for a pool member p99 8.2 ms, event-loop lag p99 1.0 ms)");
    const stalled = { ...scrape, waits: { loop: { ...scrape.waits!.loop!, buckets: [{ le: 0.001, count: 900 }, { le: 0.1, count: 990 }, { le: Infinity, count: 1010 }] } } };
    expect(eppPickText("epp-a", stalled)).toEndWith("3.0% over 20 ms; event-loop lag p99 > 100 ms)");
  });

  test("without the waits (an EPP that does not export them) only the pick is told", () => {
    expect(eppPickText("epp-a", { ...base, pick: parseHistogram(exposition, PICK_HISTOGRAM)! })).toBe("epp-a: p50 0.6 ms, p99 7.5 ms (100 picks)");
  });
});
