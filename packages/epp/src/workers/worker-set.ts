// The EPP's worker set, in one place: where workers come from (the static list or the InferencePool's
// pods, plus attachment intents), how those sources merge, the KV listener per worker rank (through
// WorkerRegistry), each worker's health (its scraped /metrics, and the rule that takes a worker out of
// routing) and the counters of all of it. "Why is worker X not routable?" is answered by rankStatus().
import { rankSources, workerKeyOf, type WorkerRef, type WorkerRole, type WorkerSpec } from "@kv-epp/protocol";
import { mergeWorkerSets, type IntentWorker } from "@kv-epp/intents";
import { listenerHeartbeat, type ListenerCounters as KvListenerCounters } from "@kv-epp/kv-events";
import type { Logger } from "pino";
import type { EppConfig } from "../config.ts";
import type { KubeSources } from "../kube-sources.ts";
import { startIntentSource, type IntentSource } from "../intents-source.ts";
import type { Metrics } from "../metrics.ts";
import { scrapeTargets, WorkerMetricsScraper, type WorkerMetrics } from "./worker-metrics.ts";
import { ModelRewrites } from "./model-rewrites.ts";
import { ObjectivePriorities } from "./objectives.ts";
import type { Candidate, WorkerSignals } from "@kv-epp/routing";
import { serving, WorkerRegistry, type Sink } from "./registry.ts";
import { staticWorkers } from "./static.ts";

/**
 * Consecutive failed /metrics scrapes after which a static worker is down (static mode's only way to
 * learn that a worker went away; in Kubernetes mode pod readiness says it, and a slow /metrics alone
 * must not take a worker out of routing).
 */
export const DOWN_AFTER_FAILED_SCRAPES = 3;

export type WorkerSetOptions = {
  config: Pick<EppConfig, "workers" | "intents" | "kvTopic" | "kvHeartbeatMs" | "scrapeIntervalMs"> & Partial<Pick<EppConfig, "kvMaxMessageBytes" | "objectivePriorities" | "model">>;
  /** The Kubernetes-backed sources (Kubernetes mode, intents on Leases). */
  kube: () => KubeSources;
  metrics: Metrics;
  log: Logger;
};

/** One worker rank as the set sees it (GET /workers). */
export type RankStatus = {
  workerId: string;
  dpRank: number;
  /** The API server the gateway is sent to for this rank. */
  address: string;
  kvEvents: string;
  connected: boolean;
  /** A candidate for routing; false while its worker is down. */
  routable: boolean;
  /** Consecutive failed scrapes of the worker's /metrics (0: the last one answered). */
  failedScrapes: number;
  /** Its worker's role in prefill/decode disaggregation (absent: a destination only). */
  role?: WorkerRole;
};

export class WorkerSet {
  private readonly o: WorkerSetOptions;
  private readonly registry: WorkerRegistry;
  private readonly scraper: WorkerMetricsScraper;
  private readonly failedScrapes = new Map<string, number>();
  private listed: WorkerSpec[] = [];
  private intents: IntentWorker[] = [];
  private lastMerge = { unroutable: "[]", aliases: "[]" };
  private pool: Promise<{ stop(): Promise<void> }> = Promise.resolve({ stop: async () => {} });
  private intentSource: IntentSource | undefined;
  private readonly llmdWatches: { stop(): Promise<void> }[] = [];
  /**
   * Objective name -> priority, for the requests' objective header: the pool's InferenceObjectives
   * (Kubernetes mode, followed from start) over --objective-priorities.
   */
  readonly objectives: ObjectivePriorities;
  /** The pool's InferenceModelRewrites (Kubernetes mode): the model a request is sent as, by its body's model. */
  readonly modelRewrites = new ModelRewrites();
  private readonly removed: ((worker: WorkerRef) => void)[] = [];
  private readonly kvCapacityListeners: ((blocks: number) => void)[] = [];
  private indexBlockSize: (() => number) | undefined;
  private readonly poolPresenceListeners: ((present: boolean) => void)[] = [];
  private present = true;

  constructor(o: WorkerSetOptions) {
    this.o = o;
    const { config: cfg, metrics, log } = o;
    this.objectives = new ObjectivePriorities(cfg.objectivePriorities);
    this.scraper = new WorkerMetricsScraper({
      intervalMs: cfg.scrapeIntervalMs,
      blockSize: () => this.blockSize(),
      onError: (workerId, err) => this.scrapeFailed(workerId, err),
      onSuccess: (workerId) => {
        if (this.failedScrapes.delete(workerId)) this.registry.markUp(workerId);
      },
      onRound: () => {
        if (this.kvCapacityListeners.length === 0) return;
        const blocks = this.kvCapacity();
        for (const f of this.kvCapacityListeners) f(blocks);
      },
    });
    this.registry = new WorkerRegistry({
      topic: cfg.kvTopic,
      heartbeat: cfg.kvHeartbeatMs > 0 ? listenerHeartbeat(cfg.kvHeartbeatMs) : undefined,
      maxMessageSize: cfg.kvMaxMessageBytes,
      log,
      onRemoved: (w) => {
        for (const f of this.removed) f(w);
      },
      onMalformed: (kind) => metrics.kvMalformed.inc({ kind }),
      onDropped: (reason, n) => metrics.eventsDropped.inc({ reason }, n),
      onUnknownFields: (n) => metrics.unknownFields.inc(n),
      onChanged: (specs) => {
        this.scraper.setTargets(specs.flatMap(scrapeTargets));
        metrics.workers.set(specs.reduce((n, s) => n + s.dpSize, 0));
      },
    });
  }

  /**
   * Where the index's block size comes from once the workers' events or a recovered dump have set it
   * (SGLang's pool, in tokens, is counted in those blocks when read; without it, the configured size).
   */
  countPoolsIn(blockSize: () => number): void {
    this.indexBlockSize = blockSize;
  }

  private blockSize(): number {
    return this.indexBlockSize?.() ?? this.o.config.model?.blockSize ?? 0;
  }

  /** Told when a worker rank leaves the set (or a down worker's publisher is gone too): its blocks and stream go. */
  whenRemoved(f: (worker: WorkerRef) => void): void {
    this.removed.push(f);
  }

  /**
   * Whether the worker source is there to route to: always with the static list; in Kubernetes mode,
   * while the InferencePool exists and is not being deleted (a deleted pool clears the workers).
   */
  get poolPresent(): boolean {
    return this.present;
  }

  /** Told when poolPresent changes (Kubernetes mode: the pool deleted, or back with its pods listed). */
  whenPoolPresence(f: (present: boolean) => void): void {
    this.poolPresenceListeners.push(f);
  }

  /** Told after each scrape round of the KV blocks the set's ranks can hold together, as scraped so far (kvCapacity). */
  whenKvCapacity(f: (blocks: number) => void): void {
    this.kvCapacityListeners.push(f);
  }

  /**
   * Starts the sources (the static list at once; the pool's pod list-watch and the intents in the background)
   * and the scraper. Resolves once the pool's pods are listed and the intents' first attempt has
   * settled; rejects when `signal` aborts first (shutdown during discovery).
   */
  start(signal: AbortSignal): Promise<void> {
    const { config: cfg, log, metrics } = this.o;
    const w = cfg.workers;
    if (w.mode === "static") {
      this.listed = staticWorkers(w.list);
      this.reconcileMerged();
    } else {
      const poolLog = log.child({ component: "pool" });
      this.present = false;
      const kube = this.o.kube();
      this.pool = kube.poolWorkers({
        poolName: w.poolName,
        namespace: w.namespace,
        kvEventsPort: w.kvEventsPort,
        kvReplayPort: w.kvReplayPort,
        dpSize: w.dpSize,
        log: poolLog,
        onWorkers: (specs) => {
          this.listed = specs;
          this.reconcileMerged();
        },
        onPoolPresence: (present) => {
          this.present = present;
          for (const f of this.poolPresenceListeners) f(present);
        },
        onError: (err) => {
          metrics.ioErrors.inc({ where: "kubernetes" });
          poolLog.warn({ err: String(err) }, "Kubernetes API error");
        },
        signal,
      });
      // llm-d's pool-scoped resources: followed from start, never holding readiness.
      const llmdLog = log.child({ component: "llm-d-resources" });
      const llmd = {
        namespace: w.namespace,
        poolName: w.poolName,
        log: llmdLog,
        onError: (err: unknown) => {
          metrics.ioErrors.inc({ where: "kubernetes" });
          llmdLog.warn({ err: String(err) }, "Kubernetes API error");
        },
      };
      this.llmdWatches.push(
        kube.objectives({
          ...llmd,
          onPriorities: (priorities) => {
            this.objectives.setWatched(priorities);
            llmdLog.info({ objectives: Object.fromEntries(priorities) }, "InferenceObjective priorities");
          },
        }),
        kube.modelRewrites({ ...llmd, into: this.modelRewrites, onChange: () => llmdLog.info("InferenceModelRewrites changed") }),
      );
    }
    this.intentSource = cfg.intents
      ? startIntentSource({
          where: cfg.intents.discovery,
          hostInstance: cfg.intents.hostInstance,
          kubeConfig: () => this.o.kube().config(),
          log: log.child({ component: "intents" }),
          countError: () => metrics.ioErrors.inc({ where: "intents" }),
          onWorkers: (workers) => {
            this.intents = workers;
            this.reconcileMerged();
          },
        })
      : undefined;
    this.scraper.start();
    return Promise.all([this.pool, this.intentSource?.firstAttempt]).then(() => {});
  }

  /**
   * Sets the desired worker set directly, as the sources do on every change (for callers that drive
   * membership themselves; a source's next change replaces it).
   */
  reconcile(desired: WorkerSpec[]): void {
    this.registry.reconcile(desired);
  }

  /** Pod discovery (or the static list) and the intents, merged; the merge's verdicts logged when they change. */
  private reconcileMerged(): void {
    const merged = mergeWorkerSets(this.listed, this.intents, { mode: this.o.config.workers.mode });
    // Logged when they change, not on every reconcile (pod and intent updates are frequent).
    const log = this.o.log;
    const now = { unroutable: JSON.stringify(merged.unroutable), aliases: JSON.stringify(merged.aliases) };
    if (now.unroutable !== this.lastMerge.unroutable && merged.unroutable.length > 0)
      log.warn({ unroutable: merged.unroutable }, "intent workers not routable (no listener)");
    else if (now.unroutable !== this.lastMerge.unroutable) log.info("every intent worker routable");
    if (now.aliases !== this.lastMerge.aliases) log.info({ aliases: merged.aliases }, "intent workers merged into listed workers");
    this.lastMerge = now;
    this.registry.reconcile(merged.workers);
  }

  private scrapeFailed(workerId: string, err: unknown): void {
    this.o.metrics.scrapeErrors.inc();
    const n = (this.failedScrapes.get(workerId) ?? 0) + 1;
    this.failedScrapes.set(workerId, n);
    if (n === 1) this.o.log.warn({ worker: workerId, err: String(err) }, "worker /metrics scrape failing");
    // Called again on every failed scrape past the threshold: the registry drops the blocks once the publisher is gone too.
    if (n >= DOWN_AFTER_FAILED_SCRAPES && this.o.config.workers.mode === "static") this.registry.markDown(workerId);
  }

  /** The routable worker ranks. */
  candidates(): readonly Candidate[] {
    return this.registry.candidates();
  }

  /** Every rank of the set, routable or not, with why (GET /workers). */
  ranks(): RankStatus[] {
    const routable = new Set(this.candidates().map((c) => c.key));
    return this.registry.specs().flatMap((s) =>
      rankSources(s).map(({ dpRank, kvEvents }, _, all) => {
        const c = serving(s, dpRank, all.length);
        return {
          workerId: s.id,
          dpRank,
          // The API server of this rank: each target port is an endpoint of its own.
          address: c.endpoint,
          kvEvents,
          connected: this.registry.connected(s.id, dpRank),
          routable: routable.has(workerKeyOf(s.id, dpRank)),
          failedScrapes: this.failedScrapes.get(s.id) ?? 0,
          ...(s.role ? { role: s.role } : {}),
        };
      }),
    );
  }

  specs(): WorkerSpec[] {
    return this.registry.specs();
  }

  has(worker: WorkerRef): boolean {
    return this.registry.has(worker);
  }

  connected(workerId: string, dpRank: number): boolean {
    return this.registry.connected(workerId, dpRank);
  }

  replayEndpoint(worker: WorkerRef): string | undefined {
    return this.registry.replayEndpoint(worker);
  }

  listenerCounters(worker: WorkerRef): Readonly<KvListenerCounters> | undefined {
    return this.registry.listenerCounters(worker);
  }

  /**
   * What a rank's engine says of itself, from the last scrape of its API server (undefined: not scraped, or the
   * last scrape failed): its own queue where the server fronts several engines (vLLM labels each engine's
   * series with its index, the DP rank), else the server's; and the server's LoRA adapters, which vLLM
   * exports once per server, not per engine (none when it exports no sample: routing counts that as no fit).
   */
  signalsOf(c: Candidate): WorkerSignals | undefined {
    const m = this.scraper.get(c.endpoint);
    if (m === undefined) return undefined;
    const waiting = m.waitingByEngine.size > 1 ? (m.waitingByEngine.get(c.dpRank) ?? 0) : m.waiting;
    return m.lora ? { waiting, lora: m.lora } : { waiting };
  }

  /** Each routable API server's last scrape, once (undefined: not scraped, or the last scrape failed). */
  endpointLoads(): (WorkerMetrics | undefined)[] {
    const endpoints = new Set(this.candidates().map((c) => c.endpoint));
    return [...endpoints].map((e) => this.scraper.get(e));
  }

  /** The KV blocks the rank's vLLM says it can hold (num_gpu_blocks; SGLang's token pool in blocks), once scraped. */
  gpuBlocks(worker: WorkerRef): number | undefined {
    return this.scraper.gpuBlocks(worker.workerId, worker.dpRank);
  }

  /** The KV blocks the set's ranks can hold together: their scraped num_gpu_blocks (0 for a rank not scraped yet). */
  kvCapacity(): number {
    let blocks = 0;
    for (const s of this.registry.specs()) for (const { dpRank } of rankSources(s)) blocks += this.gpuBlocks({ workerId: s.id, dpRank }) ?? 0;
    return blocks;
  }

  /** Every routable rank's API server has more scraped waiting requests than `threshold` (0: never). */
  queuesFull(threshold: number): boolean {
    const cs = this.candidates();
    return threshold > 0 && cs.length > 0 && cs.every((c) => (this.signalsOf(c)?.waiting ?? 0) > threshold);
  }

  /** See WorkerRegistry.waitConnected. */
  waitConnected(timeoutMs: number): Promise<WorkerRef[]> {
    return this.registry.waitConnected(timeoutMs);
  }

  /** The listeners stop buffering and deliver to `sink` (after recovery). */
  attach(sink: Sink): void {
    this.registry.attach(sink);
  }

  /** The listener gauges, read at scrape time. */
  updateGauges(): void {
    const m = this.o.metrics;
    const c = this.registry.counters();
    m.listenerGaps.set(c.gaps);
    m.listenerReplays.set(c.replays);
    m.listenerRestarts.set(c.restarts);
    m.listenerHeartbeatTimeouts.set(c.heartbeatTimeouts);
    m.listenersConnected.set(this.registry.connectedListeners());
    m.listenerProtocolErrors.set(c.protocolErrors);
    m.listenerOversize.set(c.oversize);
  }

  async stop(): Promise<void> {
    this.scraper.stop();
    await this.pool.then((src) => src.stop()).catch(() => {});
    await Promise.all(this.llmdWatches.map((w) => w.stop()));
    await this.intentSource?.stop().catch(() => {});
    await this.registry.close();
  }
}
