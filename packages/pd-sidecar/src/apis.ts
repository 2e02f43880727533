import type { PdSplitPath } from "@kv-epp/protocol";

/**
 * How each API the sidecar splits (@kv-epp/protocol's PD_SPLIT_PATHS) spells what the two legs touch.
 * vLLM takes `kv_transfer_params`, `stream` and `stream_options` at the top of every one of these bodies,
 * and answers with `kv_transfer_params` at the top; the output limits and the cached-token count differ.
 */
export type SplitApi = {
  /** The output-token limits the prefill leg sets to 1 (llm-d's token-limit fields per API). */
  limits: readonly string[];
  /** The limits (and min_tokens) sit in `sampling_params`, not at the top: vLLM's token-in generate. */
  inSamplingParams: boolean;
  /**
   * Where a usage object counts the prompt's cached tokens: `usage[details][key]`, or `usage[key]`
   * without `details`. None: the API's answer carries no usage (generate). `uncached`: the usage field
   * counting the rest of the prompt, beside `key` (not including it, as Anthropic's input_tokens), kept
   * so that the two still add up to the prompt when `key` is replaced.
   */
  cached?: { details?: string; key: string; uncached?: string };
};

const OPENAI_CACHED = { details: "prompt_tokens_details", key: "cached_tokens" };

export const SPLIT_APIS: Readonly<Record<PdSplitPath, SplitApi>> = {
  "/v1/completions": { limits: ["max_tokens"], inSamplingParams: false, cached: OPENAI_CACHED },
  "/v1/chat/completions": { limits: ["max_tokens", "max_completion_tokens"], inSamplingParams: false, cached: OPENAI_CACHED },
  // OpenAI Responses: one limit; usage in Responses terms (input_tokens_details).
  "/v1/responses": { limits: ["max_output_tokens"], inSamplingParams: false, cached: { details: "input_tokens_details", key: "cached_tokens" } },
  // Anthropic Messages (vLLM's): max_tokens is its only limit; usage counts cache reads at its top, apart
  // from input_tokens (usage-rewrite.ts says which vLLM reports what).
  "/v1/messages": { limits: ["max_tokens"], inSamplingParams: false, cached: { key: "cache_read_input_tokens", uncached: "input_tokens" } },
  // vLLM's token-in generate: limits in sampling_params; its answer has token ids and no usage.
  "/inference/v1/generate": { limits: ["max_tokens"], inSamplingParams: true },
};

export type Body = Record<string, unknown>;

/** A JSON object (not null, not an array): what a body, a usage or its details must be to be read. */
export const isObject = (v: unknown): v is Body => typeof v === "object" && v !== null && !Array.isArray(v);
