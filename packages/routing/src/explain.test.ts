import { describe, expect, test } from "bun:test";
import { explanation } from "./explain.ts";
import type { Decision, ScoredCandidate } from "./picker.ts";

const scored = (workerId: string, dpRank: number, overlap: number, cost: number, predictedTtftMs: number, pendingOverlap = 0): ScoredCandidate => ({
  candidate: { workerId, dpRank, key: `${workerId}/${dpRank}`, endpoint: "10.0.0.1:8000", rankHeader: dpRank },
  overlap, pendingOverlap, cost, waiting: 0, unexplainedWaiting: 0, aheadTokens: 0, predictedTtftMs, openEnded: false,
});

const picked = (chosen: ScoredCandidate, all: ScoredCandidate[]): Extract<Decision, { kind: "picked" }> => ({
  kind: "picked", chosen, model: "m", blockSize: 16, requestBlocks: 8, promptTokens: 130, scored: all,
});

describe("explanation", () => {
  test("names the chosen rank and the runner-up, the other candidate of lowest cost, with their overlaps and predicted TTFTs", () => {
    const a = scored("a", 0, 8, 10, 12.34);
    const b = scored("b", 1, 3, 40.25, 80, 3);
    const c = scored("c", 0, 0, 30, 95);
    expect(explanation(picked(a, [b, a, c]))).toBe(
      "chosen: worker=a dp_rank=0 overlap=8/8 predicted_ttft_ms=12.3 cost=10; runner_up: worker=c dp_rank=0 overlap=0/8 predicted_ttft_ms=95.0 cost=30",
    );
    // Sampled (temperature > 0), the chosen may not be the cheapest: the runner-up is still the cheapest other one.
    expect(explanation(picked(b, [a, b, c]))).toBe(
      "chosen: worker=b dp_rank=1 overlap=3/8 pending=3 predicted_ttft_ms=80.0 cost=40.3; runner_up: worker=a dp_rank=0 overlap=8/8 predicted_ttft_ms=12.3 cost=10",
    );
  });

  test("a score-shape cost (a negated score of a few units) keeps three decimals", () => {
    const a = scored("a", 0, 8, -4.23456, 12);
    const b = scored("b", 0, 2, -4.2301, 90);
    expect(explanation(picked(a, [a, b]))).toBe(
      "chosen: worker=a dp_rank=0 overlap=8/8 predicted_ttft_ms=12.0 cost=-4.235; runner_up: worker=b dp_rank=0 overlap=2/8 predicted_ttft_ms=90.0 cost=-4.230",
    );
  });

  test("an overlap that may reach past the known prefix the pick saw is marked as a lower bound", () => {
    const a = { ...scored("a", 0, 2, 5, 7), openEnded: true };
    expect(explanation(picked(a, [a]))).toBe("chosen: worker=a dp_rank=0 overlap=2+/8 predicted_ttft_ms=7.0 cost=5; runner_up: none");
  });

  test("a request naming a LoRA adapter shows each rank's fit for it", () => {
    const a = { ...scored("a", 0, 1, 5, 7), loraAffinity: 0.8 };
    expect(explanation(picked(a, [a]))).toBe("chosen: worker=a dp_rank=0 overlap=1/8 predicted_ttft_ms=7.0 lora=0.8 cost=5; runner_up: none");
  });

  test("a single candidate has no runner-up", () => {
    const a = scored("a", 0, 1, 5, 7);
    expect(explanation(picked(a, [a]))).toBe("chosen: worker=a dp_rank=0 overlap=1/8 predicted_ttft_ms=7.0 cost=5; runner_up: none");
  });
});
