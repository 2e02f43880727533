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
 *
 * The other way round (llm-d does not do this): a prefill leg that fails (unreachable, non-2xx, timed out)
 * before the decode worker's first body byte cuts the decode leg, and the request fails with PrefillLegFailed.
 * Both decode workers would otherwise wait for KV that never comes, the client with them: vLLM's Mooncake
 * decode until VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT (480 s), SGLang's until SGLANG_DISAGGREGATION_WAITING_TIMEOUT
 * (300 s). The first body byte, not the response headers, is the line: a streaming decode sends its headers
 * before it has the KV, and its first byte (the first token's event) only once it has it; until that byte the
 * client has been sent nothing, so the decode's headers are held back until then and the 502 can still replace
 * them. Once the decode is answering, its KV is there and the prefill's failure no longer matters to it.
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
  /**
   * called once when the prefill leg failed or the decode worker answered 5xx (a connector may then forget what
   * it cached about the prefill worker); a 4xx is the request's own (a client's 400, a 429) and says nothing of it
   */
  onFailure?: () => void;
};

/** A request failed by its prefill leg before the decode worker answered: the client's 502. Counted by its leg. */
export class PrefillLegFailed extends Error {
  constructor(why: string) {
    super(`the prefill leg failed (${why}): the decode leg was cancelled`);
  }
}

/**
 * Sends both legs and resolves with the decode worker's answer (its first body chunk read, the rest not, so it
 * streams); rejects with PrefillLegFailed when the prefill leg failed first, otherwise when the decode worker
 * cannot be reached. The prefill leg's failure is logged and counted (`prefill_unreachable`, `prefill_timeout`,
 * `prefill_status`); a decode answer that is not 2xx is counted as `decode_status`.
 */
export async function concurrentLegs(p: ConcurrentLegs): Promise<Response> {
  let failed = false;
  const fail = () => {
    if (failed) return;
    failed = true;
    p.onFailure?.();
  };
  const cancel = new AbortController();
  const prefillFailed = new AbortController();
  let answering = false;
  void prefillLeg(p, cancel.signal).then((failure) => {
    if (failure === undefined) return;
    fail();
    if (!answering) prefillFailed.abort(new PrefillLegFailed(failure));
  });
  // The client gone wins over a failed prefill: nobody reads the 502.
  const why = (err: unknown) => (prefillFailed.signal.aborted && !p.signal.aborted ? prefillFailed.signal.reason : err);
  const signal = AbortSignal.any([p.signal, prefillFailed.signal]);
  let res: Response;
  try {
    res = await fetch(p.decodeUrl, { method: "POST", headers: p.decodeHeaders, body: p.decodeBody, signal });
  } catch (err) {
    // An unreachable decode worker (or the client gone before it answered): no fault of the prefill side's,
    // and nobody will read the prefill's KV.
    cancel.abort(new DecodeLegFailed());
    throw why(err);
  }
  if (!res.ok) {
    // The decode's own error is the client's answer: a prefill failing now must not cut it.
    answering = true;
    cancel.abort(new DecodeLegFailed());
    if (res.status >= 500) fail();
    p.metrics.failed("decode_status");
    p.log.warn({ status: res.status }, "decode leg failed");
    return res;
  }
  if (!res.body) {
    answering = true;
    return res;
  }
  const reader = res.body.getReader();
  let first: Awaited<ReturnType<typeof reader.read>>;
  try {
    first = await reader.read();
    // Failed while this byte was on its way: the client has still been sent nothing.
    if (prefillFailed.signal.aborted) throw prefillFailed.signal.reason;
  } catch (err) {
    cancel.abort(new DecodeLegFailed());
    reader.cancel().catch(() => undefined);
    throw why(err);
  }
  answering = true;
  const body = new ReadableStream<Uint8Array>({
    start(ctl) {
      if (first.done) ctl.close();
      else ctl.enqueue(first.value);
    },
    async pull(ctl) {
      const next = await reader.read();
      if (next.done) ctl.close();
      else ctl.enqueue(next.value);
    },
    cancel: (reason) => reader.cancel(reason),
  });
  return new Response(body, { status: res.status, statusText: res.statusText, headers: res.headers });
}

/** Why a prefill leg was cancelled: its decode leg failed before streaming. */
class DecodeLegFailed extends Error {
  override name = "AbortError";
  constructor() {
    super("the decode leg failed: the prefill leg is cancelled");
  }
}

/** The prefill leg, to its end: what failed it (the client's 502 message), or undefined (answered 2xx, cancelled, closed). */
async function prefillLeg(p: ConcurrentLegs, cancelled: AbortSignal): Promise<string | undefined> {
  const started = performance.now();
  const peer = new URL(p.prefillUrl).host;
  const timeout = AbortSignal.timeout(p.prefillTimeoutMs);
  try {
    const res = await fetch(p.prefillUrl, { method: "POST", headers: p.prefillHeaders, body: p.prefillBody, signal: AbortSignal.any([timeout, cancelled, ...(p.closing ? [p.closing] : [])]) });
    // Read to its end (JSON, or a stream if the client asked for one): the answer itself is not needed.
    await res.arrayBuffer();
    if (!res.ok) {
      p.metrics.failed("prefill_status");
      p.log.warn({ status: res.status }, "prefill leg failed");
      return `prefill worker ${peer} answered ${res.status}`;
    }
    p.metrics.prefillSeconds((performance.now() - started) / 1000);
    return undefined;
  } catch (err) {
    // Cut by a failed decode leg (counted there): not the prefill side's failure. A leg that failed on its own
    // before the cut (its connection refused) is still counted as such.
    if (cancelled.aborted && !timeout.aborted && (err === cancelled.reason || (err as Error)?.name === "AbortError")) {
      p.log.debug("prefill leg cancelled: its decode leg failed");
      return undefined;
    }
    if (p.closing?.aborted) return undefined;
    const timedOut = timeout.aborted;
    p.metrics.failed(timedOut ? "prefill_timeout" : "prefill_unreachable");
    p.log.warn({ err }, timedOut ? "prefill leg timed out" : "prefill worker unreachable");
    return timedOut ? `prefill worker ${peer} did not answer within ${p.prefillTimeoutMs} ms` : `prefill worker ${peer} unreachable: ${(err as Error)?.message ?? String(err)}`;
  }
}
