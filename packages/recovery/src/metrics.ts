import { Counter, Gauge, type Registry } from "prom-client";
import type { RecoveryState } from "./recovery.ts";
import { RECOVERY_STATES, type RecoveryOutcome } from "./types.ts";

const RECOVERY_STATE_METRIC = "dynamo_epp_kv_recovery_state";

/**
 * `dynamo_epp_kv_recovery_state{state}` (docs/CONTRACTS.md §8 rule 7): registered on the EPP's registry, set once when
 * recovery ends, 1 for the state reached and 0 for the other two; with the recovered dump's events, bytes,
 * duration and peer.
 */
export function recoveryStateMetric(registry: Registry): { set(outcome: RecoveryOutcome): void } {
  const gauge = new Gauge({
    name: RECOVERY_STATE_METRIC,
    help: "KV index recovery outcome at startup: 1 for the state reached (recovered, empty_bootstrap, recovery_disabled), 0 for the others",
    labelNames: ["state"],
    registers: [registry],
  });
  // The recovery's figures as data (nothing has to parse the "dump fetched from peer" log line): 0 unless recovered.
  const events = new Gauge({ name: "dynamo_epp_kv_recovery_events", help: "events in the dump this replica recovered from (0 unless recovered)", registers: [registry] });
  const bytes = new Gauge({ name: "dynamo_epp_kv_recovery_bytes", help: "bytes of the dump this replica recovered from (0 unless recovered)", registers: [registry] });
  const seconds = new Gauge({ name: "dynamo_epp_kv_recovery_duration_seconds", help: "time from the dump request until its staging was committed (0 unless recovered)", registers: [registry] });
  const peer = new Gauge({ name: "dynamo_epp_kv_recovery_peer", help: "1 for the peer this replica recovered from", labelNames: ["peer"], registers: [registry] });
  return {
    set(outcome) {
      for (const s of RECOVERY_STATES) gauge.set({ state: s }, s === outcome.kind ? 1 : 0);
      const r = outcome.kind === "recovered" ? outcome : null;
      events.set(r?.events ?? 0);
      bytes.set(r?.bytes ?? 0);
      seconds.set((r?.ms ?? 0) / 1000);
      if (r) peer.set({ peer: r.peer }, 1);
    },
  };
}

/**
 * The failed attempts of recovery, fed from runRecovery's `onState`: every failure by reason, budget and
 * trickle failures each in their own counter (the two a hostile or oversized peer causes), and the peers
 * set aside because their dumps keep failing, with the reason of their last failure.
 */
export function recoveryAttemptMetrics(registry: Registry): { observe(s: RecoveryState): void } {
  const failures = new Counter({
    name: "dynamo_epp_kv_recovery_attempt_failures_total",
    help: "failed /dump attempts by reason (status, timeout, trickle, budget, network, malformed, apply)",
    labelNames: ["reason"],
    registers: [registry],
  });
  const budget = new Counter({
    name: "dynamo_epp_kv_recovery_budget_failures_total",
    help: "/dump attempts failed because staging the dump needed more than the recovery budget",
    registers: [registry],
  });
  const trickle = new Counter({
    name: "dynamo_epp_kv_recovery_trickle_failures_total",
    help: "/dump attempts failed because the body arrived below the minimum transfer rate",
    registers: [registry],
  });
  const setAside = new Gauge({
    name: "dynamo_epp_kv_recovery_failing_peers",
    help: "peers set aside during recovery because their dumps kept failing (1 per peer, with its last failure's reason)",
    labelNames: ["peer", "reason"],
    registers: [registry],
  });
  return {
    observe(s) {
      if (s.kind !== "attempt_failed") return;
      failures.inc({ reason: s.reason });
      if (s.reason === "budget") budget.inc();
      if (s.reason === "trickle") trickle.inc();
      if (s.setAside) setAside.set({ peer: s.peer.id, reason: s.reason }, 1);
    },
  };
}
