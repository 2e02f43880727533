// Bodies prepared ahead of their arrival.
import { describe, expect, test } from "bun:test";
import type { TraceRecord } from "../trace.ts";
import { BodyLookahead, completionBody } from "./bodies.ts";

const records: TraceRecord[] = [0, 1, 2, 3, 4].map((i) => ({ timestamp: i * 10, inputLength: 600 + i, outputLength: 3, hashIds: [i, 100 + i] }));
const prompt = (b: Uint8Array) => (JSON.parse(new TextDecoder().decode(b)) as { prompt: number[] }).prompt;

describe("BodyLookahead", () => {
  test("fills up to its depth in idle time; taken bodies are the records' own, in order", async () => {
    const bodies = new BodyLookahead(records, "m", 3);
    await bodies.fill(() => true);
    expect(bodies.take(0)).toEqual(completionBody(records[0]!, "m"));
    expect(bodies.take(1)).toEqual(completionBody(records[1]!, "m"));
    expect(bodies.take(2)).toEqual(completionBody(records[2]!, "m"));
    expect(bodies.late).toBe(0);
    // Nothing was built beyond the depth: record 3 has to be built when taken.
    expect(prompt(bodies.take(3))).toHaveLength(603);
    expect(bodies.late).toBe(1);
    await bodies.fill(() => true);
    expect(prompt(bodies.take(4))).toHaveLength(604);
    expect(bodies.late).toBe(1);
  });

  test("a fill whose time is up builds nothing", async () => {
    const bodies = new BodyLookahead(records, "m");
    await bodies.fill(() => false);
    bodies.take(0);
    expect(bodies.late).toBe(1);
  });
});
