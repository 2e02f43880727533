// The bench workload, generated identically in the bench process (index contents) and the load
// generator (request bodies) from the same seed: documents of 8k tokens that workers hold prefixes
// of, and 8k-token prompts that share a random-length prefix with one document.
import type { RouterEvent } from "@kv-epp/protocol";
import { computeBlockHashes } from "@kv-epp/index-wasm";
import { mulberry32 } from "@kv-epp/testkit";
import type { DumpSource } from "@kv-epp/recovery";

export const WORKLOAD = {
  workers: 16,
  docs: 64,
  docTokens: 8192,
  promptTokens: 8192,
  blockSize: 16,
  docsPerWorker: 24,
  /** Blocks per stored event in the synthetic dump (vLLM stores a prefill's blocks in one event). */
  blocksPerEvent: 64,
  vocab: 151_000,
  model: "bench-model",
} as const;

export function docTokens(doc: number): Uint32Array {
  const next = mulberry32(0x5eed0000 + doc);
  return Uint32Array.from({ length: WORKLOAD.docTokens }, () => next() % WORKLOAD.vocab);
}

export function workerId(w: number): string {
  return `worker-${String(w).padStart(2, "0")}`;
}

/** Worker w holds a prefix of docsPerWorker documents (128..512 blocks each), as a dump source. */
export function syntheticIndex(seed: number): DumpSource & { residencies: number } {
  const docs = Array.from({ length: WORKLOAD.docs }, (_, d) => computeBlockHashes(docTokens(d), WORKLOAD.blockSize));
  const next = mulberry32(seed);
  const holdings = Array.from({ length: WORKLOAD.workers }, () => {
    const chosen = new Set<number>();
    while (chosen.size < WORKLOAD.docsPerWorker) chosen.add(next() % WORKLOAD.docs);
    return [...chosen].map((d) => ({ doc: d, blocks: 128 + (next() % 385) }));
  });
  const residencies = holdings.flat().reduce((n, h) => n + h.blocks, 0);
  // Block hashes are content-derived in vLLM, so the same block has the same id on every worker.
  const ext = (doc: number, i: number) => (BigInt(doc + 1) << 32n) | BigInt(i + 1);
  function* events(): Iterable<RouterEvent> {
    let eventId = 0;
    for (let w = 0; w < WORKLOAD.workers; w++)
      for (const { doc, blocks } of holdings[w]!)
        for (let start = 0; start < blocks; start += WORKLOAD.blocksPerEvent) {
          const end = Math.min(start + WORKLOAD.blocksPerEvent, blocks);
          const list = [];
          for (let i = start; i < end; i++) list.push({ blockHash: ext(doc, i), tokensHash: docs[doc]![i]! });
          yield { workerId: workerId(w), dpRank: 0, eventId: eventId++, parentHash: start === 0 ? null : ext(doc, start - 1), blocks: list };
        }
  }
  return {
    residencies,
    models: () => [{ key: `${WORKLOAD.model}:default`, blockSize: WORKLOAD.blockSize, events: events() }],
  };
}

/** n distinct request bodies: a random-length prefix of a random document, then fresh tokens. */
export function requestBodies(n: number, seed: number): Uint8Array[] {
  const next = mulberry32(seed);
  const enc = new TextEncoder();
  const cache = new Map<number, Uint32Array>();
  return Array.from({ length: n }, () => {
    const doc = next() % WORKLOAD.docs;
    let tokens = cache.get(doc);
    if (!tokens) cache.set(doc, (tokens = docTokens(doc)));
    const shared = (next() % (WORKLOAD.promptTokens / WORKLOAD.blockSize + 1)) * WORKLOAD.blockSize;
    const prompt = new Array<number>(WORKLOAD.promptTokens);
    for (let i = 0; i < shared; i++) prompt[i] = tokens[i]!;
    for (let i = shared; i < prompt.length; i++) prompt[i] = next() % WORKLOAD.vocab;
    return enc.encode(JSON.stringify({ model: WORKLOAD.model, prompt, max_tokens: 16, stream: true }));
  });
}
