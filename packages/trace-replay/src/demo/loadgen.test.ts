// The load generator's failure path: what the demo does when a request fails in a way it does not count.
import { describe, expect, test } from "bun:test";
import type { TraceRecord } from "../trace.ts";
import { replay } from "./loadgen.ts";
import { DemoStats } from "./stats.ts";

const records: TraceRecord[] = [0, 20, 40, 60].map((timestamp) => ({ timestamp, inputLength: 16, outputLength: 1, hashIds: [timestamp] }));

describe("replay", () => {
  test("a gateway that cannot be reached stops the replay with that error, never an unhandled rejection", async () => {
    const stats = new DemoStats(["w"]);
    const run = replay(records, {
      model: "m",
      timeScale: 1,
      arrivals: "recorded",
      // Nothing listens on port 1: the connection is refused, which is no routing or worker outcome.
      gateway: "http://127.0.0.1:1",
      workerOf: (e) => e,
      stats,
      signal: new AbortController().signal,
    });
    await expect(run).rejects.toThrow();
    expect(stats.done).toBe(0);
  });
});
