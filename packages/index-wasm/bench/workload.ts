// Synthetic KV-event workloads for the index benchmark: workers storing chains of blocks that share
// prompt prefixes, with block hashes derived per worker from the prefix (as vLLM does).
import { mulberry32 } from "@kv-epp/testkit";
import type { StoredBlock, WorkerRef } from "../src/types.ts";
import type { IndexEvent } from "../src/helpers.ts";

export function u64(next: () => number): bigint {
  return (BigInt(next()) << 32n) | BigInt(next());
}

export function workers(n: number): WorkerRef[] {
  return Array.from({ length: n }, (_, i) => ({ workerId: `vllm-decode-${i >> 1}`, dpRank: i & 1 }));
}

const M = 0xffffffffffffffffn;
/** The block hash of a block given its parent's, the way an engine chains them (opaque to the index). */
export function chainHash(parent: bigint, tokensHash: bigint, salt: bigint): bigint {
  let h = (parent ^ tokensHash ^ salt) & M;
  h = ((h ^ (h >> 31n)) * 0xbf58476d1ce4e5b9n) & M;
  return (h ^ (h >> 29n)) & M;
}

/** Blocks of one sequence (tokens hashes) as the given worker reports them. */
export function storedBlocks(tokens: BigUint64Array, workerIndex: number): StoredBlock[] {
  const salt = BigInt(workerIndex + 1) * 0x9e3779b97f4a7c15n & M;
  let parent = 0n;
  return Array.from(tokens, (t) => (parent = chainHash(parent, t, salt), { blockHash: parent, tokensHash: t }));
}

/**
 * `sequences` token-hash chains of `length` blocks: the first `sharedLength` blocks come from one of
 * `prompts` common prefixes (system prompts, few-shot headers), the rest is unique.
 */
export function sequences(count: number, length: number, sharedLength: number, prompts: number, seed: number): BigUint64Array[] {
  const next = mulberry32(seed);
  const promptBlocks = Array.from({ length: prompts }, () => BigUint64Array.from({ length: sharedLength }, () => u64(next)));
  return Array.from({ length: count }, () => {
    const seq = new BigUint64Array(length);
    seq.set(promptBlocks[next() % prompts]!);
    for (let i = sharedLength; i < length; i++) seq[i] = u64(next);
    return seq;
  });
}

/** One stored event per (worker, sequence) assignment. */
export function storedEvents(ws: WorkerRef[], seqs: BigUint64Array[], assign: (seq: number) => number[]): IndexEvent[] {
  const events: IndexEvent[] = [];
  seqs.forEach((seq, s) => {
    for (const w of assign(s)) events.push({ kind: "stored", worker: ws[w]!, parentHash: null, blocks: storedBlocks(seq, w) });
  });
  return events;
}
