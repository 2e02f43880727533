import { computeBlockHashes } from "@kv-epp/index-wasm";
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
};

export function toSimRequest(id: number, rec: TraceRecord, arrivalMs: number, blockSize: number): SimRequest {
  const tokens = recordTokens(rec);
  return {
    id,
    arrivalMs,
    promptTokens: tokens.length,
    outputTokens: rec.outputLength,
    requestBlocks: Math.floor(tokens.length / blockSize),
    tokens,
    localHashes: computeBlockHashes(tokens, blockSize),
  };
}
