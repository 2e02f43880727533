import { expect, test } from "bun:test";
import { Registry } from "prom-client";
import { recoveryStateMetric } from "../src/index.ts";

test("dynamo_epp_kv_recovery_state is 1 for the state reached and 0 for the others", async () => {
  const registry = new Registry();
  recoveryStateMetric(registry).set({ kind: "empty_bootstrap" });
  const text = await registry.metrics();
  expect(text).toContain('dynamo_epp_kv_recovery_state{state="empty_bootstrap"} 1');
  expect(text).toContain('dynamo_epp_kv_recovery_state{state="recovered"} 0');
  expect(text).toContain('dynamo_epp_kv_recovery_state{state="recovery_disabled"} 0');
});
