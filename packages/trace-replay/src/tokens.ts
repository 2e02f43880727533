// Token synthesis for trace records: each hash id expands to 512 deterministic token ids (a PRNG seeded
// by the id), the last block cut to input_length. Routers hashing these tokens with any block size see
// exactly the prefix sharing the trace encodes.
import { mulberry32 } from "@kv-epp/testkit";
import { TRACE_BLOCK_TOKENS, type TraceRecord } from "./trace.ts";

/** Token ids are drawn below this (Qwen3's vocabulary size), so they are plausible ids for any model. */
export const SYNTH_VOCAB = 151_643;

function fillFromSeed(out: Uint32Array, hashId: number): void {
  // Mixing the id first keeps the streams of neighbouring ids apart.
  const next = mulberry32((Math.imul(hashId ^ 0x9e3779b9, 0x85ebca6b) + 0x7f4a7c15) >>> 0);
  for (let i = 0; i < out.length; i++) out[i] = next() % SYNTH_VOCAB;
}

/** The 512 token ids of one trace block. */
export function blockTokens(hashId: number): Uint32Array {
  const out = new Uint32Array(TRACE_BLOCK_TOKENS);
  fillFromSeed(out, hashId);
  return out;
}

/** The full prompt of a record: input_length token ids. */
export function recordTokens(rec: TraceRecord): Uint32Array {
  const out = new Uint32Array(rec.inputLength);
  rec.hashIds.forEach((id, i) => {
    const at = i * TRACE_BLOCK_TOKENS;
    const block = blockTokens(id);
    out.set(block.subarray(0, Math.min(TRACE_BLOCK_TOKENS, rec.inputLength - at)), at);
  });
  return out;
}
