import type { Logger } from "pino";
import type { SidecarMetrics } from "./metrics.ts";

/**
 * Both legs of a request at once, for the connectors whose decode worker fetches the KV itself (SGLang's
 * bootstrap rooms, sglang.ts; vLLM's MooncakeConnector, mooncake.ts): llm-d runs the prefill leg in the
 * background and answers the client with the decode leg. The prefill leg is not cancelled when the client
 * hangs up after the decode leg started answering (llm-d detaches it from the client's context: a cut
 * connection would make the prefill worker abort it and free the KV the decode worker is about to read), only
 * bounded by `--prefill-timeout-ms`; its answer is read and dropped. It is cancelled when the decode leg fails
 * before streaming (the decode worker cannot be reached, or answers non-2xx): no decode will read its KV, and
 * the prefill worker would otherwise hold it until its own timeout (SGLang's bootstrap timeout, vLLM's abort
 * timeout) and this leg stay open up to `--prefill-timeout-ms`.
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
  /** the sidecar's close(): ends a prefill leg still running in the background */
  closing?: AbortSignal;
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
  const cancel = new AbortController();
  void prefillLeg(p, fail, cancel.signal);
  let res: Response;
  try {
    res = await fetch(p.decodeUrl, { method: "POST", headers: p.decodeHeaders, body: p.decodeBody, signal: p.signal });
  } catch (err) {
    // An unreachable decode worker (or the client gone before it answered): no fault of the prefill side's,
    // and nobody will read the prefill's KV.
    cancel.abort(new DecodeLegFailed());
    throw err;
  }
  if (!res.ok) {
    cancel.abort(new DecodeLegFailed());
    fail();
    p.metrics.failed("decode_status");
    p.log.warn({ status: res.status }, "decode leg failed");
  }
  return res;
}

/** Why a prefill leg was cancelled: its decode leg failed before streaming. */
class DecodeLegFailed extends Error {
  override name = "AbortError";
  constructor() {
    super("the decode leg failed: the prefill leg is cancelled");
  }
}

async function prefillLeg(p: ConcurrentLegs, fail: () => void, cancelled: AbortSignal): Promise<void> {
  const started = performance.now();
  const timeout = AbortSignal.timeout(p.prefillTimeoutMs);
  try {
    const res = await fetch(p.prefillUrl, { method: "POST", headers: p.prefillHeaders, body: p.prefillBody, signal: AbortSignal.any([timeout, cancelled, ...(p.closing ? [p.closing] : [])]) });
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
    // Cut by a failed decode leg (counted there): not the prefill side's failure. A leg that failed on its own
    // before the cut (its connection refused) is still counted as such.
    if (cancelled.aborted && !timeout.aborted && (err === cancelled.reason || (err as Error)?.name === "AbortError")) {
      p.log.debug("prefill leg cancelled: its decode leg failed");
      return;
    }
    if (p.closing?.aborted) return;
    fail();
    const timedOut = timeout.aborted;
    p.metrics.failed(timedOut ? "prefill_timeout" : "prefill_unreachable");
    p.log.warn({ err }, timedOut ? "prefill leg timed out" : "prefill worker unreachable");
  }
}
