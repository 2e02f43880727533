// The demo's exit status: what `bun run demo` counts as a successful run.
import { describe, expect, test } from "bun:test";
import { demoSucceeded, type RecoveryReport } from "./report.ts";
import { LOOPBACK } from "@kv-epp/testkit";

const served = { outcomes: { ok: 3, "routing-error": 0, "worker-error": 0 } };
const recovered: RecoveryReport = { replica: "epp-c", peer: `http://${LOOPBACK}.6.3:9093`, events: 10, bytes: 100, ms: 5, readyMs: 900 };

describe("demoSucceeded", () => {
  test("a run with --kill-at 0 (no replica replaced) succeeds on served requests alone", () => {
    expect(demoSucceeded(served, false, undefined)).toBe(true);
  });

  test("a replaced replica must have recovered from a peer", () => {
    expect(demoSucceeded(served, true, recovered)).toBe(true);
    expect(demoSucceeded(served, true, { replica: "epp-c", failed: "not ready" })).toBe(false);
    expect(demoSucceeded(served, true, undefined)).toBe(false);
  });

  test("a run that served no request fails", () => {
    expect(demoSucceeded({ outcomes: { ok: 0, "routing-error": 5, "worker-error": 0 } }, false, undefined)).toBe(false);
  });
});
