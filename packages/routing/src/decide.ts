// The routing decision as one pure function: what the EPP knows about each candidate (its overlap of the
// request's blocks, its load, its scraped queue, its fit for the request's LoRA adapter) in, the chosen
// candidate out. `Picker` calls it with the live index and load; bench:trace's simulation calls it with
// the simulated ones, so the benchmark measures the decision that ships, except the LoRA charge: the
// simulated workers hold any mix of adapters at once (no max_lora, no loading), so the simulation gives no
// adapter state and its LoRA-mix scenario runs without the charge (routing README, "LoRA affinity").
import { endpointHost } from "@kv-epp/protocol";
import { choose, costs, type Weights } from "./cost.ts";
import { uncachedTokens, type CostInput } from "./latency.ts";

/** What the decision knows about one candidate worker rank. */
export type CandidateState = {
  /** ip:port the gateway would call (a GAIE subset hint names its IP). */
  readonly endpoint: string;
  /** Leading blocks of the request the index says this rank holds. */
  readonly overlap: number;
  /**
   * Leading blocks of the request that requests routed to this rank and not yet ended will have
   * computed there (pending.ts): the index learns them only from the rank's KV events after
   * their prefill. Absent: 0.
   */
  readonly pendingOverlap?: number;
  /** Blocks of requests in flight on the rank (this replica's and its peers'). */
  readonly activeBlocks: number;
  /** Requests in flight on the rank (this replica's and its peers'). */
  readonly activeRequests: number;
  /** Blocks those requests still prefill (no first token back yet): the prefill ahead of a new one. Absent: 0. */
  readonly prefillBlocks?: number;
  /** How many of those requests still prefill: the part of the scraped queue already counted ahead. Absent: 0. */
  readonly prefillRequests?: number;
  /** Waiting requests from the rank's scraped vLLM /metrics (0 when not scraped). */
  readonly waiting: number;
  /**
   * How well the rank fits the request's LoRA adapter (lora.ts, in [0, 1]). Absent: the request names no
   * adapter, or the rank reports none, which counts as no fit (0) beside candidates that report (decide()).
   */
  readonly loraAffinity?: number;
};

export type DecisionInput<C extends CandidateState> = {
  /** Full blocks of the request's prompt. */
  requestBlocks: number;
  candidates: readonly C[];
  /**
   * What the gateway allows, absent: all. A pod IP allows every endpoint of that pod (GAIE subset
   * hint); an `ip:port` entry allows that endpoint only (GAIE's conformance selection header).
   */
  subset?: ReadonlySet<string>;
  weights: Weights;
  /** A candidate with more waiting requests than this is skipped unless all are (0: off). */
  queueThreshold: number;
  /** [0, 1): breaks ties, samples the softmax. */
  random: () => number;
  /** The latency cost: a candidate's predicted TTFT (ms) replaces the weighted blocks. */
  latency?: (c: C) => number;
  /** With `latency`: the request's whole prefill in ms at the pool's rate, the unit of its LoRA charge. */
  prefillMs?: number;
};

export type Scored<C> = { candidate: C; cost: number };

export type DecisionOutcome<C> =
  /** `lora`: the LoRA charge was made (some candidate has an affinity, at a weight above 0). */
  | { kind: "chosen"; chosen: Scored<C>; scored: Scored<C>[]; lora: boolean }
  | { kind: "none"; reason: "no_workers" | "subset_empty" };

export function decide<C extends CandidateState>(input: DecisionInput<C>): DecisionOutcome<C> {
  let eligible: readonly C[] = input.candidates;
  if (eligible.length === 0) return { kind: "none", reason: "no_workers" };
  const subset = input.subset;
  if (subset) {
    eligible = subset.size === 0 ? [] : eligible.filter((c) => subset.has(endpointHost(c.endpoint)) || subset.has(c.endpoint));
    if (eligible.length === 0) return { kind: "none", reason: "subset_empty" };
  }
  eligible = queueFilter(eligible, input.queueThreshold);
  const w = input.weights;
  const latency = input.latency;
  // In-flight prefixes count as cached under either shape (overlapOf).
  const byCost = latency ? eligible.map(latency) : costs(w, input.requestBlocks, eligible.map((c) => ({ ...c, overlap: overlapOf(c) })));
  // A rank reporting no adapters (a failed scrape, an engine before its first step, LoRA off) fits the adapter
  // not at all, as llm-d scores it, so it cannot beat the ranks that report and are charged. Where none
  // reports, the charges would all be equal and none is made: the costs stay exactly those without the term
  // (an equal charge added in floating point can still merge near-equal costs and moves the explained ones).
  const miss = eligible.some((c) => c.loraAffinity !== undefined) ? (w.loraWeight ?? 0) * loraUnit(input) : 0;
  const scored = eligible.map((candidate, i) => ({ candidate, cost: miss === 0 ? byCost[i]! : byCost[i]! + miss * (1 - (candidate.loraAffinity ?? 0)) }));
  const i = choose(
    scored.map((s) => s.cost),
    w.temperature,
    input.random,
  );
  return { kind: "chosen", chosen: scored[i]!, scored, lora: miss !== 0 };
}

/** What a rank of LoRA affinity 0 is charged per unit of weight, in the cost's units (lora.ts, DEFAULT_LORA_WEIGHT). */
function loraUnit<C extends CandidateState>(input: DecisionInput<C>): number {
  if (input.latency) return input.prefillMs ?? 0;
  const shape = input.weights.shape;
  return shape?.kind === "score" ? 1 : input.weights.prefillLoadScale * input.requestBlocks;
}

/** The blocks the decision counts as cached on the candidate: the index's or the pending ones, whichever is longer. */
export function overlapOf(c: CandidateState): number {
  const p = c.pendingOverlap ?? 0;
  return p > c.overlap ? p : c.overlap;
}

/**
 * The blocks a request routed with `overlap` of its `requestBlocks` cached still prefills on that worker:
 * what its load lease counts as prefill ahead of later requests until its first token.
 */
export function prefillBlocksOf(requestBlocks: number, overlap: number): number {
  return Math.max(requestBlocks - overlap, 0);
}

/**
 * What the latency model predicts this candidate's TTFT for a prompt of `promptTokens` from. The scraped
 * queue counts beyond the requests the load holds as still prefilling there: those are in the prefill
 * ahead already, so only what other routers sent waits on top of it.
 */
export function ttftInput(c: CandidateState, promptTokens: number, blockSize: number): CostInput {
  return {
    promptTokens,
    uncachedTokens: uncachedTokens(promptTokens, overlapOf(c), blockSize),
    aheadTokens: (c.prefillBlocks ?? 0) * blockSize,
    waiting: Math.max(0, c.waiting - (c.prefillRequests ?? 0)),
  };
}

/** Candidates at or under the waiting threshold; all of them when none is (a full pool still routes). */
function queueFilter<C extends CandidateState>(candidates: readonly C[], threshold: number): readonly C[] {
  if (threshold <= 0) return candidates;
  const under = candidates.filter((c) => c.waiting <= threshold);
  return under.length > 0 ? under : candidates;
}
