// The EPP's attachment-intents input, kept up for the EPP's lifetime: discovery opened, the intent host
// started (it retries its own advertisement in the background), and both reopened from scratch when
// the discovery cannot be reached or its lease ends (an HTTP store restarted and withdrew our records,
// a watch that cannot resume). Before, a store that was down when the EPP started, or restarted once,
// turned intents off until the EPP itself restarted. Meanwhile the last intents received stay in force.
import type { KubeConfig } from "@kubernetes/client-node";
import {
  intentWorkers, openDiscovery, REGISTER_BACKOFF, startIntentHost,
  type Discovery, type DiscoveryConfig, type IntentHost, type IntentHostState, type IntentWorker,
} from "@kv-epp/intents";
import { Backoff, pause, type BackoffPolicy } from "@kv-epp/protocol";
import type { Logger } from "pino";

export type IntentSourceOptions = {
  where: DiscoveryConfig;
  hostInstance: string;
  kubeConfig: () => KubeConfig | undefined;
  log: Logger;
  /** Every failed attempt (opening, advertising) and every lost lease. */
  countError: () => void;
  onWorkers: (workers: IntentWorker[]) => void;
  /** Between reopening attempts (default 1 s doubling to 30 s). */
  backoff?: BackoffPolicy;
  /** An open not settled by then counts as failed (default 10 s): an HTTP store that accepts and never answers. */
  openTimeoutMs?: number;
};

export type IntentSource = {
  /** Settles once the first attempt has opened the discovery or failed, or after 5 s (readiness waits no longer). */
  firstAttempt: Promise<void>;
  stop(): Promise<void>;
};

const STOP_WAIT_MS = 5000;
const FIRST_ATTEMPT_WAIT_MS = 5000;
const OPEN_TIMEOUT_MS = 10_000;

export function startIntentSource(o: IntentSourceOptions): IntentSource {
  // Jitter (±20%) so replicas that lost one store together do not reopen in lockstep.
  const backoff = new Backoff({ ...(o.backoff ?? REGISTER_BACKOFF), jitter: 0.2 });
  const stopping = new AbortController();
  let firstDone: () => void = () => {};
  const firstAttempt = new Promise<void>((r) => (firstDone = r));
  // Readiness waits for the first attempt, but not for an open that hangs (a store that accepts and
  // never answers): intents are an input the EPP can serve without.
  const firstWait = setTimeout(() => {
    o.log.warn({ ms: FIRST_ATTEMPT_WAIT_MS }, "attachment intents discovery still connecting; not waiting for it");
    firstDone();
  }, FIRST_ATTEMPT_WAIT_MS);
  void firstAttempt.then(() => clearTimeout(firstWait));
  const loop = (async () => {
    let failures = 0;
    while (!stopping.signal.aborted) {
      let discovery: Discovery | undefined;
      let host: IntentHost | undefined;
      try {
        discovery = await openWithin(openDiscovery(o.where, { kubeConfig: o.where.kind === "kubernetes" ? o.kubeConfig() : undefined, log: o.log }), o.openTimeoutMs ?? OPEN_TIMEOUT_MS);
        if (stopping.signal.aborted) break; // stopped while opening: `finally` closes it
        host = await startIntentHost({
          discovery,
          hostInstance: o.hostInstance,
          log: o.log,
          onState: stateLogger(o),
          // Nothing reaches the worker set once stopping (the EPP closes its listeners next).
          onChange: (desired) => void (stopping.signal.aborted || o.onWorkers(intentWorkers(desired))),
        });
        if (stopping.signal.aborted) break;
        if (failures > 0) o.log.info({ attempts: failures + 1 }, "attachment intents discovery open again");
        failures = 0;
        firstDone();
        const since = performance.now();
        await aborted(AbortSignal.any([discovery.lease, stopping.signal]));
        if (stopping.signal.aborted) break;
        o.countError();
        o.log.warn({ reason: String(discovery.lease.reason) }, "attachment intents: the discovery lease ended, reopening");
        // A lease that held for a while starts the backoff over; one that keeps ending at once does not.
        if (performance.now() - since >= backoff.policy.maxMs) backoff.reset();
      } catch (err) {
        o.countError();
        // Logged once per outage; the counter has every attempt.
        if (failures++ === 0) o.log.error({ err: String(err) }, "attachment intents unavailable, retrying in the background");
        firstDone();
      } finally {
        await host?.stop().catch(() => {});
        await discovery?.close().catch(() => {});
      }
      if (stopping.signal.aborted) break;
      await pause(backoff.next(), stopping.signal);
    }
    firstDone();
  })();
  return {
    firstAttempt,
    stop: async () => {
      stopping.abort();
      // An open still connecting (an unreachable host can take the OS's connect timeout) is not
      // waited for: the loop closes what it opens once it returns.
      const done = new AbortController();
      await Promise.race([loop.finally(() => done.abort()), pause(STOP_WAIT_MS, done.signal)]);
    },
  };
}

/** Counts the host's failed attempts (a lost lease is counted by the loop); logs once per state change. */
function stateLogger(o: IntentSourceOptions): (st: IntentHostState) => void {
  let last: IntentHostState["kind"] = "starting";
  return (st) => {
    if (st.kind === "retrying") o.countError();
    if (st.kind === last) return;
    last = st.kind;
    if (st.kind === "retrying") o.log.warn({ err: st.error, attempt: st.attempt }, "attachment intents unavailable, retrying in the background");
    else if (st.kind === "failed") o.log.error({ err: st.error }, "attachment intents unavailable: the discovery lease ended");
    else o.log.info({ state: st.kind }, "attachment intents host state");
  };
}

/** The open, or a rejection after `ms`; an open that settles later is closed. */
async function openWithin(open: Promise<Discovery>, ms: number): Promise<Discovery> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`discovery did not open within ${ms} ms`)), ms);
  });
  try {
    return await Promise.race([open, late]);
  } catch (err) {
    void open.then((d) => d.close(), () => {});
    throw err;
  } finally {
    clearTimeout(timer);
  }
}

function aborted(signal: AbortSignal): Promise<void> {
  if (signal.aborted) return Promise.resolve();
  return new Promise((r) => signal.addEventListener("abort", () => r(), { once: true }));
}
