import { Gauge, type Registry } from "prom-client";
import { RECOVERY_STATES, type RecoveryOutcome } from "./types.ts";

export const RECOVERY_STATE_METRIC = "dynamo_epp_kv_recovery_state";

/**
 * `dynamo_epp_kv_recovery_state{state}` (DESIGN.md §7 rule 7): registered on the EPP's registry, set once when
 * recovery ends, 1 for the state reached and 0 for the other two.
 */
export function recoveryStateMetric(registry: Registry): { set(outcome: RecoveryOutcome): void } {
  const gauge = new Gauge({
    name: RECOVERY_STATE_METRIC,
    help: "KV index recovery outcome at startup: 1 for the state reached (recovered, empty_bootstrap, recovery_disabled), 0 for the others",
    labelNames: ["state"],
    registers: [registry],
  });
  return {
    set(outcome) {
      for (const s of RECOVERY_STATES) gauge.set({ state: s }, s === outcome.kind ? 1 : 0);
    },
  };
}
