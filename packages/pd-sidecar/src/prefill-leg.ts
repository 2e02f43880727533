import { setTimeout as sleep } from "node:timers/promises";

/**
 * Sending the prefill leg, again when the prefill worker is briefly unable to take it, as llm-d's sidecar
 * does (`--prefill-max-retries`, `--prefill-retry-backoff`): a 502, 503 or 504, or no answer at all (a
 * refused or reset connection, which llm-d's reverse proxy turns into a 502), is sent again to the same
 * worker after a fixed pause, up to the configured number of times; any other answer, 2xx or not, ends
 * it. The same worker, not another candidate: the EPP chose it for the cache it holds, and a worker whose
 * accept queue overflowed under load (the case llm-d retries for) takes the next try. The attempts and
 * pauses together stay within one deadline, `--prefill-timeout-ms` (llm-d's prefill leg has none), and
 * nothing is sent once the client has gone; a pause ends when it goes.
 */

/** Why an attempt was sent again: the label of `pd_sidecar_prefill_retries_total`. */
export type RetryReason = "unreachable" | "status_502" | "status_503" | "status_504";

export type PrefillLegOptions = {
  /** Attempts after the first (0: none, llm-d's default). */
  maxRetries: number;
  /** The pause before each of them. */
  backoffMs: number;
  /** The whole leg, every attempt and pause, ends by then. */
  timeoutMs: number;
};

export type PrefillResult =
  /** The last answer read whole: a success, a status not retried, or the last retried one. */
  | { kind: "answer"; res: Response; text: string }
  /** No answer on the last attempt (or the deadline passed while waiting for one). */
  | { kind: "unreachable"; error: unknown }
  /** The client went away: nothing more was sent. */
  | { kind: "client_gone" };

const RETRIED: Readonly<Record<number, RetryReason>> = { 502: "status_502", 503: "status_503", 504: "status_504" };

function retryReason(result: Exclude<PrefillResult, { kind: "client_gone" }>): RetryReason | undefined {
  return result.kind === "unreachable" ? "unreachable" : RETRIED[result.res.status];
}

export async function sendPrefill(
  url: string,
  request: { headers: Headers; body: string },
  client: AbortSignal,
  opts: PrefillLegOptions,
  onRetry: (reason: RetryReason) => void,
): Promise<PrefillResult> {
  const deadline = performance.now() + opts.timeoutMs;
  const timeout = AbortSignal.timeout(opts.timeoutMs);
  const signal = AbortSignal.any([client, timeout]);
  for (let attempt = 0; ; attempt++) {
    if (client.aborted) return { kind: "client_gone" };
    let last: Exclude<PrefillResult, { kind: "client_gone" }>;
    try {
      const res = await fetch(url, { method: "POST", headers: request.headers, body: request.body, signal });
      last = { kind: "answer", res, text: await res.text() };
    } catch (error) {
      if (client.aborted) return { kind: "client_gone" };
      last = { kind: "unreachable", error };
    }
    const reason = retryReason(last);
    // No time left for a pause and another attempt: the last failure is the answer, as when retries run out.
    if (reason === undefined || attempt >= opts.maxRetries || deadline - performance.now() <= opts.backoffMs) return last;
    await sleep(opts.backoffMs, undefined, { signal }).catch(() => undefined);
    if (client.aborted) return { kind: "client_gone" };
    if (timeout.aborted) return last;
    onRetry(reason);
  }
}
