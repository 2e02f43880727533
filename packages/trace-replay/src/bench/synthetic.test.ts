import { describe, expect, test } from "bun:test";
import { TRACE_BLOCK_TOKENS } from "../trace.ts";
import { syntheticTrace } from "./synthetic.ts";

describe("synthetic trace", () => {
  test("is the same for a seed, well formed, and of another shape: short prompts, most blocks shared", () => {
    const t = syntheticTrace(2000, 3);
    expect(syntheticTrace(2000, 3)).toEqual(t);
    expect(syntheticTrace(2000, 4)).not.toEqual(t);
    for (const r of t) {
      expect(r.hashIds.length).toBe(Math.ceil(r.inputLength / TRACE_BLOCK_TOKENS));
      expect(r.outputLength).toBeGreaterThan(0);
    }
    expect(t.every((r, i) => i === 0 || r.timestamp >= t[i - 1]!.timestamp)).toBe(true);
    const meanTokens = t.reduce((a, r) => a + r.inputLength, 0) / t.length;
    expect(meanTokens).toBeLessThan(4000);
    const blocks = t.reduce((a, r) => a + r.hashIds.length, 0);
    expect(new Set(t.flatMap((r) => r.hashIds)).size).toBeLessThan(blocks / 2);
  });
});
