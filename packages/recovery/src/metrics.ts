import { Gauge, type Registry } from "prom-client";
import { RECOVERY_STATES, type RecoveryOutcome } from "./types.ts";

export const RECOVERY_STATE_METRIC = "dynamo_epp_kv_recovery_state";

/**
 * `dynamo_epp_kv_recovery_state{state}` (DESIGN.md §7 rule 7): registered on the EPP's registry, set once when
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
