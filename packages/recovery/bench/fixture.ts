// Shared pieces of the recovery benchmark: a deterministic 1M-residency KvIndex, the DumpSource adapter over
// KvIndex.dump(), a DumpTarget whose staging is a fresh KvIndex, and RSS sampling.
import { KvIndex } from "@kv-epp/index-wasm";
import { applyEvents, type IndexEvent } from "@kv-epp/index-wasm/helpers";
import { type DumpSource, type DumpStaging, type DumpTarget, toRouterEvents } from "../src/index.ts";

export const MODEL_KEY = "Qwen/Qwen3-0.6B:default";
export const BLOCK_SIZE = 16;
export const WORKERS = 64;
export const BLOCKS_PER_WORKER = 16_384;
/** Each worker holds sequences of this many blocks; the first SHARED of each are common to all workers. */
export const CHAIN = 32;
export const SHARED = 8;

/** splitmix64: deterministic, full-range u64 hashes (half of them >= 2^63). */
function splitmix(seed: bigint): bigint {
  let z = (seed + 0x9e3779b97f4a7c15n) & 0xffff_ffff_ffff_ffffn;
  z = ((z ^ (z >> 30n)) * 0xbf58476d1ce4e5b9n) & 0xffff_ffff_ffff_ffffn;
  z = ((z ^ (z >> 27n)) * 0x94d049bb133111ebn) & 0xffff_ffff_ffff_ffffn;
  return z ^ (z >> 31n);
}

/**
 * 64 workers x 16k blocks = 1,048,576 residencies (x 160k blocks: 10,485,760); shared prefixes make the tree
 * smaller than that.
 */
export function buildIndex(blocksPerWorker = BLOCKS_PER_WORKER): KvIndex {
  const index = KvIndex.create({ blockSize: BLOCK_SIZE });
  const chains = blocksPerWorker / CHAIN;
  for (let w = 0; w < WORKERS; w++) {
    const worker = { workerId: `worker-${w}`, dpRank: 0 };
    const batch: IndexEvent[] = [];
    for (let c = 0; c < chains; c++) {
      let parent: bigint | null = null;
      const blocks = [];
      for (let b = 0; b < CHAIN; b++) {
        // Shared prefix: same hashes for every worker; the rest is unique per worker.
        const id = b < SHARED ? BigInt(c * CHAIN + b) : BigInt(((w + 1) * chains + c) * CHAIN + b) << 8n;
        const h = splitmix(id);
        blocks.push({ blockHash: h, tokensHash: splitmix(h) });
      }
      batch.push({ kind: "stored", worker, parentHash: parent, blocks });
      parent = null;
    }
    applyEvents(index, batch);
  }
  return index;
}

/**
 * The EPP's adapter, in small: KvIndex.dump() events as RouterEvents, numbered as they stream; with `json`
 * (default) also the module's pre-formatted JSON and binary events, which the writers then use instead,
 * and the index's size for the binary body to announce.
 */
export function indexSource(index: KvIndex, key = MODEL_KEY, opts: { json?: boolean } = {}): DumpSource {
  return {
    models: () => [
      {
        key,
        blockSize: index.blockSize,
        ...(opts.json !== false
          ? {
              eventsJson: (chunkBytes: number) => index.dumpJsonChunks({ chunkBytes }),
              eventsBinary: (chunkBytes: number) => index.dumpBinaryChunks({ chunkBytes }),
              sizes: () => ({ blocks: index.stats().blocks, residencies: index.stats().residencies }),
            }
          : {}),
        events: toRouterEvents(index.dump()),
      },
    ],
  };
}

/**
 * A staging that is a fresh KvIndex per model: each run of events applied inside the module
 * (KvIndex.applyDumpEvents), the index presized from a binary body's announced size unless `presize` is
 * false; commit hands the indexes over.
 */
export function indexTarget(onCommit: (indexes: Map<string, KvIndex>) => void, opts: { presize?: boolean } = {}): DumpTarget {
  return {
    begin(): DumpStaging {
      const indexes = new Map<string, KvIndex>();
      return {
        accepts: () => true,
        model(key, blockSize, sizes) {
          if (!indexes.has(key)) indexes.set(key, KvIndex.create({ blockSize, expected: opts.presize !== false ? sizes : undefined }));
        },
        events(key, worker, run) {
          indexes.get(key)!.applyDumpEvents(worker, run);
        },
        extras() {},
        stagedBytes: () => 0,
        commit: () => onCommit(indexes),
        abort: () => indexes.clear(),
      };
    },
  };
}

/** Samples resident set size while something runs (timers fire between the chunks of a streamed dump). */
export function rssSampler(periodMs = 2) {
  let peak = process.memoryUsage.rss();
  const timer = setInterval(() => {
    peak = Math.max(peak, process.memoryUsage.rss());
  }, periodMs);
  return {
    sample: () => void (peak = Math.max(peak, process.memoryUsage.rss())),
    reset: () => void (peak = process.memoryUsage.rss()),
    peak: () => Math.max(peak, process.memoryUsage.rss()),
    stop: () => clearInterval(timer),
  };
}

export const MiB = 1024 * 1024;
