import type { Logger } from "pino";
import { Backoff, sleep, type BackoffPolicy } from "@kv-epp/protocol";
import { PeerSet } from "./peer-set.ts";
import type { PeerDiscovery } from "./discovery/types.ts";
import { DEFAULT_MIN_RATE, type DumpFailureReason, DumpFetchError, fetchDump, type MinRate } from "./dump/client.ts";
import type { DumpParserLimits } from "./dump/parser.ts";
import type { DumpFormat, DumpTarget, EmptyBootstrapReason, Peer, RecoveryOutcome } from "./types.ts";

// The recovery loop (docs/CONTRACTS.md §8). The caller has already started its KV listeners (rule 1, subscribe
// first); this decides where the snapshot comes from and applies it through the staging of `target`.

export type RecoveryState =
  | { kind: "discovering" }
  | { kind: "attempting"; cycle: number; attempt: number; peer: Peer }
  /** `setAside`: this failure was the peer's `maxPeerFailures`-th in a row (or a budget failure); it is not tried again. */
  | { kind: "attempt_failed"; peer: Peer; reason: DumpFailureReason; message: string; failures: number; setAside: boolean }
  | { kind: "backing_off"; cycle: number; delayMs: number }
  | { kind: "recovered"; from: string; events: number; bytes: number; ms: number }
  | { kind: "empty_bootstrap"; reason: EmptyBootstrapReason }
  | { kind: "disabled" };

/** Consecutive failed attempts after which a peer is set aside (DYN_EPP_RECOVERY_PEER_MAX_FAILURES). */
const DEFAULT_MAX_PEER_FAILURES = 3;
/** Between cycles in which every eligible peer failed (CONTRACTS §8 rule 5). */
export const DEFAULT_BACKOFF = { initialMs: 500, maxMs: 30_000, jitter: 0.2 } as const satisfies BackoffPolicy;

export type RunRecoveryOptions = {
  /** Where peers come from; null/undefined when no peer Service and no static peers are configured. */
  discovery: PeerDiscovery | null | undefined;
  target: DumpTarget;
  /** Per-progress HTTP timeout (DYN_EPP_RECOVERY_HTTP_TIMEOUT_MS, default 30000). */
  timeoutMs: number;
  token?: string;
  logger: Logger;
  /** Between cycles of failed attempts (default 500 ms doubling to 30 s). */
  backoff?: Partial<BackoffPolicy>;
  /** Source of the attempt-scoped priorities (tests pass a seeded one). */
  random?: () => number;
  limits?: Partial<DumpParserLimits>;
  /** What one attempt may stage, in bytes (see fetchDump); default: no bound. */
  budgetBytes?: number;
  /** Rate floor of a dump body (default DEFAULT_MIN_RATE; bytesPerSec 0: off). */
  minRate?: MinRate;
  /** Consecutive failures that set a peer aside (default DEFAULT_MAX_PEER_FAILURES; 0: never). */
  maxPeerFailures?: number;
  /**
   * Readiness deadline: after this long recovery gives up (the attempt in flight is aborted) and the replica
   * starts with an empty index (`empty_bootstrap`, reason `deadline`). Default: none, wait for a peer.
   */
  deadlineMs?: number;
  /** Observes every state transition (logs, tests). */
  onState?: (s: RecoveryState) => void;
  /** The body asked for (see fetchDump; default "binary", JSON still accepted). */
  format?: DumpFormat;
  /** Keep the discovery running after recovery (to reuse it, e.g. for replica-agg peers); default: stop it. */
  keepDiscovery?: boolean;
  /** Stops recovery (shutdown): the promise then rejects with the signal's reason. */
  signal?: AbortSignal;
};

export async function runRecovery(opts: RunRecoveryOptions): Promise<RecoveryOutcome> {
  const log = opts.logger.child({ component: "recovery" });
  const enter = (s: RecoveryState) => opts.onState?.(s);
  const discovery = opts.discovery;
  if (!discovery) {
    enter({ kind: "disabled" });
    log.error("recovery disabled: no peer Service (DYN_EPP_PEER_SERVICE) and no static peers configured; this replica starts with an EMPTY KV index and will not recover from peers");
    return { kind: "recovery_disabled" };
  }

  enter({ kind: "discovering" });
  const peerSet = new PeerSet(opts.random ?? Math.random, opts.maxPeerFailures ?? DEFAULT_MAX_PEER_FAILURES);
  const backoff = new Backoff({ ...DEFAULT_BACKOFF, ...opts.backoff });
  let wake: (() => void) | null = null;
  const reconcile = () => {
    if (peerSet.update(discovery.peers())) {
      backoff.reset();
      log.info({ eligible: peerSet.eligibleCount, pending: peerSet.pendingIds(), active: peerSet.active?.id ?? null }, "peer set changed");
      wake?.();
    }
  };
  const unsubscribe = discovery.onChange(reconcile);
  const emptyBootstrap = (reason: EmptyBootstrapReason): RecoveryOutcome => {
    enter({ kind: "empty_bootstrap", reason });
    const why: Record<EmptyBootstrapReason, string> = {
      no_serving_peer: "no serving peer",
      all_peers_left: "every peer left",
      peers_failing: "every serving peer keeps failing its dumps",
      deadline: `the recovery deadline of ${opts.deadlineMs} ms passed`,
    };
    log.warn({ reason, source: discovery.description, setAside: peerSet.setAsideIds() }, `${why[reason]}: starting with an EMPTY KV index (empty bootstrap)`);
    return { kind: "empty_bootstrap", reason };
  };
  // One signal for "stop trying": shutdown (rejects with its reason) or the readiness deadline (empty start).
  const deadline = new AbortController();
  const deadlineTimer = opts.deadlineMs !== undefined && opts.deadlineMs > 0 ? setTimeout(() => deadline.abort(new Error("recovery deadline")), opts.deadlineMs) : undefined;
  const stopSignal = opts.signal ? AbortSignal.any([opts.signal, deadline.signal]) : deadline.signal;
  const minRate = opts.minRate ?? DEFAULT_MIN_RATE;

  try {
    // Discovery may retry for as long as the API server is away: shutdown must not wait for it.
    await untilAborted(discovery.start(), stopSignal);
    peerSet.update(discovery.peers());
    // Rule 2: no serving peer at start means nobody holds an index to wait for.
    if (peerSet.eligibleCount === 0) return emptyBootstrap("no_serving_peer");
    peerSet.newCycle();
    let cycle = 1;
    let attempt = 0;
    for (;;) {
      opts.signal?.throwIfAborted();
      if (deadline.signal.aborted) return emptyBootstrap("deadline");
      const peer = peerSet.next();
      if (peer !== null) {
        attempt++;
        enter({ kind: "attempting", cycle, attempt, peer });
        log.info({ peer: peer.id, cycle, attempt }, "fetching dump from peer");
        try {
          const r = await fetchDump({
            peer, target: opts.target, timeoutMs: opts.timeoutMs, token: opts.token, limits: opts.limits,
            budgetBytes: opts.budgetBytes, minRate, signal: stopSignal, format: opts.format,
          });
          enter({ kind: "recovered", from: peer.id, events: r.events, bytes: r.bytes, ms: r.ms });
          log.info({ peer: peer.id, events: r.events, bytes: r.bytes, ms: r.ms, skippedModels: r.skippedModels, format: r.format }, "dump fetched from peer");
          log.info({ peer: peer.id, events: r.events }, "recovered KV index from peer");
          return { kind: "recovered", peer: peer.id, events: r.events, bytes: r.bytes, ms: r.ms };
        } catch (err) {
          opts.signal?.throwIfAborted();
          if (deadline.signal.aborted) {
            peerSet.fail();
            continue; // the deadline ends the loop at its top
          }
          const reason = err instanceof DumpFetchError ? err.reason : "network";
          const message = err instanceof Error ? err.message : String(err);
          log.warn({ peer: peer.id, reason, err: message, cycle, attempt }, "dump attempt failed, trying the next peer");
          // A dump past the budget is as big next time: that peer is set aside at once.
          const rec = peerSet.fail(reason === "budget");
          if (rec !== null) {
            enter({ kind: "attempt_failed", peer, reason, message, failures: rec.failures, setAside: rec.setAside });
            if (rec.setAside)
              log.warn({ peer: peer.id, reason, err: message, failures: rec.failures }, "peer set aside: its dumps keep failing; it is not tried again unless it leaves and comes back");
          }
          continue;
        }
      }
      // The cycle is exhausted. With nobody eligible left there is nothing to wait for (rule 2 again);
      // with only peers that keep failing, waiting would be forever.
      if (peerSet.eligibleCount === 0) return emptyBootstrap("all_peers_left");
      if (peerSet.usableCount === 0) return emptyBootstrap("peers_failing");
      const delayMs = backoff.next();
      enter({ kind: "backing_off", cycle, delayMs });
      log.warn({ cycle, delayMs, tried: peerSet.triedIds() }, "every eligible peer failed, backing off before a new cycle");
      // Resolves true when woken by a change of the peer set, false after the delay.
      const woken = new AbortController();
      wake = () => woken.abort();
      const changed = await sleep(delayMs, AbortSignal.any([woken.signal, stopSignal])).then(
        () => false,
        (err) => {
          if (!stopSignal.aborted) return true;
          if (deadline.signal.aborted && !opts.signal?.aborted) return true;
          throw err;
        },
      );
      wake = null;
      // A real change during the wait re-evaluates at once: a newly eligible peer is already pending.
      if (!changed) {
        peerSet.newCycle();
        cycle++;
      }
    }
  } catch (err) {
    // The deadline while discovery was still starting: the replica starts empty, as configured.
    if (deadline.signal.aborted && !opts.signal?.aborted) return emptyBootstrap("deadline");
    throw err;
  } finally {
    clearTimeout(deadlineTimer);
    unsubscribe();
    if (!opts.keepDiscovery) await discovery.stop().catch(() => {});
  }
}

/** `p`, or the signal's reason as soon as it aborts (the finally above then stops the discovery). */
function untilAborted<T>(p: Promise<T>, signal: AbortSignal | undefined): Promise<T> {
  if (!signal) return p;
  signal.throwIfAborted();
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => reject(signal.reason);
    signal.addEventListener("abort", onAbort, { once: true });
    p.then(resolve, reject).finally(() => signal.removeEventListener("abort", onAbort));
  });
}
