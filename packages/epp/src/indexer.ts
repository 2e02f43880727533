// One KvIndex per "<model>:<tenant>" key. Turns KV listener signals into index events (in arrival
// order), and is the index side of recovery: a DumpSource for /dump and a DumpTarget whose staging is
// a fresh KvIndex per model, swapped in whole on commit so a failed attempt leaves nothing behind.
import { KvIndex, computeBlockHashes, type IndexEvent, type WorkerRef } from "@kv-epp/index-wasm";
import type { KvEvent, ListenerSignal } from "@kv-epp/kv-events";
import type { DumpSource, DumpStaging, DumpTarget, RouterEvent } from "@kv-epp/recovery";
import type { Metrics } from "./metrics.ts";

export type Indexer = { key: string; blockSize: number; index: KvIndex };

export function indexerKey(model: string, tenant: string): string {
  return `${model}:${tenant}`;
}

export class Indexers implements DumpSource, DumpTarget {
  readonly #byKey = new Map<string, Indexer>();
  /** Model name (as requests carry it) -> indexer key. */
  readonly #byModel = new Map<string, string>();
  #default: string | undefined;

  constructor(private readonly metrics: Metrics) {}

  /** Declares the model served by the configured workers; the first one is the default for requests. */
  register(model: string, tenant: string, blockSize: number): Indexer {
    const key = indexerKey(model, tenant);
    let ix = this.#byKey.get(key);
    if (!ix) {
      ix = { key, blockSize, index: KvIndex.create({ blockSize }) };
      this.#byKey.set(key, ix);
    }
    this.#byModel.set(model, key);
    this.#default ??= key;
    return ix;
  }

  /** The indexer for a request's model; unknown or absent names fall back to the default model. */
  lookup(model?: string): Indexer | undefined {
    const key = (model !== undefined ? this.#byModel.get(model) : undefined) ?? this.#default;
    return key === undefined ? undefined : this.#byKey.get(key);
  }

  get(key: string): Indexer | undefined {
    return this.#byKey.get(key);
  }

  all(): Indexer[] {
    return [...this.#byKey.values()];
  }

  /** Applies one listener signal for one worker rank to the model's index. */
  applySignal(key: string, worker: WorkerRef, signal: ListenerSignal): void {
    const ix = this.#byKey.get(key);
    if (!ix) return;
    if (signal.kind === "reset") {
      ix.index.clearWorker(worker);
      this.metrics.listenerResets.inc({ reason: signal.reason });
      return;
    }
    const events: IndexEvent[] = [];
    for (const e of signal.batch.events) {
      const ev = this.#toIndexEvent(worker, e);
      if (ev) events.push(ev);
    }
    if (events.length === 0) return;
    const out = ix.index.applyBatch(events);
    this.metrics.eventsApplied.inc(events.length - out.rejected);
    // Unknown parent or hash conflict: the index refused it (e.g. a parent lost with a gap).
    if (out.rejected > 0) this.metrics.eventsRejected.inc({ reason: "index" }, out.rejected);
  }

  #toIndexEvent(worker: WorkerRef, e: KvEvent): IndexEvent | undefined {
    switch (e.type) {
      case "BlockStored": {
        // Only GPU residency makes a prefix cheap to serve; offloaded copies are not counted.
        if (e.medium !== null && e.medium !== "GPU") {
          this.metrics.eventsRejected.inc({ reason: "medium" });
          return undefined;
        }
        const tokensHashes = computeBlockHashes(Uint32Array.from(e.tokenIds), e.blockSize);
        const n = Math.min(tokensHashes.length, e.blockHashes.length);
        if (n < e.blockHashes.length) this.metrics.eventsRejected.inc({ reason: "partial_block" });
        if (n === 0) return undefined;
        const blocks = new Array(n);
        for (let i = 0; i < n; i++) blocks[i] = { externalHash: e.blockHashes[i]!, tokensHash: tokensHashes[i]! };
        return { kind: "stored", worker, parentHash: e.parentBlockHash, blocks };
      }
      case "BlockRemoved":
        if (e.medium !== null && e.medium !== "GPU") {
          this.metrics.eventsRejected.inc({ reason: "medium" });
          return undefined;
        }
        return { kind: "removed", worker, hashes: e.blockHashes };
      case "AllBlocksCleared":
        return { kind: "cleared", worker };
    }
  }

  removeWorker(worker: WorkerRef): void {
    for (const ix of this.#byKey.values()) ix.index.removeWorker(worker);
  }

  /** Drops workers the index knows but the worker set does not (e.g. only the peer's dump had them). */
  pruneWorkers(keep: (w: WorkerRef) => boolean): void {
    for (const ix of this.#byKey.values()) for (const w of ix.index.workers()) if (!keep(w)) ix.index.removeWorker(w);
  }

  updateGauges(): void {
    for (const ix of this.#byKey.values()) {
      const s = ix.index.stats();
      this.metrics.indexBlocks.set({ model: ix.key }, s.blocks);
      this.metrics.indexResidencies.set({ model: ix.key }, s.residencies);
      this.metrics.indexWorkers.set({ model: ix.key }, s.workers);
    }
  }

  // --- recovery: DumpSource ---
  *models(): Iterable<{ key: string; blockSize: number; events: Iterable<RouterEvent> }> {
    for (const ix of this.#byKey.values()) yield { key: ix.key, blockSize: ix.blockSize, events: dumpEvents(ix.index) };
  }

  // --- recovery: DumpTarget ---
  begin(): DumpStaging {
    const staged = new Map<string, { blockSize: number; index: KvIndex }>();
    let open = true;
    return {
      apply: (key, blockSize, e) => {
        if (!open) return;
        let s = staged.get(key);
        if (!s) {
          s = { blockSize, index: KvIndex.create({ blockSize }) };
          staged.set(key, s);
        }
        s.index.applyStored(
          { workerId: e.workerId, dpRank: e.dpRank },
          e.parentHash,
          e.blocks.map((b) => ({ externalHash: b.blockHash, tokensHash: b.tokensHash })),
        );
      },
      commit: () => {
        if (!open) return;
        open = false;
        for (const [key, { blockSize, index }] of staged) {
          const ix = this.#byKey.get(key);
          if (ix) {
            // A peer with another block size for the same model has hashes we cannot match against.
            if (ix.blockSize !== blockSize) continue;
            ix.index = index;
          } else {
            // A model only the peer knows: kept, so this replica's /dump stays equal to the peer's.
            this.#byKey.set(key, { key, blockSize, index });
          }
        }
      },
      abort: () => {
        open = false;
        staged.clear();
      },
    };
  }
}

function* dumpEvents(index: KvIndex): Iterable<RouterEvent> {
  let eventId = 0;
  for (const d of index.dump()) {
    yield {
      workerId: d.worker.workerId,
      dpRank: d.worker.dpRank,
      eventId: eventId++,
      parentHash: d.parentHash,
      blocks: d.blocks.map((b) => ({ blockHash: b.externalHash, tokensHash: b.tokensHash })),
    };
  }
}
