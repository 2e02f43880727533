// The model map: one KvIndex per "<model>:<tenant>" key, the model names and LoRA adapters requests
// carry resolved to it, and the rule that a trapped index is replaced. Everything that reads or writes
// an index (the picker, live ingestion, recovery) finds it here.
import { KvIndex, MAX_RESERVE } from "@kv-epp/index-wasm";
import type { WorkerRef } from "@kv-epp/protocol";
import type { ChatEngine } from "@kv-epp/tokenizer";
import type { Logger } from "pino";
import type { Metrics } from "../metrics.ts";
import { sglangAdapterForm } from "./sglang-adapter.ts";

export type Indexer = { key: string; blockSize: number; index: KvIndex };

/** A request's model resolved: its index, and the LoRA adapter its blocks are named with (null: the base model). */
export type Resolved = { indexer: Indexer; loraName: string | null };

/**
 * Told when a model's index drops blocks on its own rather than by an event (a rank over its capacity,
 * or every rank when a trapped index is replaced: `worker` null), so whatever tracks those ranks' views
 * (their stream cursors) knows they no longer match the workers.
 */
export type ViewLost = (key: string, worker: WorkerRef | null) => void;

export function indexerKey(model: string, tenant: string): string {
  return `${model}:${tenant}`;
}

/** Adapter names learned from events, at most (a stream naming ever new adapters must not grow this without bound). */
export const MAX_ADAPTERS = 4096;
/** Names and ranks logged once each, at most. */
export const MAX_LOGGED = 1024;
/** A reservation grows only past this factor of the last one (ModelIndexes.reserve). */
const RESERVE_STEP = 1.1;

export class ModelIndexes {
  private readonly byKey = new Map<string, Indexer>();
  /** Model name (as requests carry it) -> indexer key. */
  private readonly byModel = new Map<string, string>();
  /** LoRA adapter name (a request's `model`) -> the key of the index holding the base model's workers. */
  private readonly adapterKeys = new Map<string, string>();
  private readonly loggedUnknown = new Set<string>();
  private default: string | undefined;
  /** How requests name a LoRA adapter: vLLM's `model` is the adapter's name, SGLang's `model` "<base>:<adapter>". */
  private adapterRules: ChatEngine = "vllm";
  private readonly metrics: Metrics;
  private readonly log: Logger | undefined;
  private readonly onViewLost: ViewLost | undefined;

  constructor(metrics: Metrics, log?: Logger, onViewLost?: ViewLost) {
    this.metrics = metrics;
    this.log = log;
    this.onViewLost = onViewLost;
  }

  /** Declares the model served by the configured workers; the first one is the default for requests. */
  register(model: string, tenant: string, blockSize: number): Indexer {
    const key = indexerKey(model, tenant);
    let ix = this.byKey.get(key);
    if (!ix) {
      ix = { key, blockSize, index: this.newIndex(blockSize) };
      this.byKey.set(key, ix);
    }
    this.byModel.set(model, key);
    this.default ??= key;
    return ix;
  }

  /** The workers' engine's rule for a request's adapter (vLLM's until told). */
  readAdaptersAs(rules: ChatEngine): void {
    this.adapterRules = rules;
  }

  /** Declares an adapter of a registered model (from config); events' lora_name add more. */
  registerAdapter(name: string, model: string): void {
    const key = this.byModel.get(model);
    if (key !== undefined && !this.byModel.has(name)) this.adapterKeys.set(name, key);
  }

  /**
   * An adapter named by a stored event of `ix`'s workers, or by a recovered dump of its model (the peer
   * learned it so): bounded by MAX_ADAPTERS, counted past it.
   */
  learnAdapter(ix: Indexer, name: string, from: "KV events" | "a peer's dump" = "KV events"): void {
    if (this.adapterKeys.has(name) || this.byModel.has(name)) return;
    if (this.adapterKeys.size >= MAX_ADAPTERS) {
      this.metrics.eventsRejected.inc({ reason: "adapter_limit" });
      return;
    }
    this.adapterKeys.set(name, ix.key);
    this.log?.info({ adapter: name, model: ix.key }, `LoRA adapter learned from ${from}`);
  }

  /** The adapter names whose requests score in `key`'s index (what /dump tells a recovering peer). */
  *adaptersOf(key: string): Iterable<string> {
    for (const [name, k] of this.adapterKeys) if (k === key) yield name;
  }

  /** Adapter names known, per indexer key (GET /workers, tests). */
  adapters(): Map<string, string> {
    return new Map(this.adapterKeys);
  }

  /**
   * A request's model: a served model's own index; an adapter's name (vLLM's rule), or under SGLang's a served
   * model's "<base>:<adapter>": the index of the model it adapts, scored in the adapter's identity (an SGLang adapter
   * need not be known here: its name is what SGLang's events call its blocks); absent or unknown: the default model
   * (an unknown name is logged once), as requests were always routed.
   */
  resolve(model?: string): Resolved | undefined {
    const named = this.named(model);
    if (named === undefined && model !== undefined) this.unknownModel(model);
    const indexer = this.sound(this.byKey.get(named?.key ?? this.default ?? ""));
    return indexer ? { indexer, loraName: named?.loraName ?? null } : undefined;
  }

  /** The indexer for a request's model (see resolve); unknown or absent names fall back to the default model. */
  lookup(model?: string): Indexer | undefined {
    return this.resolve(model)?.indexer;
  }

  /** The LoRA adapter a request's model names, or null (the picker's IndexLookup). */
  adapterOf(model?: string): string | null {
    return this.named(model)?.loraName ?? null;
  }

  /** The index key and adapter a request's model names (see resolve); undefined when it names no model known here. */
  private named(model: string | undefined): { key: string; loraName: string | null } | undefined {
    if (model === undefined) return undefined;
    const served = this.byModel.get(model);
    if (served !== undefined) return { key: served, loraName: null };
    const form = this.adapterRules === "sglang" ? sglangAdapterForm(model) : undefined;
    const base = form && this.byModel.get(form.base);
    if (base !== undefined) return { key: base, loraName: form!.adapter };
    const adapted = this.adapterKeys.get(model);
    return adapted !== undefined ? { key: adapted, loraName: model } : undefined;
  }

  private unknownModel(model: string): void {
    if (this.loggedUnknown.has(model) || this.loggedUnknown.size >= MAX_LOGGED) return;
    this.loggedUnknown.add(model);
    this.log?.warn({ model, fallback: this.default }, "request names an unknown model or adapter: scored as the default model");
  }

  /**
   * An index whose module trapped (linear memory that could not grow) is no longer trusted: it is
   * replaced by an empty one, as if every worker had reset, and counted. Routing goes on by load while
   * new events fill it again.
   */
  sound(ix: Indexer | undefined): Indexer | undefined {
    if (ix?.index.trapped) {
      ix.index = this.newIndex(ix.blockSize);
      this.metrics.indexTraps.inc();
      this.onViewLost?.(ix.key, null);
    }
    return ix;
  }

  /**
   * Sizes every index's tables for the pool's KV capacity (its ranks' num_gpu_blocks summed, as scraped):
   * the residencies the caches can hold together bound what the index holds, so as they fill no table
   * grows, and ingestion never stops for a rebuild that re-places every entry (at millions of entries,
   * tens of milliseconds of event loop each). Only grows, and only by more than RESERVE_STEP: ranks
   * joining one by one (a scale-out, a rolling update's surge) rebuild the full tables a few times, not
   * once per rank (the tables hold up to 80% before growing, so a reservation 10% short still holds).
   * A rank leaving keeps the tables. If the host refuses the memory, the index is left as it was and
   * reserving stops (logged): the tables grow as the index fills.
   */
  reserve(residencies: number): void {
    const target = Math.min(residencies, MAX_RESERVE);
    if (!this.reserving || target <= this.reservedFor * RESERVE_STEP) return;
    if (target < residencies) this.log?.warn({ residencies, reserved: target }, "the ranks' KV capacity is above the index's limit: tables reserved for the limit");
    this.reservedFor = target;
    for (const ix of this.byKey.values()) this.reserved(ix.index); // a trapped one is skipped: replaced, reserved, on its next use
    if (this.reserving) this.log?.info({ residencies: target }, "KV index tables reserved for the ranks' KV capacity");
    this.metrics.indexReserved.set(this.reserving ? target : 0);
  }

  /** An empty index, its tables reserved like the others' (a plain one if reserving it trapped: it held nothing). */
  newIndex(blockSize: number): KvIndex {
    const index = this.reserved(KvIndex.create({ blockSize }));
    return index.trapped ? KvIndex.create({ blockSize }) : index;
  }

  /**
   * Puts a recovered index in ix's place, reserved like the others: its tables grow now if the
   * reservation is larger, a rebuild of the recovered content before the replica reports Ready (a
   * refused reservation leaves it as it is).
   */
  install(ix: Indexer, index: KvIndex): void {
    ix.index = this.reserved(index);
  }

  private reserving = true;
  private reservedFor = 0;

  private reserved(index: KvIndex): KvIndex {
    if (!this.reserving || this.reservedFor === 0 || index.trapped) return index;
    let ok = false;
    try {
      ok = index.reserve(this.reservedFor);
    } catch {
      // a trap on the way (the index is replaced on its next use, see sound)
    }
    if (!ok) {
      this.reserving = false;
      this.metrics.indexReserved.set(0);
      this.log?.warn({ residencies: this.reservedFor }, "KV index tables could not be reserved (memory refused): they grow as the index fills");
    }
    return index;
  }

  /** Turns reservations off (--index-reserve false): the tables grow as the index fills. */
  disableReserve(): void {
    this.reserving = false;
  }

  get(key: string): Indexer | undefined {
    return this.byKey.get(key);
  }

  has(key: string): boolean {
    return this.byKey.has(key);
  }

  all(): IterableIterator<Indexer> {
    return this.byKey.values();
  }

  /** The worker's blocks leave every model's index. */
  removeWorker(worker: WorkerRef): void {
    for (const ix of this.byKey.values()) ix.index.removeWorker(worker);
  }

  /** Drops workers the index knows but the worker set does not (e.g. only the peer's dump had them). */
  pruneWorkers(keep: (w: WorkerRef) => boolean): void {
    for (const ix of this.byKey.values()) for (const w of ix.index.workers()) if (!keep(w)) ix.index.removeWorker(w);
  }

  updateGauges(): void {
    for (const ix of this.byKey.values()) {
      const s = ix.index.stats();
      this.metrics.indexBlocks.set({ model: ix.key }, s.blocks);
      this.metrics.indexResidencies.set({ model: ix.key }, s.residencies);
      this.metrics.indexWorkers.set({ model: ix.key }, s.workers);
      this.metrics.indexTableRebuilds.set({ model: ix.key }, s.tableRebuilds);
    }
  }
}
