// The load generator's failure path: what the demo does when a request fails in a way it does not count.
import { describe, expect, test } from "bun:test";
import type { TraceRecord } from "../trace.ts";
import type { ExtProcClient } from "@kv-epp/epp";
import { replay } from "./loadgen.ts";
import { DemoStats } from "./stats.ts";

const records: TraceRecord[] = [0, 20, 40, 60].map((timestamp) => ({ timestamp, inputLength: 16, outputLength: 1, hashIds: [timestamp] }));

describe("replay", () => {
  test("an unexpected error in one request stops the replay and is its rejection, never an unhandled one", async () => {
    // Not a RoutingError: the load generator has no outcome to count it under.
    const client = { route: async () => Promise.reject(new TypeError("boom")) } as unknown as ExtProcClient;
    const stats = new DemoStats(["w"]);
    const run = replay(records, {
      model: "m",
      timeScale: 1,
      replicas: () => [{ name: "epp-a", client }],
      workerOf: (e) => e,
      stats,
      signal: new AbortController().signal,
    });
    await expect(run).rejects.toThrow("boom");
    expect(stats.sent).toBeLessThan(records.length);
  });
});
