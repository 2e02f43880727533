import { computeBlockHashes, requestBlockExtras } from "@kv-epp/index-wasm";
import type { Adapter } from "./lora-mix.ts";
import { recordTokens } from "../tokens.ts";
import type { TraceRecord } from "../trace.ts";

/** One trace record as the simulation replays it. */
export type SimRequest = {
  id: number;
  /** virtual ms since the replay started (time-compressed) */
  arrivalMs: number;
  promptTokens: number;
  outputTokens: number;
  /** full blocks of the prompt at the router's block size */
  requestBlocks: number;
  /** the prompt, synthesised from the trace; dropped once the worker admitted it */
  tokens: Uint32Array | null;
  /** the router's local block hashes (XXH3, docs/CONTRACTS.md §3) of the prompt */
  localHashes: BigUint64Array;
  /** The LoRA adapter that runs it (absent or null: the base model). */
  adapter?: Adapter;
};

/** What the worker's cache keys the request's blocks by besides its tokens (vLLM's lora_name and lora_int_id). */
export function cacheIdentity(req: Pick<SimRequest, "adapter">): { loraName?: string; loraId?: number } {
  return req.adapter ? { loraName: req.adapter.name, loraId: req.adapter.id } : {};
}

export function toSimRequest(id: number, rec: TraceRecord, arrivalMs: number, blockSize: number, adapter: Adapter = null): SimRequest {
  const tokens = recordTokens(rec);
  const blocks = Math.floor(tokens.length / blockSize);
  // The router hashes a request in its adapter's identity, as the EPP's Picker does.
  const extras = adapter ? requestBlockExtras(blocks, blockSize, { loraName: adapter.name }) : undefined;
  return {
    id,
    arrivalMs,
    promptTokens: tokens.length,
    outputTokens: rec.outputLength,
    requestBlocks: blocks,
    tokens,
    localHashes: computeBlockHashes(tokens, blockSize, extras),
    adapter,
  };
}
