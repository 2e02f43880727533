// The routing decision as a pure function: cost per candidate (in one of two shapes), lowest wins,
// ties at random, or a softmax over normalised costs when a temperature is set.

export type Weights = {
  /** Blocks shape: weight of the blocks this request would have to prefill on the worker. */
  prefillLoadScale: number;
  /** Blocks shape: weight of the blocks held by requests already routed to the worker. */
  decodeLoadScale: number;
  /** Cost per waiting request scraped from the worker's vLLM /metrics (in the shape's units). */
  queueWeight: number;
  /** 0 picks the argmin; > 0 samples from softmax(-normalised cost / temperature). */
  temperature: number;
  /** How the candidates' costs are formed; absent: "blocks". */
  shape?: CostShape;
  /** Weight of the LoRA affinity (lora.ts) for a request naming an adapter; absent: 0, none. */
  loraWeight?: number;
};

/** Which in-flight measure the score shape balances. */
export type LoadMeasure = "requests" | "blocks";

/**
 * How the candidates' costs are formed (lowest wins either way).
 * - `blocks`: the weights above over absolute blocks, prefill of what is not cached + active blocks.
 * - `score`: GAIE's scorer shape (its prefix-cache scorer, and its queue scorer's min-max
 *   normalisation) over the exact overlap: `prefix` x overlap / min(request blocks, `prefixCapBlocks`)
 *   (at most 1) + `load` x (max - own) / (max - min) of the candidates' in-flight load (1 when all are
 *   equal), the highest score wins. Both terms lie in [0, 1] whatever the prompt size or the pool's
 *   load: a worker holding 2/3 of the capped prefix keeps the request at any load spread, a smaller
 *   share trades against the spread, and a request with nothing to reuse goes to the least loaded. The
 *   cap is GAIE's MaxPrefixBlocksToMatch (256): past it a request scores by how much of its first 256
 *   blocks a worker holds, so a long conversation's next turn keeps its worker even when its new turn
 *   is a large share of the prompt. bench:trace, two replicas, three seeds: +0.4 points of hit rate
 *   and -11 ms TTFT p50 over the blocks weights on the conversation trace, +0.1 / -0.5 ms on the
 *   synthetic one (packages/epp/README.md "Cost shape").
 */
export type CostShape = { kind: "blocks" } | { kind: "score"; prefix: number; load: number; loadBy: LoadMeasure; prefixCapBlocks: number };

/**
 * The blocks shape's default weights. Only their ratio matters (the argmin, and the softmax over normalised costs, are
 * scale-free). Derived under mock-worker's earlier per-request timing model (each prefill on its own,
 * decode 1% slower per co-runner): prefilling one block cost the request 16 tokens x 0.1 ms = 1.6 ms
 * of TTFT, while one more running request slowed every decode step of its batch by 0.1 ms, i.e. about
 * 2 x 0.1 x O ms over a request's O output tokens (it and the co-runner slow each other), or
 * 0.2 x O / B ms per active block for prompts of B blocks. Equal in ms: prefill/decode = 8 B / O, which
 * is 19 on the Mooncake conversation trace (B = 832, O = 347). bench:trace measured hit rate and TTFT
 * flat from 16 to 64 and every target met there (packages/epp/README.md); 16 is the low end of that
 * plateau, leaving the most weight on balance for workloads with shorter prompts or longer outputs.
 */
export const DEFAULT_WEIGHTS = { prefillLoadScale: 16, decodeLoadScale: 1 } as const;

/**
 * The score shape's defaults: GAIE's prefix and load weights (3 and 2) and its 256-block cap; the load
 * in blocks (bench:trace: as good as requests on the conversation trace, better on the synthetic one).
 */
export const SCORE_SHAPE = { kind: "score", prefix: 3, load: 2, loadBy: "blocks", prefixCapBlocks: 256 } as const satisfies CostShape;

/** The EPP's default shape. */
export const DEFAULT_SHAPE: CostShape = SCORE_SHAPE;

export type CandidateLoad = { overlap: number; activeBlocks: number; waiting: number };
/** What the normalised shapes also read: requests in flight on the candidate. */
export type ShapedLoad = CandidateLoad & { activeRequests: number };

export function cost(w: Weights, requestBlocks: number, c: CandidateLoad): number {
  return (
    w.prefillLoadScale * Math.max(requestBlocks - c.overlap, 0) + w.decodeLoadScale * c.activeBlocks + w.queueWeight * c.waiting
  );
}

/** Cost of every candidate under the weights' shape, index-aligned with `cs`. */
export function costs(w: Weights, requestBlocks: number, cs: readonly ShapedLoad[]): number[] {
  const shape = w.shape ?? BLOCKS;
  if (shape.kind === "blocks") return cs.map((c) => cost(w, requestBlocks, c));
  const loads = cs.map((c) => (shape.loadBy === "requests" ? c.activeRequests : c.activeBlocks));
  const max = Math.max(...loads);
  const span = max - Math.min(...loads);
  const of = shape.prefixCapBlocks > 0 ? Math.min(requestBlocks, shape.prefixCapBlocks) : requestBlocks;
  return cs.map((c, i) => {
    const prefix = of > 0 ? Math.min(c.overlap, of) / of : 0;
    const load = span > 0 ? (max - loads[i]!) / span : 1;
    return w.queueWeight * c.waiting - (shape.prefix * prefix + shape.load * load);
  });
}

const BLOCKS: CostShape = { kind: "blocks" };

/**
 * Score shape: how much of the lead that holding `held` of the request's leading blocks gives over a candidate
 * holding `other` (fewer) the prefix term can lose if the request is longer than `requestBlocks` (more held blocks
 * only add to it). The term divides by min(request blocks, cap), which grows with the request up to the cap, and
 * the lead's share shrinks as it grows past `held`: at worst it is the share at the cap (none without a cap).
 */
export function prefixLeadLoss(shape: Extract<CostShape, { kind: "score" }>, requestBlocks: number, held: number, other: number): number {
  const share = (of: number) => (of > 0 ? (Math.min(held, of) - Math.min(other, of)) / of : 0);
  const cap = shape.prefixCapBlocks;
  const now = share(cap > 0 ? Math.min(requestBlocks, cap) : requestBlocks);
  return shape.prefix * (now - (cap > 0 ? share(cap) : 0));
}

/** Index of the chosen candidate; `random` returns [0, 1). */
export function choose(costs: readonly number[], temperature: number, random: () => number): number {
  if (costs.length === 0) return -1;
  if (temperature > 0) return softmaxSample(costs, temperature, random);
  let best = Infinity;
  let ties = 0;
  let chosen = -1;
  for (let i = 0; i < costs.length; i++) {
    const c = costs[i]!;
    if (c < best) {
      best = c;
      chosen = i;
      ties = 1;
    } else if (c === best) {
      // Reservoir sampling over the tied minimum: uniform without a second pass.
      ties += 1;
      if (random() * ties < 1) chosen = i;
    }
  }
  return chosen;
}

function softmaxSample(costs: readonly number[], temperature: number, random: () => number): number {
  let min = Infinity;
  let max = -Infinity;
  for (const c of costs) {
    if (c < min) min = c;
    if (c > max) max = c;
  }
  // Costs are normalised to [0, 1] so the temperature means the same thing at any scale.
  const span = max - min || 1;
  const weights = costs.map((c) => Math.exp(-((c - min) / span) / temperature));
  const total = weights.reduce((a, b) => a + b, 0);
  let r = random() * total;
  for (let i = 0; i < weights.length; i++) {
    r -= weights[i]!;
    if (r < 0) return i;
  }
  return weights.length - 1;
}
