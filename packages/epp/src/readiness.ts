// The readiness sequence (docs/ARCHITECTURE.md, "A recovery, from start to Ready"), in its order:
// the worker sources read -> every KV listener subscribed, buffering (bounded wait) -> recovery from a
// peer into the index -> the buffered live events handed off onto the recovered view -> ready.
// Subscribing before the dump is fetched is what lets nothing published meanwhile be lost. Once ready,
// readiness follows the InferencePool: NOT_SERVING while it is deleted.
import {
  recoveryAttemptMetrics,
  recoveryStateMetric,
  runRecovery,
  staticPeerDiscovery,
  type PeerDiscovery,
  type RecoveryOutcome,
} from "@kv-epp/recovery";
import type { Logger } from "pino";
import type { EppConfig } from "./config.ts";
import type { StreamHandoff } from "./handoff/handoff.ts";
import type { HealthState } from "./health.ts";
import type { Indexers } from "./indexers/indexers.ts";
import type { KubeSources } from "./kube-sources.ts";
import { dumpBodyLimit, recoveryBudget } from "./memory-budget.ts";
import type { Metrics } from "./metrics.ts";
import type { WorkerSet } from "./workers/worker-set.ts";

export type ReadinessOptions = {
  cfg: Pick<
    EppConfig,
    "recovery" | "podIp" | "peerToken" | "subscribeWaitMs" | "recoveryBudgetMiB" | "recoveryMinRate" | "recoveryTimeoutMs" | "recoveryPeerMaxFailures" | "recoveryDeadlineMs"
  >;
  /** Settles once the worker sources have been read (WorkerSet.start). */
  listed: Promise<void>;
  workers: WorkerSet;
  indexers: Indexers;
  handoff: StreamHandoff;
  health: HealthState;
  metrics: Metrics;
  kube: () => KubeSources;
  log: Logger;
  /** Told how recovery ended, in the step before readiness turns SERVING (/dump serves from then on). */
  onRecovered: (outcome: RecoveryOutcome) => void;
  /** Shutdown: the sequence stops where it is and nothing more is set up. */
  signal: AbortSignal;
};

/** Runs the sequence; resolves with how recovery ended once the replica is ready. */
export function recoverThenReady(o: ReadinessOptions): Promise<RecoveryOutcome> {
  const { cfg, workers, indexers, handoff, log } = o;
  const recoveryMetric = recoveryStateMetric(o.metrics.registry);
  const attemptMetrics = recoveryAttemptMetrics(o.metrics.registry);
  const ready = o.listed
    .then(async () => {
      // Bounded (--subscribe-wait-ms): a worker that is down must not hold readiness; its listener keeps
      // reconnecting and its blocks arrive once it is up.
      const unconnected = await workers.waitConnected(cfg.subscribeWaitMs);
      if (unconnected.length > 0) log.warn({ listeners: unconnected }, "KV listeners still connecting; recovering without waiting longer");
      log.info({ workers: workers.specs().length, listeners: workers.candidates().length }, "listeners subscribed");
      const budget = recoveryBudget(cfg.recoveryBudgetMiB);
      log.info(
        { budgetBytes: budget.bytes, from: budget.source, maxBodyBytes: dumpBodyLimit(budget.bytes), minRate: cfg.recoveryMinRate, deadlineMs: cfg.recoveryDeadlineMs || null },
        "recovery limits",
      );
      return runRecovery({
        discovery: peerDiscovery(cfg, o.kube, log),
        target: handoff.target(indexers.recovery.within(budget.bytes)),
        timeoutMs: cfg.recoveryTimeoutMs,
        token: cfg.peerToken,
        logger: log,
        budgetBytes: budget.bytes,
        limits: { maxBytes: dumpBodyLimit(budget.bytes) },
        minRate: cfg.recoveryMinRate,
        maxPeerFailures: cfg.recoveryPeerMaxFailures,
        deadlineMs: cfg.recoveryDeadlineMs || undefined,
        onState: (s) => attemptMetrics.observe(s),
        signal: o.signal,
      });
    })
    .then((outcome) => {
      // Shutting down: nothing more to set up (a recovery that ended without looking at the signal).
      o.signal.throwIfAborted();
      recoveryMetric.set(outcome);
      // The peer's dump may name workers this replica does not have, and claims blocks for each rank.
      indexers.models.pruneWorkers((w) => workers.has(w));
      indexers.live.holdWithinCapacity();
      workers.attach((worker, signal) => {
        try {
          handoff.signal(worker, signal);
        } catch (err) {
          o.metrics.ioErrors.inc({ where: "kv_events" });
          log.warn({ worker: worker.workerId, rank: worker.dpRank, err: String(err) }, "applying KV events failed");
        }
      });
      o.onRecovered(outcome);
      // From here readiness follows the pool, as llm-d's follows PoolHasSynced: a deleted InferencePool
      // (its workers cleared, requests 503) is NOT_SERVING until it is back with its pods listed.
      o.health.setReady(workers.poolPresent);
      workers.whenPoolPresence((present) => {
        log.warn({ ready: present }, present ? "inference pool back: SERVING" : "inference pool gone: NOT_SERVING");
        o.health.setReady(present);
      });
      if (outcome.kind === "recovered") log.info({ peer: outcome.peer, events: outcome.events }, "recovered");
      else log.warn({ state: outcome.kind, reason: outcome.kind === "empty_bootstrap" ? outcome.reason : undefined }, "ready with an EMPTY KV index");
      return outcome;
    });
  ready.catch((err) => {
    if (!o.signal.aborted) log.error({ err: String(err) }, "recovery failed");
  });
  return ready;
}

function peerDiscovery(cfg: ReadinessOptions["cfg"], kube: () => KubeSources, log: Logger): PeerDiscovery | null {
  switch (cfg.recovery.mode) {
    case "disabled":
      return null;
    case "static":
      return staticPeerDiscovery({ peers: cfg.recovery.peers, token: cfg.peerToken, logger: log });
    case "kubernetes":
      return kube().endpointSlices({
        namespace: cfg.recovery.namespace,
        service: cfg.recovery.peerService,
        podIp: cfg.podIp,
        logger: log,
      });
  }
}
