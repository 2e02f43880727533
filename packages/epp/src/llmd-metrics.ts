// The EPP's figures under llm-d's names as well (llm-d-router: docs/metrics.md, pkg/epp/metrics/llm_d_router_metrics.go,
// and pkg/epp/metrics/metrics.go for the deprecated names it still writes beside them): the subset this EPP has the
// values of, so llm-d's dashboards and its multicluster scorer (which reads a remote EPP's pool averages) read it as
// they read llm-d's. Each is written where this EPP records its own figure of the same fact (RequestFigures,
// poolFigures), never counted on a path of its own. The token histograms, and the times per output token, hold what a
// response's usage reports (read by routing's UsageScan, which its quality watch shares), never this EPP's own counts:
// those are the prompt as routed (cut at the routing bound, or unread), not as served; where no usage comes through
// (no response bodies, a stream without usage, a gRPC pool's protobuf) they stay empty rather than be filled from
// those.
import { Counter, Gauge, Histogram, type Registry } from "prom-client";

const MODEL = ["model_name", "target_model_name"] as const;
const REQUEST = [...MODEL, "fairness_id", "priority"] as const;
const POOL = ["name"] as const;

/** llm-d's request latency buckets: 5 ms to an hour. */
const DURATION_BUCKETS = [
  0.005, 0.025, 0.05, 0.1, 0.2, 0.4, 0.6, 0.8, 1, 1.25, 1.5, 2, 3, 4, 5, 6, 8, 10, 15, 20, 30, 45, 60, 120, 180, 240, 300, 360, 480, 600, 900, 1200,
  1800, 2700, 3600,
];
/** llm-d's TTFT buckets: the latency buckets up to two minutes. */
const TTFT_BUCKETS = DURATION_BUCKETS.filter((b) => b <= 120);
/** llm-d's request size buckets: every power of two from 64 B to 1 GiB. */
const REQUEST_SIZE_BUCKETS = Array.from({ length: 25 }, (_, i) => 2 ** (i + 6));
/** llm-d's response size buckets (32778, not 32768, is llm-d's). */
const RESPONSE_SIZE_BUCKETS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32778, 65536];
/** llm-d's prompt and cached token buckets: the response size buckets, then powers of two up to a million tokens. */
const PROMPT_TOKEN_BUCKETS = [...RESPONSE_SIZE_BUCKETS, 131072, 262144, 524288, 1048576];
/** llm-d's output token buckets: the response size buckets up to 8192. */
const OUTPUT_TOKEN_BUCKETS = RESPONSE_SIZE_BUCKETS.filter((b) => b <= 8192);
/** llm-d's normalized time per output token buckets: a millisecond to ten seconds a token. */
const NTPOT_BUCKETS = [0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10];
/** llm-d's streamed time per output token buckets (0.00205 is llm-d's). */
const TPOT_BUCKETS = [0.0005, 0.00205, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.125, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1, 2];
/** llm-d's inter-token latency buckets. */
const ITL_BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1, 2];

/** The series, each current name with its deprecated twin where llm-d still writes one. */
export function llmdSeries(registry: Registry) {
  const registers = [registry];
  const counter = <L extends string>(name: string, help: string, labelNames: readonly L[]) => new Counter({ name, help, labelNames, registers });
  const gauge = <L extends string>(name: string, help: string, labelNames: readonly L[]) => new Gauge({ name, help, labelNames, registers });
  const histogram = <L extends string>(name: string, help: string, labelNames: readonly L[], buckets: number[]) =>
    new Histogram({ name, help, labelNames, buckets, registers });
  const deprecated = (current: string, help: string) => `deprecated name of ${current}: ${help}`;
  const helps = {
    requests: "requests routed, by the model the body names, the model it runs as, fairness id and objective priority",
    errors: "requests that failed, by error code: BadRequest, ServiceUnavailable (no endpoint), ResourceExhausted (shed), Internal, ModelServerError (the upstream answered other than 200)",
    running: "routed requests whose response has not ended",
    requestSize: "bytes of a routed request's body as the client sent it, read before its route",
    responseSize: "bytes of a response's body, once it has ended",
    duration: "seconds from a request's headers to the end of its response",
    inputTokens: "prompt tokens of a request, as the usage in its response reports them",
    outputTokens: "output tokens of a request, as the usage in its response reports them",
    cachedTokens: "prompt tokens a request found cached, as the usage in its response reports them",
    ntpot: "seconds from a request's headers to its response's end, over the output tokens its usage reports",
    ready: "endpoints (API servers) the EPP may route to whose last /metrics scrape succeeded (every routable one when it scrapes none)",
    kv: "mean KV-cache usage (0-1) of the pool's endpoints, as each last reported it",
    queue: "mean waiting requests of the pool's endpoints, as each last reported them",
    runningAvg: "mean running requests of the pool's endpoints, as each last reported them",
  };
  const spread = (of: string) => `sample standard deviation of ${of} across the pool's endpoints, as each last reported it`;
  /** A request histogram and its deprecated twin, which carries the model labels alone. */
  const twins = (name: string, twin: string, help: string, buckets: number[]) =>
    [histogram(name, help, REQUEST, buckets), histogram(twin, deprecated(name, help), MODEL, buckets)] as const;
  const [duration, durationDeprecated] = twins("llm_d_epp_request_duration_seconds", "inference_objective_request_duration_seconds", helps.duration, DURATION_BUCKETS);
  const [requestSize, requestSizeDeprecated] = twins("llm_d_epp_request_size_bytes", "inference_objective_request_sizes", helps.requestSize, REQUEST_SIZE_BUCKETS);
  const [responseSize, responseSizeDeprecated] = twins("llm_d_epp_response_size_bytes", "inference_objective_response_sizes", helps.responseSize, RESPONSE_SIZE_BUCKETS);
  const [inputTokens, inputTokensDeprecated] = twins("llm_d_epp_request_input_tokens", "inference_objective_input_tokens", helps.inputTokens, PROMPT_TOKEN_BUCKETS);
  const [outputTokens, outputTokensDeprecated] = twins("llm_d_epp_request_output_tokens", "inference_objective_output_tokens", helps.outputTokens, OUTPUT_TOKEN_BUCKETS);
  const [cachedTokens, cachedTokensDeprecated] = twins("llm_d_epp_request_cached_tokens", "inference_objective_prompt_cached_tokens", helps.cachedTokens, PROMPT_TOKEN_BUCKETS);
  const [ntpot, ntpotDeprecated] = twins("llm_d_epp_request_ntpot_seconds", "inference_objective_normalized_time_per_output_token_seconds", helps.ntpot, NTPOT_BUCKETS);
  return {
    requests: counter("llm_d_epp_request_total", helps.requests, REQUEST),
    requestsDeprecated: counter("inference_objective_request_total", deprecated("llm_d_epp_request_total", helps.requests), [...MODEL, "priority"]),
    errors: counter("llm_d_epp_request_error_total", helps.errors, [...REQUEST, "error_code"]),
    errorsDeprecated: counter("inference_objective_request_error_total", deprecated("llm_d_epp_request_error_total", helps.errors), [...MODEL, "error_code"]),
    running: gauge("llm_d_epp_request_running", helps.running, REQUEST),
    runningDeprecated: gauge("inference_objective_running_requests", deprecated("llm_d_epp_request_running", helps.running), ["model_name"]),
    duration, durationDeprecated, requestSize, requestSizeDeprecated, responseSize, responseSizeDeprecated,
    inputTokens, inputTokensDeprecated, outputTokens, outputTokensDeprecated, cachedTokens, cachedTokensDeprecated, ntpot, ntpotDeprecated,
    tpot: histogram(
      "llm_d_epp_request_streaming_tpot_seconds",
      "seconds per output token after the first of a streamed response: from its first byte to its end, over its output tokens less one",
      REQUEST,
      TPOT_BUCKETS,
    ),
    itl: histogram("llm_d_epp_request_streaming_itl_seconds", "seconds between consecutive body chunks of a streamed response, as the data plane passes them on", REQUEST, ITL_BUCKETS),
    ttft: histogram(
      "llm_d_epp_request_ttft_seconds",
      "seconds from a request's headers to its first response byte (streaming=\"true\": its body asked for a stream or the response is an event stream; otherwise the whole response's end)",
      [...REQUEST, "streaming"],
      TTFT_BUCKETS,
    ),
    readyEndpoints: gauge("llm_d_epp_ready_endpoints", helps.ready, POOL),
    readyPodsDeprecated: gauge("inference_pool_ready_pods", deprecated("llm_d_epp_ready_endpoints", helps.ready), POOL),
    kvUsage: gauge("llm_d_epp_average_kv_cache_utilization", helps.kv, POOL),
    kvUsageDeprecated: gauge("inference_pool_average_kv_cache_utilization", deprecated("llm_d_epp_average_kv_cache_utilization", helps.kv), POOL),
    queue: gauge("llm_d_epp_average_queue_size", helps.queue, POOL),
    queueDeprecated: gauge("inference_pool_average_queue_size", deprecated("llm_d_epp_average_queue_size", helps.queue), POOL),
    runningAvg: gauge("llm_d_epp_average_running_requests", helps.runningAvg, POOL),
    runningAvgDeprecated: gauge("inference_pool_average_running_requests", deprecated("llm_d_epp_average_running_requests", helps.runningAvg), POOL),
    kvStdDev: gauge("llm_d_epp_std_dev_kv_cache_utilization", spread("KV-cache usage (0-1)"), POOL),
    queueStdDev: gauge("llm_d_epp_std_dev_queue_size", spread("waiting requests"), POOL),
    runningStdDev: gauge("llm_d_epp_std_dev_running_requests", spread("running requests"), POOL),
  };
}

export type LlmdSeries = ReturnType<typeof llmdSeries>;

/** What an endpoint's engine last reported of itself (a scrape of its /metrics). */
export type EndpointLoad = { kvUsage: number; waiting: number; running: number };

const round2 = (x: number) => Math.round(100 * x) / 100;

/**
 * The pool's gauges, read at scrape time, over the routable endpoints whose last scrape succeeded (`endpoints`:
 * each routable one's, undefined when it has none). llm-d counts as ready the pods whose metrics are fresh (updated
 * within --metrics-staleness-threshold, 2 s by default) and takes its means and spreads over those; here a scrape
 * that fails or times out drops the endpoint's, so the last one that succeeded is the fresh one. With `scraping` off
 * nothing is fresh or stale: every routable endpoint counts as ready (llm-d, which always scrapes, would say 0), and
 * the means and spreads are absent. The means and the sample standard deviations (n - 1, as llm-d's) are rounded to
 * hundredths, as llm-d's; where none is fresh they are absent, not the last ones (llm-d leaves its last).
 */
export function poolFigures(s: LlmdSeries, name: string, endpoints: readonly (EndpointLoad | undefined)[], scraping = true): void {
  const pool = { name };
  const fresh = endpoints.filter((e) => e !== undefined);
  const ready = scraping ? fresh.length : endpoints.length;
  s.readyEndpoints.set(pool, ready);
  s.readyPodsDeprecated.set(pool, ready);
  const figures = [
    [s.kvUsage, s.kvUsageDeprecated, s.kvStdDev, (e: EndpointLoad) => e.kvUsage],
    [s.queue, s.queueDeprecated, s.queueStdDev, (e: EndpointLoad) => e.waiting],
    [s.runningAvg, s.runningAvgDeprecated, s.runningStdDev, (e: EndpointLoad) => e.running],
  ] as const;
  for (const [mean, meanTwin, stdDev, of] of figures) {
    if (fresh.length === 0) {
      for (const g of [mean, meanTwin, stdDev]) g.remove(pool);
      continue;
    }
    const values = fresh.map(of);
    const m = values.reduce((sum, v) => sum + v, 0) / values.length;
    const squares = values.reduce((sum, v) => sum + (v - m) ** 2, 0);
    mean.set(pool, round2(m));
    meanTwin.set(pool, round2(m));
    stdDev.set(pool, round2(Math.sqrt(squares / Math.max(1, values.length - 1))));
  }
}
