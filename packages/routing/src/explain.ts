// "Why this worker": a routing decision as one header value, for a request that asks for it
// (x-kv-epp-explain: 1, or --explain for every request). The chosen worker rank, its overlap of the
// request's blocks, its predicted TTFT, and the same for the runner-up (the next-lowest cost); in a
// pool with prefill ranks, the decider's verdict and, when it disaggregates, the prefill rank and its
// runner-up.
import type { Decision, ScoredCandidate } from "./picker.ts";

export const EXPLAIN_REQUEST_HEADER = "x-kv-epp-explain";
export const EXPLANATION_HEADER = "x-kv-epp-decision";

type Picked = Extract<Decision, { kind: "picked" }>;

function describe(s: ScoredCandidate, requestBlocks: number): string {
  const c = s.candidate;
  // "+": at least that many, the pick having seen only a known prefix the rank holds whole (openEnded).
  return `worker=${c.workerId} dp_rank=${c.dpRank} overlap=${s.overlap}${s.openEnded ? "+" : ""}/${requestBlocks}${s.pendingOverlap > 0 ? ` pending=${s.pendingOverlap}` : ""} predicted_ttft_ms=${s.predictedTtftMs.toFixed(1)}${s.loraAffinity !== undefined ? ` lora=${s.loraAffinity}` : ""} cost=${round(s.cost)}`;
}

// The score shape's costs lie in [-5, 0], up to the LoRA charge's weight more: one decimal would hide the
// differences that decided.
const round = (x: number) => (Number.isInteger(x) ? String(x) : x.toFixed(Math.abs(x) < 10 ? 3 : 1));

function runnerUp(chosen: ScoredCandidate, scored: readonly ScoredCandidate[]): ScoredCandidate | undefined {
  let best: ScoredCandidate | undefined;
  for (const s of scored) {
    if (s.candidate.key === chosen.candidate.key) continue;
    if (!best || s.cost < best.cost) best = s;
  }
  return best;
}

/**
 * `chosen: ...; runner_up: ...` (runner_up=none with a single candidate); in a pool with prefill ranks
 * then `; pd: disaggregated|local reason=R uncached_tokens=U threshold_tokens=T` and, when disaggregated,
 * `; prefill: ...; prefill_runner_up: ...` (the chosen rank is the decode rank, the destination).
 */
export function explanation(d: Picked): string {
  const b = d.requestBlocks;
  const second = runnerUp(d.chosen, d.scored);
  let out = `chosen: ${describe(d.chosen, b)}; runner_up: ${second ? describe(second, b) : "none"}`;
  if (!d.pd) return out;
  const v = d.pd.disagg;
  out += `; pd: ${v.disaggregate ? "disaggregated" : "local"} reason=${v.reason} uncached_tokens=${v.uncachedTokens} threshold_tokens=${v.thresholdTokens}`;
  const p = d.pd.prefill;
  if (p) {
    const pSecond = runnerUp(p.chosen, p.scored);
    out += `; prefill: ${describe(p.chosen, b)}; prefill_runner_up: ${pSecond ? describe(pSecond, b) : "none"}`;
  }
  return out;
}
