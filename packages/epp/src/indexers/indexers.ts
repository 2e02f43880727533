// The EPP's indexes, by job: the model map (model name -> its KvIndex; what the picker reads), live
// ingestion (listener signals through their filters into an index) and the recovery target (what
// /dump reads and a recovery writes into). One object owns the three so they share one map.
import type { WorkerRef } from "@kv-epp/protocol";
import type { Logger } from "pino";
import type { Metrics } from "../metrics.ts";
import { LiveIngest, type LiveIngestOptions } from "./live-ingest.ts";
import { ModelIndexes, type ViewLost } from "./model-indexes.ts";
import { RecoveryTarget } from "./recovery-target.ts";

export { indexerKey, MAX_ADAPTERS, type Indexer, type Resolved } from "./model-indexes.ts";
export type { RankInfo } from "./live-ingest.ts";

export type IndexersOptions = LiveIngestOptions;

export class Indexers {
  readonly models: ModelIndexes;
  readonly live: LiveIngest;
  readonly recovery: RecoveryTarget;
  private readonly viewLost: ViewLost[] = [];

  constructor(metrics: Metrics, log?: Logger, opts: IndexersOptions = {}) {
    const viewLost: ViewLost = (key, w) => {
      opts.onViewLost?.(key, w);
      for (const f of this.viewLost) f(key, w);
    };
    this.models = new ModelIndexes(metrics, log, viewLost);
    this.live = new LiveIngest(this.models, metrics, log, { ...opts, onViewLost: viewLost });
    this.recovery = new RecoveryTarget(this.models, metrics, log);
  }

  /** Told whenever an index drops a rank's blocks on its own (what tracks that rank's stream, built after the index). */
  whenViewLost(f: ViewLost): void {
    this.viewLost.push(f);
  }

  /** The worker rank left the worker set: its blocks leave every index and its events' record goes. */
  removeWorker(worker: WorkerRef): void {
    this.models.removeWorker(worker);
    this.live.forget(worker);
  }
}
