import type { Logger } from "pino";
import type { SidecarMetrics } from "./metrics.ts";

/**
 * Both legs of a request at once, for the connectors whose decode worker fetches the KV itself (SGLang's
 * bootstrap rooms, sglang.ts; vLLM's MooncakeConnector, mooncake.ts): llm-d runs the prefill leg in the
 * background and answers the client with the decode leg. The prefill leg is not cancelled when the client or
 * the decode leg finishes first (llm-d detaches it from the client's context: a cut connection would make the
 * prefill worker abort it and free the KV the decode worker is about to read), only bounded by
 * `--prefill-timeout-ms`; its answer is read and dropped.
 */
export type ConcurrentLegs = {
  /** full URLs */
  prefillUrl: string;
  decodeUrl: string;
  prefillBody: string;
  decodeBody: string;
  prefillHeaders: Headers;
  decodeHeaders: Headers;
  prefillTimeoutMs: number;
  /** the client's: ends the decode leg only */
  signal: AbortSignal;
  metrics: SidecarMetrics;
  log: Logger;
  /** called once when the prefill leg failed or the decode worker answered non-2xx (a connector may then forget what it cached about the prefill worker) */
  onFailure?: () => void;
};

/**
 * Sends both legs and resolves with the decode worker's answer (its body not yet read, so it streams); rejects
 * when the decode worker cannot be reached. The prefill leg's failure is logged and counted (`prefill_unreachable`,
 * `prefill_timeout`, `prefill_status`); a decode answer that is not 2xx is counted as `decode_status`.
 */
export async function concurrentLegs(p: ConcurrentLegs): Promise<Response> {
  let failed = false;
  const fail = () => {
    if (failed) return;
    failed = true;
    p.onFailure?.();
  };
  void prefillLeg(p, fail);
  // An unreachable decode worker rejects here: no fault of the prefill side's.
  const res = await fetch(p.decodeUrl, { method: "POST", headers: p.decodeHeaders, body: p.decodeBody, signal: p.signal });
  if (!res.ok) {
    fail();
    p.metrics.failed("decode_status");
    p.log.warn({ status: res.status }, "decode leg failed");
  }
  return res;
}

async function prefillLeg(p: ConcurrentLegs, fail: () => void): Promise<void> {
  const started = performance.now();
  const timeout = AbortSignal.timeout(p.prefillTimeoutMs);
  try {
    const res = await fetch(p.prefillUrl, { method: "POST", headers: p.prefillHeaders, body: p.prefillBody, signal: timeout });
    // Read to its end (JSON, or a stream if the client asked for one): the answer itself is not needed.
    await res.arrayBuffer();
    if (!res.ok) {
      fail();
      p.metrics.failed("prefill_status");
      p.log.warn({ status: res.status }, "prefill leg failed");
      return;
    }
    p.metrics.prefillSeconds((performance.now() - started) / 1000);
  } catch (err) {
    fail();
    const timedOut = timeout.aborted;
    p.metrics.failed(timedOut ? "prefill_timeout" : "prefill_unreachable");
    p.log.warn({ err }, timedOut ? "prefill leg timed out" : "prefill worker unreachable");
  }
}
