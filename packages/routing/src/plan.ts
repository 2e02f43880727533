// A destination's latency cost in a pool with prefill ranks: the cost of the plan the decider
// (disagg.ts) would make with it, plus its decode load. Pure: the Picker hands it the candidates'
// states and the prefill ranks' costs once per pick.
import { DEFAULT_WEIGHTS } from "./cost.ts";
import { overlapOf, type CandidateState } from "./decide.ts";
import { decideDisagg } from "./disagg.ts";

/** A candidate as the plan reads it: its state and its worker (a worker never prefills for its own rank). */
export type PlanCandidate = CandidateState & { readonly ref: { readonly workerId: string } };

export type PlanInput = {
  promptTokens: number;
  blockSize: number;
  /** The decider's threshold (0: never disaggregate). */
  thresholdTokens: number;
  /** The latency line's fitted rate, which prices the decode load. */
  msPerToken: number;
  /** Every prefill rank of the pool, and beside it (same index) its latency cost as the remote prefill. */
  prefillRanks: readonly { readonly ref: { readonly workerId: string } }[];
  prefillCosts: readonly number[];
};

/**
 * A destination's decode load in the latency cost's ms: the blocks its in-flight requests hold, each
 * weighed as the blocks cost weighs it against a block to prefill (DEFAULT_WEIGHTS: decode/prefill =
 * 1/16, one more running request slowing every decode step of its batch, in the ms a block's prefill
 * costs), so a held block costs 1/16 of a block's prefill time at the pool's fitted rate.
 */
function decodeLoadMs(activeBlocks: number, blockSize: number, msPerToken: number): number {
  return (DEFAULT_WEIGHTS.decodeLoadScale / DEFAULT_WEIGHTS.prefillLoadScale) * activeBlocks * blockSize * msPerToken;
}

/**
 * The cost of each destination: where the decider would disaggregate, the prompt is prefilled on the
 * cheapest prefill rank of another worker, so that rank's cost stands for the destination's own prefill
 * (which a disaggregated decode lease never books: every destination would look idle, and the one whose
 * cache is richest would keep winning); where it would prefill locally, `local` (its own latency cost)
 * stands. The decode load is what tells destinations apart either way.
 *
 * A prefill rank's cost does not depend on the destination; the destination only rules out the ranks of
 * its own worker. So the cheapest rank overall answers every destination off its worker, and the
 * cheapest on any other worker answers the rest: O(P) once and O(1) a destination, where a scan of the
 * prefill ranks per destination made a pick O(D x P). Strict `<` from the first rank keeps the same
 * minimum (NaN never wins, no rank leaves Infinity) as that scan (plan.test.ts).
 */
export function planCost<C extends PlanCandidate>(input: PlanInput, local: (c: C) => number): (c: C) => number {
  const { promptTokens, blockSize, thresholdTokens, msPerToken, prefillRanks, prefillCosts } = input;
  const perWorker = new Map<string, number>();
  let best = Infinity;
  let bestWorker: string | undefined;
  for (let i = 0; i < prefillRanks.length; i++) {
    const w = prefillRanks[i]!.ref.workerId;
    perWorker.set(w, (perWorker.get(w) ?? 0) + 1);
    if (prefillCosts[i]! < best) {
      best = prefillCosts[i]!;
      bestWorker = w;
    }
  }
  let offBest = Infinity;
  for (let i = 0; i < prefillRanks.length; i++) if (prefillRanks[i]!.ref.workerId !== bestWorker && prefillCosts[i]! < offBest) offBest = prefillCosts[i]!;
  return (c) => {
    const w = c.ref.workerId;
    const others = prefillRanks.length - (perWorker.get(w) ?? 0);
    const v = decideDisagg({ promptTokens, decodeOverlap: overlapOf(c), blockSize, thresholdTokens, prefillCandidates: others });
    if (!v.disaggregate) return local(c) + decodeLoadMs(c.activeBlocks, blockSize, msPerToken);
    // The decode rank pulls only the blocks it does not hold (vLLM's connector counts its local hits
    // first), so its own cached prefix still counts: the pull is weighed as that many more held blocks.
    const pulled = Math.ceil(v.uncachedTokens / blockSize);
    return (w === bestWorker ? offBest : best) + decodeLoadMs(c.activeBlocks + pulled, blockSize, msPerToken);
  };
}
