// The EPP process, wired top to bottom, each piece built from those above it (no closure reaches a
// later one): config -> logger -> metrics -> the worker set (built, not started) -> indexes -> the
// stream handoff -> routing (load, replica-agg, latency model, picker) -> the decision warm-up (invented picks through
// a scratch copy of the path, src/warm-decisions.ts) -> servers (health NOT_SERVING,
// /dump 503) -> the readiness sequence (the worker set started, its KV listeners subscribed first and
// buffering, recovery, the handoff onto the live streams, ready; src/readiness.ts).
// SIGTERM: NOT_SERVING first, in-flight streams finish, then exit.
import type { KubeConfig } from "@kubernetes/client-node";
import type { RecoveryOutcome } from "@kv-epp/recovery";
import { listenerHeartbeat } from "@kv-epp/kv-events";
import { parseEndpoint } from "@kv-epp/protocol";
import { createPreprocessor, DEFAULT_CACHE_MAX_BYTES, eventLoopLag, ignoredRenderingFlags, loadChatTemplate, loadSglangChatTemplate, poolMetrics, poolSizing, servedConversationTemplate, servedVllmRenderer, setThreadPriority, TokenizerPool, warmUp, type PreprocessorOptions } from "@kv-epp/tokenizer";
import pino, { type Logger } from "pino";
import { ConfigError, parseConfig, preprocessorOptions, usage, usesKubernetes, type EppConfig } from "./config.ts";
import { BodyBudget } from "./extproc/body-budget.ts";
import { HealthState } from "./health.ts";
import { StreamHandoff } from "./handoff/handoff.ts";
import { indexerKey, Indexers } from "./indexers/indexers.ts";
import type { KubeSources } from "./kube-sources.ts";
import { extProcBufferBudget } from "./memory-budget.ts";
import { poolSizeOf } from "./pool-size.ts";
import { createMetrics, routingMetrics, type Metrics } from "./metrics.ts";
import { poolFigures } from "./llmd-metrics.ts";
import { ActiveLoad, sumLoad, combinedPending, EvictionRegret, latencyModel, pendingPrefixes, Picker, RoutingQuality, type Clock, type RoutingContext } from "@kv-epp/routing";
import { recoverThenReady } from "./readiness.ts";
import { startReplicaAgg, type ReplicaAgg } from "./replica-agg/service.ts";
import { throttledWarn } from "./log-throttle.ts";
import { selectionApp } from "./selection-http.ts";
import { loadCertificate, metricsFetch, startExtProc, startHealth, startHttp } from "./servers.ts";
import {
  createPoolTokenizeBody, createPoolWarm, createTokenizeBody, type OnRead, type TokenizeBody,
} from "./tokens.ts";
import { WorkerSet } from "./workers/worker-set.ts";
import { EPP_RUNTIME_ENV } from "./runtime-env.ts";
import { warmDecisions, type WarmDecisionsOptions } from "./warm-decisions.ts";

export type EppHandle = {
  ports: { grpc: number; grpcHealth: number; metrics: number; selection: number; replicaAgg?: number };
  health: HealthState;
  /** Settles when recovery has ended and the replica is ready. */
  ready: Promise<RecoveryOutcome>;
  indexers: Indexers;
  workers: WorkerSet;
  picker: Picker;
  load: ActiveLoad;
  replicaAgg?: ReplicaAgg;
  stop(opts?: { graceMs?: number }): Promise<void>;
};

export async function startEpp(cfg: EppConfig, o: { log?: Logger; kubeConfig?: KubeConfig } = {}): Promise<EppHandle> {
  const log = o.log ?? pino({ level: cfg.logLevel, base: { component: "epp" } });
  const metrics = createMetrics();
  const certificate = await loadCertificate(cfg.tls);
  const kube = await kubernetesSources(cfg, o.kubeConfig);

  // The worker set, built and not started (readiness starts it): the facts the index and the handoff
  // read of the ranks (their capacity, their replay endpoints, which ranks there are).
  const workers = new WorkerSet({ config: cfg, kube, metrics, log: log.child({ component: "workers" }) });

  // The indexes. A rank holds at most what its vLLM says it can (num_gpu_blocks, scraped), else the
  // configured bound. What the caches lose to eviction, from the same events: it moves the latency
  // cost's follower weight.
  const regret = new EvictionRegret();
  const indexers = new Indexers(metrics, log.child({ component: "indexer" }), {
    rankCapacity: (w) => workers.gpuBlocks(w) ?? (cfg.maxBlocksPerRank > 0 ? cfg.maxBlocksPerRank : undefined),
    regret,
  });
  if (!cfg.indexReserve) indexers.models.disableReserve();
  const indexer = indexers.models.register(cfg.model.name, cfg.model.tenant, cfg.model.blockSize);
  for (const a of cfg.model.loraAdapters) indexers.models.registerAdapter(a, cfg.model.name);
  indexers.models.readAdaptersAs(cfg.chatRendering);
  // An SGLang rank's capacity is its token pool in the index's blocks: the workers' size once their events set it.
  workers.countPoolsIn(() => indexer.blockSize);
  workers.whenRemoved((w) => indexers.removeWorker(w));
  // The ranks' caches together bound what the index holds: its tables are sized for that up front.
  workers.whenKvCapacity((blocks) => indexers.models.reserve(blocks));
  const { bodyReader, tokenizerPool, warmReply, warmUpReader } = await tokenizationOf(cfg, metrics, log);
  log.info({
    model: cfg.model.name, blockSize: cfg.model.blockSize, tokenizer: cfg.tokenizerDir === undefined ? "byte-fallback" : "hf", tokenizerThreads: tokenizerPool?.size ?? 0,
    // The runtime environment it started with (runtime-env.ts): unset is Bun's default.
    runtimeEnv: Object.fromEntries(Object.keys(EPP_RUNTIME_ENV).map((k) => [k, process.env[k] ?? "unset"])),
  }, "indexer ready");
  // Every rank's stream position (the cursors /dump carries) and the handoff from a recovered dump to the
  // live stream: the listeners' sink, the dump's source and the recovery's target all go through it.
  const liveKey = indexerKey(cfg.model.name, cfg.model.tenant);
  const live = () => indexers.models.get(liveKey)?.index;
  const handoff = new StreamHandoff({
    liveKey,
    index: {
      models: (opts) => indexers.recovery.models(opts),
      workers: () => live()?.workers() ?? [],
      rank: (w) => ({ apply: (signal) => indexers.live.apply(liveKey, w, signal), clear: () => live()?.clearWorker(w), blocks: () => live()?.treeSize(w) ?? 0 }),
    },
    replayEndpoint: (w) => workers.replayEndpoint(w),
    known: (w) => workers.has(w),
    socket: { heartbeat: cfg.kvHeartbeatMs > 0 ? listenerHeartbeat(cfg.kvHeartbeatMs) : undefined, maxMessageSize: cfg.kvMaxMessageBytes },
    registry: metrics.registry,
    log: log.child({ component: "handoff" }),
  });
  indexers.whenViewLost((key, w) => handoff.viewLost(key, w));
  workers.whenRemoved((w) => handoff.forget(w));

  // This replica's in-flight load; its peers' (replica-agg) is added to it in the cost function.
  // The blocks of this replica's requests in flight count as overlap where they were routed (routing pending.ts).
  const newPending = () => pendingPrefixes(cfg.picker);
  const pending = newPending();
  // Peers' prefixes (over replica-agg) under bounds of their own, so no peer can evict this replica's.
  const peerPending = cfg.replicaAgg.mode === "on" ? newPending() : undefined;
  const load = new ActiveLoad(pending);
  const replicaAgg = cfg.replicaAgg.mode === "on"
    ? await startReplicaAgg({ config: cfg.replicaAgg, listen: cfg.listen, port: cfg.ports.replicaAgg, podIp: cfg.podIp, load, pending: peerPending, metrics, log: log.child({ component: "replica-agg" }), kube })
    : undefined;
  // Observed TTFTs calibrate the latency model, which the latency cost and explanations read.
  const latency = latencyModel(cfg.picker, regret);
  const figures = routingMetrics(metrics);
  const quality = new RoutingQuality(figures);
  workers.whenRemoved((w) => quality.forget(w));
  const picker = new Picker({
    indexers: indexers.models,
    candidates: () => workers.candidates(),
    load: replicaAgg ? sumLoad(load, replicaAgg.peers) : load,
    signals: (c) => workers.signalsOf(c),
    options: cfg.picker,
    latency,
    pending: combinedPending([pending, peerPending]),
    replicas: replicaAgg ? () => replicaAgg.replicas() : undefined,
  });
  const routing: RoutingContext = { picker, load, latency, quality, metrics: figures, clock: WALL_CLOCK, candidates: () => workers.candidates() };

  // Servers come up before discovery and recovery so liveness answers during them, and cold peers see
  // this replica's /dump as 503.
  const health = new HealthState();
  const buffer = extProcBufferBudget(cfg.extProcBufferMaxBytes);
  const bodyBudget = new BodyBudget(buffer.bytes);
  log.info({ maxBytes: buffer.bytes, from: buffer.source }, "ext_proc body budget");
  let recoveryOutcome: RecoveryOutcome | null = null;
  // Before the servers: nothing serves yet, and no scrape sees the tokenizer's counters the warm-up then zeroes.
  // A warm-up that fails only costs the first picks their speed.
  if (cfg.warmUpPicks > 0) {
    try {
      const warm = await warmDecisions({ cfg, certificate, picks: cfg.warmUpPicks, ...warmUpReader });
      log.info({ picks: warm.picks, ms: Math.round(warm.ms), firstPickMs: round1(warm.firstPickMs), lastPicksMs: round1(warm.lastPicksMs) }, "decision path warmed up");
    } catch (err) {
      log.warn({ err: String(err) }, "decision path warm-up failed; serving cold");
    }
  }
  // The decision thread's short slice only now (as the members' once warm): the warm-up is seconds of CPU.
  if (cfg.threadSliceUs > 0) {
    const own = setThreadPriority(0, cfg.threadSliceUs);
    if ("unsupported" in own || own.sliceUnsupported) log.info({ sliceUs: cfg.threadSliceUs, why: "unsupported" in own ? own.unsupported : own.sliceUnsupported }, "the kernel's default time slice is kept");
    else log.info({ tid: own.tid, sliceUs: own.sliceUs }, "decision thread's time slice");
  }
  // From here the event loop's lag is the replica's (the warm-up's busiest, least compiled seconds are not).
  const stopLagSampler = eventLoopLag(metrics.registry);
  const extProc = await startExtProc(cfg, {
    handler: {
      routing, tokenizeBody: bodyReader("ext_proc"), warmReply, metrics, routeOnSettledPrefix: cfg.routeOnSettledPrefix, slowPickMs: cfg.slowPickMs,
      sglangBodies: cfg.chatRendering === "sglang",
      log: log.child({ component: "ext_proc" }),
      bodyMode: cfg.bodyMode,
      responseBodyMode: cfg.responseBodyMode,
      maxInflight: cfg.maxInflight,
      bodyBudget,
      fallbacks: cfg.fallbackEndpoints,
      emitEndpointScores: cfg.emitEndpointScores,
      // In Kubernetes mode the pool's InferenceObjectives, over --objective-priorities.
      priorities: () => workers.objectives.current(),
      // In Kubernetes mode the pool's InferenceModelRewrites, applied where each body is read.
      rewriteRules: () => workers.modelRewrites.rules(),
      rewriteModelNames: () => workers.modelRewrites.modelNames(),
      servedModels: [cfg.model.name, ...cfg.model.loraAdapters],
      // Saturated by queues: every worker rank waits past --queue-threshold (from the scraped /metrics).
      queuesFull: () => workers.queuesFull(cfg.picker.queueThreshold),
      explainAll: cfg.explain,
      conformanceHooks: cfg.conformanceTestHooks,
    },
    certificate, health, metrics, log,
  });
  const grpcHealth = await startHealth(cfg, health);
  const selection = startHttp(cfg, cfg.ports.selection, selectionApp({
    picker, indexers, workers, tokenizerPool, handoff, metrics, quality, latency,
    tokenizeBody: { select: bodyReader("select"), score: bodyReader("score") },
    rewriteRules: () => workers.modelRewrites.rules(),
    sglangBodies: cfg.chatRendering === "sglang",
    dumpSource: handoff.source(),
    recoveryOutcome: () => recoveryOutcome,
    load: { own: load, peers: replicaAgg?.peers },
    recovered: () => recoveryOutcome !== null,
    peerToken: cfg.peerToken,
    log: log.child({ component: "selection-http" }),
  }).fetch, { idleTimeout: 0 }); // a large /dump may stream for longer than Bun's default idle timeout
  // llm-d's pool gauges are named by the InferencePool; a static pool has no name.
  const poolName = cfg.workers.mode === "kubernetes" ? cfg.workers.poolName : "";
  const metricsServer = startHttp(cfg, cfg.ports.metrics, metricsFetch(metrics, () => {
    indexers.models.updateGauges();
    workers.updateGauges();
    poolFigures(metrics.llmd, poolName, workers.endpointLoads(), cfg.scrapeIntervalMs > 0);
    metrics.ready.set(health.ready ? 1 : 0);
    metrics.extProcBufferedBytes.set(bodyBudget.usedBytes);
    replicaAgg?.updateGauges();
    if (pending) {
      metrics.inflightPrefixBlocks.set(pending.blocks);
      metrics.inflightPrefixDropped.set({ reason: "expired" }, pending.drops.expired);
      metrics.inflightPrefixDropped.set({ reason: "evicted" }, pending.drops.evicted);
    }
    if (peerPending) metrics.inflightPrefixPeerBlocks.set(peerPending.blocks);
  }));
  log.info(
    { grpc: extProc.port, grpcHealth: grpcHealth.port, selection: selection.port, metrics: metricsServer.port, replicaAgg: replicaAgg?.endpoint, listen: cfg.listen },
    "servers listening",
  );

  // The worker set's listeners subscribe (buffering) before recovery fetches a dump.
  const starting = new AbortController();
  const ready = recoverThenReady({
    cfg, workers, indexers, handoff, health, metrics, kube, log,
    listed: workers.start(starting.signal),
    onRecovered: (outcome) => (recoveryOutcome = outcome),
    signal: starting.signal,
  });

  let stopping: Promise<void> | undefined;
  const stop = (opts: { graceMs?: number } = {}) =>
    (stopping ??= (async () => {
      health.drain();
      starting.abort(new Error("shutting down"));
      // Gateways and endpoint controllers need a moment to see NOT_SERVING; keep routing until then.
      if (cfg.shutdownDelayMs > 0) {
        log.info({ ms: cfg.shutdownDelayMs }, "NOT_SERVING, still routing during the shutdown delay");
        await Bun.sleep(cfg.shutdownDelayMs);
      }
      log.info("draining: waiting for in-flight streams");
      await extProc.shutdown(opts.graceMs ?? 30_000);
      for (const s of [extProc, grpcHealth, selection, metricsServer]) await s.stop();
      stopLagSampler();
      await tokenizerPool?.close();
      await workers.stop();
      await replicaAgg?.stop();
      log.info("stopped");
    })());

  const ports = { grpc: extProc.port, grpcHealth: grpcHealth.port, metrics: metricsServer.port, selection: selection.port, replicaAgg: replicaAgg ? parseEndpoint(replicaAgg.endpoint).port : undefined };
  return { ports, health, ready, indexers, workers, picker, load, replicaAgg, stop };
}

/**
 * The Kubernetes-backed sources (kube-sources.ts), imported only when a source of `cfg` reads the API server:
 * static mode starts without loading @kubernetes/client-node.
 */
async function kubernetesSources(cfg: EppConfig, given?: KubeConfig): Promise<() => KubeSources> {
  if (!usesKubernetes(cfg)) return () => {
    throw new Error("no Kubernetes source is configured");
  };
  const { kubeSources } = await import("./kube-sources.ts");
  const sources = kubeSources(given);
  return () => sources;
}

/** Wall time, and timers that do not hold the process open. */
const WALL_CLOCK: Clock = {
  now: () => performance.now(),
  after: (ms, fn) => {
    const t = setTimeout(fn, ms).unref();
    return () => clearTimeout(t);
  },
};

const round1 = (ms: number) => Math.round(ms * 10) / 10;

/** Where a body came: an ext_proc stream, or a dry run on the selection port. */
type BodyRoute = "ext_proc" | "select" | "score";

/**
 * With a tokenizer, reading request bodies, rendering and tokenization run in a pool of worker threads (sized
 * to defaultPoolSize: a CPU quota less the decision thread's CPU, else the CPUs, unless --tokenizer-threads says otherwise): the event loop that answers ext_proc streams
 * and the selection routes only receives bodies and picks. Without one (byte fallback, cheap) or with
 * --tokenizer-threads 0, on the event loop, through the same functions. The pool's metrics exist either way.
 * `bodyReader(route)`: the one body reader, its reads counted by route and thread.
 */
async function tokenizationOf(cfg: EppConfig, metrics: Metrics, log: Logger): Promise<{
  bodyReader: (route: BodyRoute) => TokenizeBody; tokenizerPool?: TokenizerPool; warmReply?: ReturnType<typeof createPoolWarm>;
  /** The decision warm-up's reader, counted nowhere, and how to forget what it cached. */
  warmUpReader: Pick<WarmDecisionsOptions, "tokenizeBody" | "forget">;
}> {
  const observe = poolMetrics(metrics.registry, cfg.model.name);
  const warnUnread = throttledWarn(log, "a body too large to read on the event loop (readHereMaxBytes) that no tokenizer pool member was live to read: routed by load on its model");
  const onRead = (where: BodyRoute): OnRead => (thread, unread) => {
    metrics.bodiesRead.inc({ where, thread });
    if (thread === "unread") warnUnread(unread ?? "unknown", { where });
  };
  const why = { no_template: "without --tokenizer-dir (the byte-level fallback has no chat template)", vllm_only: "with --chat-rendering sglang (a vLLM flag)" };
  for (const { flag, cause } of ignoredRenderingFlags(preprocessorOptions(cfg))) log.warn(`${flag} has no effect ${why[cause]}`);
  if (cfg.tokenizerDir === undefined && cfg.tokenizerCacheBytes !== DEFAULT_CACHE_MAX_BYTES) log.warn("--tokenizer-cache-bytes has no effect without --tokenizer-dir (the byte-level fallback caches nothing)");
  const conversation = servedConversationTemplate(preprocessorOptions(cfg));
  if (conversation !== null)
    log.warn({ template: conversation.name, why: conversation.why }, "the SGLang workers render this model's chats with one of SGLang's conversation templates, not mirrored here: every chat is routed by load (unrendered, cause template_engine)");
  let renderer: ReturnType<typeof servedVllmRenderer>;
  try {
    renderer = servedVllmRenderer(preprocessorOptions(cfg));
  } catch (err) {
    throw badTokenizerDir(cfg, err);
  }
  if (renderer !== null)
    log.warn({ how: renderer }, "the vLLM workers render this model's chats without a Jinja template, not mirrored here: every chat is routed by load (unrendered, cause template_engine)");
  // A --chat-template that names no file and is no template either (vLLM's), or an unreadable .jinja file (SGLang's),
  // is refused here, named as such.
  if (cfg.chatTemplate !== undefined && cfg.tokenizerDir !== undefined && conversation === null) {
    try {
      if (cfg.chatRendering === "sglang") loadSglangChatTemplate(cfg.chatTemplate);
      else loadChatTemplate(cfg.chatTemplate);
    } catch (err) {
      throw new ConfigError(`invalid value for --chat-template: ${(err as Error).message}`);
    }
  }
  if (cfg.tokenizerDir === undefined || cfg.tokenizerThreads === 0) {
    const pre = preprocessorOf(cfg, metrics, log);
    if (cfg.tokenizerDir !== undefined) {
      const warm = warmUp(pre);
      log.info({ tokens: warm.tokens, ms: Math.round(warm.ms) }, "tokenizer warmed up");
    }
    return { bodyReader: (where) => createTokenizeBody(pre, onRead(where)), warmUpReader: { tokenizeBody: createTokenizeBody(pre), forget: () => pre.resetCache() } };
  }
  const { warning, ...sized } = poolSizeOf(cfg.tokenizerThreads, poolSizing());
  if (warning) log.warn(sized, warning);
  const pool = new TokenizerPool({
    preprocessor: preprocessorOptions(cfg),
    size: sized.size,
    nice: cfg.tokenizerNice,
    sliceUs: cfg.threadSliceUs,
    budgetMs: cfg.tokenizeBudgetMs,
    observe,
    log: log.child({ component: "tokenizer-pool" }),
  });
  observe.attach(pool);
  try {
    await pool.ready();
    const { members } = pool.stats();
    const warmed = members.map((m) => m.warmUp);
    const unlowered = members.map((m) => m.priority).find((p) => p !== null && "unsupported" in p);
    if (unlowered && cfg.tokenizerNice > 0) log.warn({ nice: cfg.tokenizerNice, why: unlowered.unsupported }, "tokenizer threads run at the decision thread's priority");
    log.info({ members: warmed.length, sizedBy: sized.sizedBy, quota: sized.quota, cpus: sized.cpus, nice: cfg.tokenizerNice, tokens: warmed.reduce((n, w) => n + (w?.tokens ?? 0), 0), ms: Math.round(Math.max(...warmed.map((w) => w?.ms ?? 0))) }, "tokenizer pool warmed up");
  } catch (err) {
    await pool.close();
    throw badTokenizerDir(cfg, err);
  }
  return {
    // Without a cache a warm would tokenize for nothing (and ext_proc would keep each chat's body for it).
    bodyReader: (where) => createPoolTokenizeBody(pool, onRead(where)), tokenizerPool: pool, warmReply: pool.caches ? createPoolWarm(pool) : undefined,
    warmUpReader: { tokenizeBody: createPoolTokenizeBody(pool), forget: () => pool.forgetWork() },
  };
}

/** A tokenizer directory that could not be read, refused as the flag's value (exit 2, the flag named). */
function badTokenizerDir(cfg: EppConfig, err: unknown): ConfigError {
  return new ConfigError(`invalid value for --tokenizer-dir: ${JSON.stringify(cfg.tokenizerDir)}: ${(err as Error).message}`);
}

function preprocessorOf(cfg: EppConfig, metrics: Metrics, log: PreprocessorOptions["log"]): ReturnType<typeof createPreprocessor> {
  try {
    return createPreprocessor({ ...preprocessorOptions(cfg), registry: metrics.registry, log });
  } catch (err) {
    throw badTokenizerDir(cfg, err);
  }
}

if (import.meta.main) {
  if (Bun.argv.includes("--help") || Bun.argv.includes("-h")) {
    console.log(usage());
    process.exit(0);
  }
  let cfg: EppConfig;
  try {
    cfg = parseConfig(Bun.argv.slice(2), process.env);
  } catch (err) {
    if (err instanceof ConfigError) {
      console.error(`epp: ${err.message}\n(bun run epp --help lists the options)`);
      process.exit(2);
    }
    throw err;
  }
  const log = pino({ level: cfg.logLevel, base: { component: "epp" } });
  let epp: EppHandle;
  try {
    epp = await startEpp(cfg, { log });
  } catch (err) {
    // A start that cannot complete (bad tokenizer dir, port in use, unreadable TLS files) ends here.
    console.error(`epp: failed to start: ${(err as Error).message}`);
    process.exit(err instanceof ConfigError ? 2 : 1);
  }
  const onSignal = (sig: string) => {
    log.info({ signal: sig }, "shutdown requested");
    void epp.stop().then(() => process.exit(0));
  };
  process.on("SIGTERM", () => onSignal("SIGTERM"));
  process.on("SIGINT", () => onSignal("SIGINT"));
}
