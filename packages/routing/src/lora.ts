// LoRA affinity: for a request naming an adapter, how well a rank can take it, from the adapters its
// engine reports running and waiting and how many it may hold at once (vLLM's vllm:lora_requests_info).
// The tiers and their values are llm-d's lora-affinity-scorer's; decide() turns the shortfall from 1 into a
// charge in the units of the cost in use.

/** A rank's adapters as its engine last reported them. */
export type LoraAdapters = {
  /** Adapters of the requests in its running batch. */
  readonly running: ReadonlySet<string>;
  /** Adapters of the requests waiting to be scheduled. */
  readonly waiting: ReadonlySet<string>;
  /** The most adapters a batch may hold (vLLM's --max-loras); 0 when not reported. */
  readonly maxLora: number;
};

/**
 * How well a rank fits a request's adapter, in llm-d's order: already running (1); room for one more
 * adapter, running and waiting counted together (0.8); already queued to load (0.6); full, the adapter
 * waits for another to leave the batch (0).
 */
export function loraAffinity(adapters: LoraAdapters, adapter: string): number {
  if (adapters.running.has(adapter)) return 1;
  if (adapters.running.size + adapters.waiting.size < adapters.maxLora) return 0.8;
  if (adapters.waiting.has(adapter)) return 0.6;
  return 0;
}

/**
 * The affinity decide() reads for a candidate: undefined when the request names no adapter (no charge at
 * all) or the rank reports none (an engine without LoRA enabled, a failed scrape, a vLLM before its first
 * engine step), which decide() charges as no fit, 0, as llm-d scores it, unless no candidate reports.
 */
export function affinityOf(adapters: LoraAdapters | undefined, adapter: string | null): number | undefined {
  return adapter !== null && adapters !== undefined ? loraAffinity(adapters, adapter) : undefined;
}

/**
 * llm-d's weight for the scorer where its profiles enable it (1, beside prefix 3 and queue 2). Under the
 * score shape it is that, in score units; under the blocks shape and the latency cost a rank of affinity 0
 * is charged the weight times the request's whole prefill there (its blocks x the prefill scale, or its
 * tokens at the latency line's rate), the others in proportion to their shortfall.
 */
export const DEFAULT_LORA_WEIGHT = 1;
