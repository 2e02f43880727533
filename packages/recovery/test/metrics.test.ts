import { expect, test } from "bun:test";
import { Registry } from "prom-client";
import { recoveryStateMetric } from "../src/index.ts";

test("dynamo_epp_kv_recovery_state is 1 for the state reached and 0 for the others", async () => {
  const registry = new Registry();
  recoveryStateMetric(registry).set({ kind: "empty_bootstrap", reason: "no_serving_peer" });
  const text = await registry.metrics();
  expect(text).toContain('dynamo_epp_kv_recovery_state{state="empty_bootstrap"} 1');
  expect(text).toContain('dynamo_epp_kv_recovery_state{state="recovered"} 0');
  expect(text).toContain('dynamo_epp_kv_recovery_state{state="recovery_disabled"} 0');
});

test("a recovery's peer, events, bytes and duration are exported as gauges", async () => {
  const registry = new Registry();
  recoveryStateMetric(registry).set({ kind: "recovered", peer: "10.0.0.7:9093", events: 1200, bytes: 65536, ms: 250 });
  const text = await registry.metrics();
  expect(text).toContain('dynamo_epp_kv_recovery_state{state="recovered"} 1');
  expect(text).toContain("dynamo_epp_kv_recovery_events 1200");
  expect(text).toContain("dynamo_epp_kv_recovery_bytes 65536");
  expect(text).toContain("dynamo_epp_kv_recovery_duration_seconds 0.25");
  expect(text).toContain('dynamo_epp_kv_recovery_peer{peer="10.0.0.7:9093"} 1');
});
