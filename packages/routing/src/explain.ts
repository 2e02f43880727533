// "Why this worker": a routing decision as one header value, for a request that asks for it
// (x-kv-epp-explain: 1, or --explain for every request). The chosen worker rank, its overlap of the
// request's blocks, its predicted TTFT, and the same for the runner-up (the next-lowest cost).
import type { Decision, ScoredCandidate } from "./picker.ts";

export const EXPLAIN_REQUEST_HEADER = "x-kv-epp-explain";
export const EXPLANATION_HEADER = "x-kv-epp-decision";

type Picked = Extract<Decision, { kind: "picked" }>;

function describe(s: ScoredCandidate, requestBlocks: number): string {
  const c = s.candidate;
  return `worker=${c.workerId} dp_rank=${c.dpRank} overlap=${s.overlap}/${requestBlocks}${s.pendingOverlap > 0 ? ` pending=${s.pendingOverlap}` : ""} predicted_ttft_ms=${s.predictedTtftMs.toFixed(1)} cost=${round(s.cost)}`;
}

// The score shape's costs lie in [-5, 0]: one decimal would hide the differences that decided.
const round = (x: number) => (Number.isInteger(x) ? String(x) : x.toFixed(Math.abs(x) < 10 ? 3 : 1));

/** `chosen: ...; runner_up: ...` (runner_up=none with a single candidate). */
export function explanation(d: Picked): string {
  let runnerUp: ScoredCandidate | undefined;
  for (const s of d.scored) {
    if (s.candidate.key === d.chosen.candidate.key) continue;
    if (!runnerUp || s.cost < runnerUp.cost) runnerUp = s;
  }
  return `chosen: ${describe(d.chosen, d.requestBlocks)}; runner_up: ${runnerUp ? describe(runnerUp, d.requestBlocks) : "none"}`;
}
