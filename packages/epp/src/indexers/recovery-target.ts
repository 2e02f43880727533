// The index side of recovery: a DumpSource for /dump (every model's index, as events, or as the JSON or
// binary body the index module writes itself, with the model's adapters) and a DumpTarget whose staging
// is a fresh KvIndex per served model, swapped in whole on commit so a failed attempt leaves nothing
// behind. The dump's events arrive as runs of one rank (whichever body they came in) and go into the
// staged index in one call each (no block in JS); a binary dump's announced size presizes that index when
// the recovery budget covers it.
import { workerKey, type WorkerRef } from "@kv-epp/protocol";
import { KvIndex } from "@kv-epp/index-wasm";
import { toRouterEvents, type DumpModel, type DumpSource, type DumpStaging, type DumpTarget } from "@kv-epp/recovery";
import type { Logger } from "pino";
import type { Metrics } from "../metrics.ts";
import type { ModelIndexes } from "./model-indexes.ts";

/**
 * Linear memory a presized index takes, per announced block and residency: measured 43-51 bytes per
 * residency at 1M-10M (KvIndex.create({ expected })), above it here so the estimate errs high.
 */
const PRESIZE_BYTES = { block: 40, residency: 26 };
/** Ids in the module are 26-bit: it cannot presize beyond this. */
const MAX_PRESIZE = 1 << 25;

/**
 * The sizes to presize a staged index for, or undefined: only under a budget, and only when the
 * estimate fits in it (a peer's announced size is a claim; what it really sends meets the budget anyway).
 */
export function presizeFor(sizes: { blocks: number; residencies: number }, budgetBytes: number | undefined): { blocks: number; residencies: number } | undefined {
  if (budgetBytes === undefined || sizes.blocks > MAX_PRESIZE || sizes.residencies > MAX_PRESIZE) return undefined;
  const estimate = sizes.blocks * PRESIZE_BYTES.block + sizes.residencies * PRESIZE_BYTES.residency;
  return estimate <= budgetBytes ? sizes : undefined;
}

type Staged = {
  blockSize: number;
  index: KvIndex;
  /** One WorkerRef object per worker rank: the index caches a worker's slot per object. */
  workers: Map<string, WorkerRef>;
};

export class RecoveryTarget implements DumpSource, DumpTarget {
  private readonly modelIndexes: ModelIndexes;
  private readonly metrics: Metrics;
  private readonly log: Logger | undefined;

  constructor(models: ModelIndexes, metrics: Metrics, log?: Logger) {
    this.modelIndexes = models;
    this.metrics = metrics;
    this.log = log;
  }

  /** `onSnapshot`: told each worker of a model in the step its blocks are copied (see KvIndex.dump). */
  *models(opts: { onSnapshot?: (key: string, w: WorkerRef) => void } = {}): Iterable<DumpModel> {
    for (const ix of this.modelIndexes.all()) {
      const onSnapshot = opts.onSnapshot && ((w: WorkerRef) => opts.onSnapshot!(ix.key, w));
      yield {
        key: ix.key,
        blockSize: ix.blockSize,
        events: toRouterEvents(ix.index.dump({ onSnapshot })),
        // The writer uses this instead of `events`: the index module writes the same JSON itself (3-4x faster).
        eventsJson: (chunkBytes) => ix.index.dumpJsonChunks({ chunkBytes, onSnapshot }),
        // The binary body's events, also written by the module (16 bytes per residency, nothing to parse).
        eventsBinary: (chunkBytes) => ix.index.dumpBinaryChunks({ chunkBytes, onSnapshot }),
        sizes: () => {
          const st = ix.index.stats();
          return { blocks: st.blocks, residencies: st.residencies };
        },
        // Adapters learned from events' lora_name: a replica recovered from this one scores them as it does.
        adapters: () => this.modelIndexes.adaptersOf(ix.key),
      };
    }
  }

  /** A target whose stagings may presize from a binary dump's announced size, within `budgetBytes`. */
  within(budgetBytes: number | undefined): DumpTarget {
    return { begin: () => this.beginStaging(budgetBytes) };
  }

  /** A staging without a budget: it never presizes from what a peer announces. */
  begin(): DumpStaging {
    return this.beginStaging(undefined);
  }

  private beginStaging(budgetBytes: number | undefined): DumpStaging {
    const models = this.modelIndexes;
    const staged = new Map<string, Staged>();
    /** The dump's adapter names per model, learned on commit. */
    const adapters: [string, string[]][] = [];
    let open = true;
    const stagedFor = (key: string, blockSize: number, expected?: { blocks: number; residencies: number }): Staged => {
      let s = staged.get(key);
      // The parser skips models accepts() refuses: an unknown key here is a bug, not a peer's choice.
      if (!models.has(key)) throw new Error(`model ${key} is not served by this replica`);
      const ix = models.get(key)!;
      const want = s?.blockSize ?? ix.blockSize;
      if (want !== blockSize) {
        // While this replica's index holds nothing, its size is only the configured one, and the peer's
        // is the one its workers' events taught it (the live rule: the workers' size replaces a
        // configured one while nothing is indexed): the staged index takes the peer's, loudly.
        if (!s && ix.index.stats().residencies === 0) {
          this.metrics.blockSizeMismatches.inc();
          this.log?.error({ model: key, configured: ix.blockSize, peer: blockSize }, "a peer's dump names another KV block size than the configured one: recovering with the peer's (its workers' events set it)");
        } else {
          // Otherwise the peer's hashes are of blocks no request here is cut into: the attempt fails
          // (staging aborted, the next peer tried) rather than "recovering" nothing.
          this.metrics.eventsRejected.inc({ reason: "block_size" });
          throw new Error(`the dump's block size for ${key} is ${blockSize}, this replica's ${want}`);
        }
      }
      if (!s) {
        // Not reserved while staged: the recovery budget counts the staged index's linear memory, and a
        // pool's reserved tables could take it all before the first event; install reserves it on commit.
        const index = KvIndex.create({ blockSize, expected });
        s = { blockSize, index, workers: new Map() };
        staged.set(key, s);
      }
      return s;
    };
    return {
      // Only the models this replica serves are staged: any other model of the dump is skipped unparsed.
      accepts: (key) => models.has(key),
      // A binary dump announces the model's size first: the staged index is presized from it when the budget covers it.
      model: (key, blockSize, sizes) => {
        if (open) stagedFor(key, blockSize, sizes && presizeFor(sizes, budgetBytes));
      },
      // Every event arrives in runs of one rank, applied inside the module in one call (no block in JS).
      events: (key, worker, run) => {
        if (!open) return;
        const s = staged.get(key);
        if (!s) throw new Error(`events of model ${key} before its block size`);
        s.index.applyDumpEvents(workerRef(s.workers, worker), run);
      },
      extras: (key, { adapters: names }) => {
        if (open && names && models.has(key)) adapters.push([key, names]);
      },
      // The staged indexes' linear memory: what the dump really costs this process (checked per chunk).
      stagedBytes: () => {
        let n = 0;
        for (const s of staged.values()) n += s.index.stats().bytes;
        return n;
      },
      commit: () => {
        if (!open) return;
        open = false;
        for (const [key, s] of staged) {
          // A served model; its block size the replica's own, or the peer's while the replica held nothing (stagedFor).
          const ix = models.get(key)!;
          models.install(ix, s.index);
          ix.blockSize = s.blockSize;
        }
        for (const [key, names] of adapters) for (const name of names) models.learnAdapter(models.get(key)!, name, "a peer's dump");
      },
      abort: () => {
        open = false;
        adapters.length = 0;
        staged.clear();
      },
    };
  }
}

function workerRef(refs: Map<string, WorkerRef>, worker: WorkerRef): WorkerRef {
  const key = workerKey(worker);
  let w = refs.get(key);
  if (!w) refs.set(key, (w = { workerId: worker.workerId, dpRank: worker.dpRank }));
  return w;
}
