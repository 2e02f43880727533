import { Counter, Histogram, Registry } from "prom-client";
import type { RetryReason } from "./prefill-leg.ts";

/** The sidecar's own metrics (`GET /sidecar/metrics`; `/metrics` is the decode worker's, passed through). */
export type SidecarMetrics = {
  registry: Registry;
  /** disaggregated: prefilled remotely; local: no prefiller named; passthrough: any other route */
  request(mode: "disaggregated" | "local" | "passthrough"): void;
  /**
   * a request refused or failed before its decode leg (client_closed: its client went away during the prefill leg);
   * with --kv-connector sglang or mooncake (legs at once, concurrent-legs.ts) also a prefill leg that failed beside
   * its decode leg (`prefill_timeout` there) and a decode answer not 2xx; with mooncake, a prefill worker's bootstrap
   * server that did not answer /query (`bootstrap_unreachable`) or gave no usable engine id (`bootstrap_answer`)
   */
  failed(
    reason: "forbidden" | "bad_header" | "bad_body" | "prefill_unreachable" | "prefill_status" | "prefill_answer" | "client_closed" | "decoder_unreachable"
      | "passthrough_unreachable" | "prefill_timeout" | "decode_status" | "bootstrap_unreachable" | "bootstrap_answer",
  ): void;
  /** a prefill attempt sent again, by what the one before it got */
  retried(reason: RetryReason): void;
  prefillSeconds(s: number): void;
  /** with --kv-connector mooncake: the EPP named a prefill rank the engine map lacks, and a drawn rank served the request */
  rankFallback(): void;
};

export function createMetrics(): SidecarMetrics {
  const registry = new Registry();
  const requests = new Counter({ name: "pd_sidecar_requests_total", help: "Requests by how they were served.", labelNames: ["mode"], registers: [registry] });
  const failures = new Counter({ name: "pd_sidecar_failures_total", help: "Requests refused or failed, by reason (before the decode leg; with --kv-connector sglang or mooncake either leg).", labelNames: ["reason"], registers: [registry] });
  const retries = new Counter({ name: "pd_sidecar_prefill_retries_total", help: "Prefill attempts sent again, by what the attempt before got.", labelNames: ["reason"], registers: [registry] });
  const prefill = new Histogram({
    name: "pd_sidecar_prefill_duration_seconds", help: "Prefill leg, from sending it to its answer, retries included.",
    buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30], registers: [registry],
  });
  const fallbacks = new Counter({
    name: "pd_sidecar_prefill_rank_fallbacks_total", registers: [registry],
    help: "Mooncake requests whose EPP-named prefill rank was not in the prefill worker's engine map, served on a drawn rank.",
  });
  return {
    registry,
    request: (mode) => requests.inc({ mode }),
    failed: (reason) => failures.inc({ reason }),
    retried: (reason) => retries.inc({ reason }),
    prefillSeconds: (s) => prefill.observe(s),
    rankFallback: () => fallbacks.inc(),
  };
}
