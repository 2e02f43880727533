// The EPP's figures under llm-d's names as well (llm-d-router: docs/metrics.md, pkg/epp/metrics/llm_d_router_metrics.go,
// and pkg/epp/metrics/metrics.go for the deprecated names it still writes beside them): the subset this EPP has the
// values of, so llm-d's dashboards and its multicluster scorer (which reads a remote EPP's pool averages) read it as
// they read llm-d's. Each is written where this EPP records its own figure of the same fact (RequestFigures,
// poolFigures), never counted on a path of its own.
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
    ready: "endpoints (API servers) of the pool the EPP may route to",
    kv: "mean KV-cache usage (0-1) of the pool's endpoints, as each last reported it",
    queue: "mean waiting requests of the pool's endpoints, as each last reported them",
    runningAvg: "mean running requests of the pool's endpoints, as each last reported them",
  };
  return {
    requests: counter("llm_d_epp_request_total", helps.requests, REQUEST),
    requestsDeprecated: counter("inference_objective_request_total", deprecated("llm_d_epp_request_total", helps.requests), [...MODEL, "priority"]),
    errors: counter("llm_d_epp_request_error_total", helps.errors, [...REQUEST, "error_code"]),
    errorsDeprecated: counter("inference_objective_request_error_total", deprecated("llm_d_epp_request_error_total", helps.errors), [...MODEL, "error_code"]),
    running: gauge("llm_d_epp_request_running", helps.running, REQUEST),
    runningDeprecated: gauge("inference_objective_running_requests", deprecated("llm_d_epp_request_running", helps.running), ["model_name"]),
    duration: histogram("llm_d_epp_request_duration_seconds", helps.duration, REQUEST, DURATION_BUCKETS),
    durationDeprecated: histogram("inference_objective_request_duration_seconds", deprecated("llm_d_epp_request_duration_seconds", helps.duration), MODEL, DURATION_BUCKETS),
    requestSize: histogram("llm_d_epp_request_size_bytes", helps.requestSize, REQUEST, REQUEST_SIZE_BUCKETS),
    requestSizeDeprecated: histogram("inference_objective_request_sizes", deprecated("llm_d_epp_request_size_bytes", helps.requestSize), MODEL, REQUEST_SIZE_BUCKETS),
    responseSize: histogram("llm_d_epp_response_size_bytes", helps.responseSize, REQUEST, RESPONSE_SIZE_BUCKETS),
    responseSizeDeprecated: histogram("inference_objective_response_sizes", deprecated("llm_d_epp_response_size_bytes", helps.responseSize), MODEL, RESPONSE_SIZE_BUCKETS),
    ttft: histogram(
      "llm_d_epp_request_ttft_seconds",
      "seconds from a request's headers to its first response byte (streaming=\"true\": an event stream; otherwise the whole response's end)",
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
  };
}

export type LlmdSeries = ReturnType<typeof llmdSeries>;

/** What an endpoint's engine last reported of itself (a scrape of its /metrics). */
export type EndpointLoad = { kvUsage: number; waiting: number; running: number };

/**
 * The pool's gauges, read at scrape time: the endpoints the EPP may route to, and the means of what those scraped
 * report (rounded to hundredths, as llm-d's). Where none has been scraped the means are absent, not the last ones.
 */
export function poolFigures(s: LlmdSeries, name: string, endpoints: readonly (EndpointLoad | undefined)[]): void {
  const pool = { name };
  s.readyEndpoints.set(pool, endpoints.length);
  s.readyPodsDeprecated.set(pool, endpoints.length);
  const scraped = endpoints.filter((e) => e !== undefined);
  const means = [
    [s.kvUsage, s.kvUsageDeprecated, (e: EndpointLoad) => e.kvUsage],
    [s.queue, s.queueDeprecated, (e: EndpointLoad) => e.waiting],
    [s.runningAvg, s.runningAvgDeprecated, (e: EndpointLoad) => e.running],
  ] as const;
  for (const [current, twin, of] of means) {
    if (scraped.length === 0) {
      current.remove(pool);
      twin.remove(pool);
      continue;
    }
    const mean = Math.round((100 * scraped.reduce((sum, e) => sum + of(e), 0)) / scraped.length) / 100;
    current.set(pool, mean);
    twin.set(pool, mean);
  }
}
