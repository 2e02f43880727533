// The load generator's failure path: what the demo does when a request fails in a way it does not count.
import { describe, expect, test } from "bun:test";
import type { TraceRecord } from "../trace.ts";
import { readStream, replay } from "./loadgen.ts";
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

describe("readStream", () => {
  const streamed = (...chunks: object[]) =>
    new Response([...chunks.map((c) => `data: ${JSON.stringify(c)}\n\n`), "data: [DONE]\n\n"].join(""), { headers: { "content-type": "text/event-stream" } });
  const usage = { prompt_tokens: 5, completion_tokens: 2, total_tokens: 7 };

  test("a chat's reply is its deltas' text in the role the first delta named, as a client resends it", async () => {
    const res = streamed(
      { choices: [{ index: 0, delta: { role: "model", content: "" } }] },
      { choices: [{ index: 0, delta: { content: "Once" } }] },
      { choices: [{ index: 0, delta: { content: " upon" } }] },
      { choices: [], usage },
    );
    expect((await readStream(res, performance.now()))?.reply).toEqual({ role: "model", content: "Once upon" });
  });

  test("a stream that names no role gives a reply without one (resent as the assistant's)", async () => {
    const res = streamed({ choices: [{ index: 0, delta: { content: "hi" } }] }, { choices: [], usage });
    expect((await readStream(res, performance.now()))?.reply).toEqual({ role: undefined, content: "hi" });
  });
});
