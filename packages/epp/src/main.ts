// The EPP process, wired top to bottom: config -> logger -> metrics -> indexes -> servers (health
// NOT_SERVING, /dump 503) -> workers and their KV listeners (subscribed first, buffering) -> recovery
// -> listeners attached (buffered events on top of the dump) -> ready.
// SIGTERM: NOT_SERVING first, in-flight streams finish, then exit.
import * as grpc from "@grpc/grpc-js";
import type { KubeConfig } from "@kubernetes/client-node";
import {
  endpointSliceDiscovery,
  recoveryAttemptMetrics,
  recoveryStateMetric,
  runRecovery,
  staticPeerDiscovery,
  type PeerDiscovery,
  type RecoveryOutcome,
} from "@kv-epp/recovery";
import { mergeWorkerSets, type IntentWorker } from "@kv-epp/intents";
import { listenerHeartbeat } from "@kv-epp/kv-events";
import { hostPort, parseEndpoint } from "@kv-epp/protocol";
import { createPreprocessor } from "@kv-epp/tokenizer";
import pino, { type Logger } from "pino";
import { ConfigError, parseConfig, usage, type EppConfig } from "./config.ts";
import { responseEncoder, type ProcessingRequest, type ProcessingResponse } from "./extproc/messages.ts";
import { createProcessHandler } from "./extproc/server.ts";
import { createBidiServer } from "./extproc/grpc-h2.ts";
import { EXT_PROC_WINDOW_BYTES } from "./extproc/http2-windows.ts";
import { loadProtos } from "./extproc/protos.ts";
import { readCertificate, selfSignedCertificate, watchCertificate, type Certificate } from "./extproc/tls.ts";
import { HealthState, healthCheckBytes, healthHandlers } from "./health.ts";
import { StreamHandoff } from "./handoff/handoff.ts";
import { Indexers } from "./indexers/indexers.ts";
import { startIntentSource } from "./intents-source.ts";
import { dumpBodyLimit, recoveryBudget } from "./memory-budget.ts";
import { throttledWarn } from "./log-throttle.ts";
import { createMetrics } from "./metrics.ts";
import { ActiveLoad, sumLoad } from "./picker/load.ts";
import { LatencyModel } from "./picker/latency.ts";
import { Picker } from "./picker/picker.ts";
import { RoutingQuality } from "./picker/quality.ts";
import { scrapeTargets, WorkerMetricsScraper } from "./picker/worker-metrics.ts";
import { startReplicaAgg, type ReplicaAgg } from "./replica-agg/service.ts";
import { selectionApp } from "./selection-http.ts";
import { createTokenize } from "./tokens.ts";
import { loadKubeConfig, startPoolWorkers } from "./workers/kubernetes.ts";
import { WorkerRegistry, type WorkerSpec } from "./workers/registry.ts";
import { staticWorkers } from "./workers/static.ts";

export type EppHandle = {
  ports: { grpc: number; grpcHealth: number; metrics: number; selection: number; replicaAgg?: number };
  health: HealthState;
  /** Settles when recovery has ended and the replica is ready. */
  ready: Promise<RecoveryOutcome>;
  indexers: Indexers;
  workers: WorkerRegistry;
  picker: Picker;
  load: ActiveLoad;
  replicaAgg?: ReplicaAgg;
  stop(opts?: { graceMs?: number }): Promise<void>;
};

export async function startEpp(cfg: EppConfig, o: { log?: Logger; kubeConfig?: KubeConfig } = {}): Promise<EppHandle> {
  const log = o.log ?? pino({ level: cfg.logLevel, base: { component: "epp" } });
  const metrics = createMetrics();
  const recoveryMetric = recoveryStateMetric(metrics.registry);
  const attemptMetrics = recoveryAttemptMetrics(metrics.registry);
  // First, so a bad pair stops the start before anything listens.
  let certificate: Certificate | undefined;
  try {
    certificate = cfg.tls.mode === "files" ? readCertificate(cfg.tls) : cfg.tls.mode === "self-signed" ? await selfSignedCertificate() : undefined;
  } catch (err) {
    throw new ConfigError(`cannot load --tls-cert-file/--tls-key-file: ${(err as Error).message}`);
  }

  // A rank holds at most what its vLLM says it can (num_gpu_blocks, scraped), else the configured bound.
  const indexers = new Indexers(metrics, log.child({ component: "indexer" }), {
    rankCapacity: (w) => scraper.gpuBlocks(w.workerId, w.dpRank) ?? (cfg.maxBlocksPerRank > 0 ? cfg.maxBlocksPerRank : undefined),
    onViewLost: (key, w) => handoff.viewLost(key, w),
  });
  indexers.models.register(cfg.model.name, cfg.model.tenant, cfg.model.blockSize);
  for (const a of cfg.model.loraAdapters) indexers.models.registerAdapter(a, cfg.model.name);
  let preprocessor: ReturnType<typeof createPreprocessor>;
  try {
    preprocessor = createPreprocessor({ tokenizerDir: cfg.tokenizerDir, registry: metrics.registry, model: cfg.model.name });
  } catch (err) {
    throw new ConfigError(`invalid value for --tokenizer-dir: ${JSON.stringify(cfg.tokenizerDir)}: ${(err as Error).message}`);
  }
  const tokenize = createTokenize(preprocessor);
  log.info({ model: cfg.model.name, blockSize: cfg.model.blockSize, tokenizer: preprocessor.kind }, "indexer ready");

  let kubeConfig = o.kubeConfig;
  const kube = () => (kubeConfig ??= loadKubeConfig());

  // Worker bookkeeping. Listeners start with their worker and buffer until recovery has ended.
  const load = new ActiveLoad();
  // Peers' in-flight load (replica-agg) is added to this replica's own in the cost function.
  const replicaAgg =
    cfg.replicaAgg.mode === "on"
      ? await startReplicaAgg({
          config: cfg.replicaAgg,
          listen: cfg.listen,
          port: cfg.ports.replicaAgg,
          podIp: cfg.podIp,
          load,
          metrics,
          log: log.child({ component: "replica-agg" }),
          kube,
        })
      : undefined;
  // Consecutive failed scrapes per worker; from DOWN_AFTER of them on the worker is down (static mode's
  // only way to learn that a worker went away; in Kubernetes mode pod readiness says it, and a slow
  // /metrics alone must not take a worker out of routing).
  const DOWN_AFTER = 3;
  const failedScrapes = new Map<string, number>();
  const scraper = new WorkerMetricsScraper({
    intervalMs: cfg.scrapeIntervalMs,
    onError: (workerId, err) => {
      metrics.scrapeErrors.inc();
      const n = (failedScrapes.get(workerId) ?? 0) + 1;
      failedScrapes.set(workerId, n);
      if (n === 1) log.warn({ worker: workerId, err: String(err) }, "worker /metrics scrape failing");
      if (n >= DOWN_AFTER && cfg.workers.mode === "static") workers.markDown(workerId);
    },
    onSuccess: (workerId) => {
      if (failedScrapes.delete(workerId)) workers.markUp(workerId);
    },
  });
  const workers = new WorkerRegistry({
    topic: cfg.kvTopic,
    heartbeat: cfg.kvHeartbeatMs > 0 ? listenerHeartbeat(cfg.kvHeartbeatMs) : undefined,
    log: log.child({ component: "workers" }),
    onRemoved: (w) => {
      indexers.removeWorker(w);
      handoff.forget(w);
    },
    onMalformed: (kind) => metrics.kvMalformed.inc({ kind }),
    onChanged: (specs) => {
      scraper.setTargets(specs.flatMap(scrapeTargets));
      metrics.workers.set(specs.reduce((n, s) => n + s.dpSize, 0));
    },
  });
  // Every rank's stream position (the cursors /dump carries) and the handoff from a recovered dump to the
  // live stream: the listeners' sink, the dump's source and the recovery's target all go through it.
  const liveKey = indexerKeyOf(cfg);
  const handoff = new StreamHandoff({
    liveKey,
    index: {
      models: (opts) => indexers.recovery.models(opts),
      workers: () => indexers.models.get(liveKey)?.index.workers() ?? [],
      rank: (w) => ({
        apply: (signal) => indexers.live.apply(liveKey, w, signal),
        clear: () => indexers.models.get(liveKey)?.index.clearWorker(w),
        blocks: () => indexers.models.get(liveKey)?.index.treeSize(w) ?? 0,
      }),
    },
    replayEndpoint: (w) => workers.replayEndpoint(w),
    known: (w) => workers.has(w),
    socket: cfg.kvHeartbeatMs > 0 ? { heartbeat: listenerHeartbeat(cfg.kvHeartbeatMs) } : undefined,
    registry: metrics.registry,
    log: log.child({ component: "handoff" }),
  });
  let recoveryOutcome: RecoveryOutcome | null = null;
  // Servers come up first so liveness answers during discovery and recovery, and cold peers see
  // this replica's /dump as 503.
  const health = new HealthState();
  let recovered = false;
  // Observed TTFTs calibrate the latency model, which the latency cost and explanations read.
  const latency = new LatencyModel();
  const quality = new RoutingQuality(metrics, latency);
  const picker = new Picker({
    indexers: indexers.models,
    candidates: () => workers.candidates(),
    load: replicaAgg ? sumLoad(load, replicaAgg.peers) : load,
    workerMetrics: (endpoint) => scraper.get(endpoint),
    options: cfg.picker,
    latency,
  });
  const protos = loadProtos();
  const extProcMethod = protos.extProc.service.Process!;
  const healthCheck = protos.health.service.Check!;
  const warnRejected = throttledWarn(log.child({ component: "ext_proc" }), "ext_proc stream rejected");
  const extProc = createBidiServer(
    {
      path: extProcMethod.path,
      deserialize: extProcMethod.requestDeserialize as (b: Buffer) => ProcessingRequest,
      serialize: responseEncoder(extProcMethod.responseSerialize as (m: ProcessingResponse) => Buffer),
    },
    createProcessHandler({
      picker,
      load,
      tokenize,
      metrics,
      log: log.child({ component: "ext_proc" }),
      bodyMode: cfg.bodyMode,
      maxInflight: cfg.maxInflight,
      fallbacks: cfg.fallbackEndpoints,
      priorities: cfg.objectivePriorities,
      candidates: () => workers.candidates(),
      // Saturated by queues: every worker rank waits past --queue-threshold (from the scraped /metrics).
      queuesFull: () => {
        const t = cfg.picker.queueThreshold;
        const cs = workers.candidates();
        return t > 0 && cs.length > 0 && cs.every((c) => (scraper.get(c.endpoint)?.waiting ?? 0) > t);
      },
      quality,
      explainAll: cfg.explain,
    }),
    {
      // BUFFERED mode sends the whole body as one message: allow bodies up to the 32 MiB request cap.
      maxMessageBytes: 40 * 1024 * 1024,
      windowBytes: EXT_PROC_WINDOW_BYTES,
      unary: cfg.healthOnExtProc
        ? {
            [healthCheck.path]: healthCheckBytes(health, {
              decode: healthCheck.requestDeserialize as (b: Buffer) => { service?: string },
              encode: healthCheck.responseSerialize as (r: { status: string }) => Buffer,
            }),
          }
        : undefined,
      tls: certificate,
      onError: (where, err) => log.child({ component: "ext_proc" }).debug({ where, err: String(err) }, "ext_proc transport error"),
      onRejected: (reason, err) => {
        metrics.extProcRejected.inc({ reason });
        warnRejected(reason, { err: err === undefined ? undefined : String(err) });
      },
    },
  );
  const grpcPort = await extProc.listen(cfg.listen, cfg.ports.grpc);
  const tlsLog = log.child({ component: "tls" });
  const certWatch =
    cfg.tls.mode === "files"
      ? watchCertificate(cfg.tls, certificate!, {
          change: (c) => {
            extProc.setCertificate(c);
            metrics.tlsReloads.inc({ result: "ok" });
            tlsLog.info({ cert: cfg.tls.mode === "files" && cfg.tls.certFile }, "TLS certificate reloaded");
          },
          error: (err) => {
            metrics.tlsReloads.inc({ result: "error" });
            tlsLog.warn({ err: String(err) }, "TLS certificate reload failed; serving the previous one");
          },
        })
      : undefined;
  tlsLog.info({ mode: cfg.tls.mode }, cfg.tls.mode === "off" ? "ext_proc serves h2c (plaintext)" : "ext_proc serves TLS (ALPN h2)");
  const healthServer = new grpc.Server();
  healthServer.addService(protos.health.service, healthHandlers(health));
  // Kubelet gRPC probes do not speak TLS, so health stays plaintext.
  const grpcHealthPort = await bind(healthServer, cfg.listen, cfg.ports.grpcHealth, grpc.ServerCredentials.createInsecure());

  const selection = Bun.serve({
    hostname: cfg.listen,
    port: cfg.ports.selection,
    idleTimeout: 0, // a large /dump may stream for longer than Bun's default idle timeout
    fetch: selectionApp({
      picker,
      indexers,
      workers,
      tokenize,
      dumpSource: handoff.source(),
      handoff,
      recoveryOutcome: () => recoveryOutcome,
      metrics,
      load: { own: load, peers: replicaAgg?.peers },
      quality,
      latency,
      recovered: () => recovered,
      peerToken: cfg.peerToken,
      log: log.child({ component: "selection-http" }),
    }).fetch,
  });
  const metricsServer = Bun.serve({
    hostname: cfg.listen,
    port: cfg.ports.metrics,
    fetch: async (req) => {
      if (new URL(req.url).pathname !== "/metrics") return new Response("not found", { status: 404 });
      indexers.models.updateGauges();
      const c = workers.counters();
      metrics.listenerGaps.set(c.gaps);
      metrics.listenerReplays.set(c.replays);
      metrics.listenerRestarts.set(c.restarts);
      metrics.listenerHeartbeatTimeouts.set(c.heartbeatTimeouts);
      metrics.listenersConnected.set(workers.connectedListeners());
      metrics.ready.set(health.ready ? 1 : 0);
      metrics.listenerProtocolErrors.set(c.protocolErrors);
      replicaAgg?.updateGauges();
      return new Response(await metrics.registry.metrics(), { headers: { "content-type": metrics.registry.contentType } });
    },
  });
  log.info(
    { grpc: grpcPort, grpcHealth: grpcHealthPort, selection: selection.port, metrics: metricsServer.port, replicaAgg: replicaAgg?.endpoint, listen: cfg.listen },
    "servers listening",
  );

  // Workers and their KV listeners, subscribed before recovery fetches a dump (rule 1).
  const recoveryAbort = new AbortController();
  // Kubernetes mode resolves once the pool is read and the pods are listed (not blocking the servers).
  let workerSource: Promise<{ stop(): Promise<void> }> = Promise.resolve({ stop: async () => {} });
  // Two sources, one worker set: the static list or pod informer, and the workers' attachment intents.
  let podSpecs: WorkerSpec[] = [];
  let intentSpecs: IntentWorker[] = [];
  // Kubernetes mode: pod discovery decides membership (an intent without a Ready pod gets no listener).
  const mergeLog = log.child({ component: "workers" });
  let lastMerge = { unroutable: "[]", aliases: "[]" };
  const reconcileWorkers = () => {
    const merged = mergeWorkerSets(podSpecs, intentSpecs, { mode: cfg.workers.mode });
    // Logged when they change, not on every reconcile (pod and intent updates are frequent).
    const now = { unroutable: JSON.stringify(merged.unroutable), aliases: JSON.stringify(merged.aliases) };
    if (now.unroutable !== lastMerge.unroutable && merged.unroutable.length > 0)
      mergeLog.warn({ unroutable: merged.unroutable }, "intent workers not routable (no listener)");
    else if (now.unroutable !== lastMerge.unroutable) mergeLog.info("every intent worker routable");
    if (now.aliases !== lastMerge.aliases) mergeLog.info({ aliases: merged.aliases }, "intent workers merged into listed workers");
    lastMerge = now;
    workers.reconcile(merged.workers);
  };
  if (cfg.workers.mode === "static") {
    podSpecs = staticWorkers(cfg.workers.list);
    reconcileWorkers();
  } else {
    const w = cfg.workers;
    const poolLog = log.child({ component: "pool" });
    workerSource = startPoolWorkers({
      kubeConfig: kube(),
      poolName: w.poolName,
      namespace: w.namespace,
      kvEventsPort: w.kvEventsPort,
      kvReplayPort: w.kvReplayPort,
      dpSize: w.dpSize,
      log: poolLog,
      onWorkers: (specs) => {
        podSpecs = specs;
        reconcileWorkers();
      },
      onError: (err) => {
        metrics.ioErrors.inc({ where: "kubernetes" });
        poolLog.warn({ err: String(err) }, "Kubernetes API error");
      },
      signal: recoveryAbort.signal,
    });
  }
  const intentSource = cfg.intents
    ? startIntentSource({
        where: cfg.intents.discovery,
        hostInstance: cfg.intents.hostInstance,
        kubeConfig: kube,
        log: log.child({ component: "intents" }),
        countError: () => metrics.ioErrors.inc({ where: "intents" }),
        onWorkers: (workers) => {
          intentSpecs = workers;
          reconcileWorkers();
        },
      })
    : undefined;
  scraper.start();

  // Recovery, then the buffered live events on top of the dump, then ready.
  const ready = Promise.all([workerSource, intentSource?.firstAttempt])
    .then(async () => {
      // Bounded (--subscribe-wait-ms): a worker that is down must not hold readiness; its listener keeps
      // reconnecting and its blocks arrive once it is up.
      const unconnected = await workers.waitConnected(cfg.subscribeWaitMs);
      if (unconnected.length > 0) log.warn({ listeners: unconnected }, "KV listeners still connecting; recovering without waiting longer");
      log.info({ workers: workers.specs().length, listeners: workers.candidates().length }, "listeners subscribed");
      const budget = recoveryBudget(cfg.recoveryBudgetMiB);
      log.info(
        { budgetBytes: budget.bytes, from: budget.source, maxBodyBytes: dumpBodyLimit(budget.bytes), minRate: cfg.recoveryMinRate, deadlineMs: cfg.recoveryDeadlineMs || null },
        "recovery limits",
      );
      return runRecovery({
        discovery: peerDiscovery(cfg, kube, log),
        target: handoff.target(indexers.recovery.within(budget.bytes)),
        timeoutMs: cfg.recoveryTimeoutMs,
        token: cfg.peerToken,
        logger: log,
        budgetBytes: budget.bytes,
        limits: { maxBytes: dumpBodyLimit(budget.bytes) },
        minRate: cfg.recoveryMinRate,
        maxPeerFailures: cfg.recoveryPeerMaxFailures,
        deadlineMs: cfg.recoveryDeadlineMs || undefined,
        onState: (s) => attemptMetrics.observe(s),
        signal: recoveryAbort.signal,
      });
    })
    .then((outcome) => {
      // Shutting down: nothing more to set up (a recovery that ended without looking at the signal).
      recoveryAbort.signal.throwIfAborted();
      recoveryMetric.set(outcome);
      recoveryOutcome = outcome;
      indexers.models.pruneWorkers((w) => workers.has(w));
      indexers.live.holdWithinCapacity();
      workers.attach((worker, signal) => {
        try {
          handoff.signal(worker, signal);
        } catch (err) {
          metrics.ioErrors.inc({ where: "kv_events" });
          log.warn({ worker: worker.workerId, rank: worker.dpRank, err: String(err) }, "applying KV events failed");
        }
      });
      recovered = true;
      health.setReady(true);
      if (outcome.kind === "recovered") log.info({ peer: outcome.peer, events: outcome.events }, "recovered");
      else log.warn({ state: outcome.kind, reason: outcome.kind === "empty_bootstrap" ? outcome.reason : undefined }, "ready with an EMPTY KV index");
      return outcome;
    });
  ready.catch((err) => {
    if (!recoveryAbort.signal.aborted) log.error({ err: String(err) }, "recovery failed");
  });

  let stopping: Promise<void> | undefined;
  const stop = (opts: { graceMs?: number } = {}) =>
    (stopping ??= (async () => {
      health.drain();
      recoveryAbort.abort(new Error("shutting down"));
      // Gateways and endpoint controllers need a moment to see NOT_SERVING; keep routing until then.
      if (cfg.shutdownDelayMs > 0) {
        log.info({ ms: cfg.shutdownDelayMs }, "NOT_SERVING, still routing during the shutdown delay");
        await Bun.sleep(cfg.shutdownDelayMs);
      }
      log.info("draining: waiting for in-flight streams");
      await extProc.shutdown(opts.graceMs ?? 30_000);
      certWatch?.stop();
      healthServer.forceShutdown();
      selection.stop(true);
      metricsServer.stop(true);
      scraper.stop();
      await workerSource.then((src) => src.stop()).catch(() => {});
      await intentSource?.stop().catch(() => {});
      await workers.close();
      await replicaAgg?.stop();
      log.info("stopped");
    })());

  return {
    ports: {
      grpc: grpcPort,
      grpcHealth: grpcHealthPort,
      metrics: metricsServer.port!,
      selection: selection.port!,
      replicaAgg: replicaAgg ? parseEndpoint(replicaAgg.endpoint).port : undefined,
    },
    health,
    ready,
    indexers,
    workers,
    picker,
    load,
    replicaAgg,
    stop,
  };
}

function indexerKeyOf(cfg: EppConfig): string {
  return `${cfg.model.name}:${cfg.model.tenant}`;
}

function peerDiscovery(cfg: EppConfig, kube: () => KubeConfig, log: Logger): PeerDiscovery | null {
  switch (cfg.recovery.mode) {
    case "disabled":
      return null;
    case "static":
      return staticPeerDiscovery({ peers: cfg.recovery.peers, token: cfg.peerToken, logger: log });
    case "kubernetes":
      return endpointSliceDiscovery({
        kubeConfig: kube(),
        namespace: cfg.recovery.namespace,
        service: cfg.recovery.peerService,
        podIp: cfg.podIp,
        logger: log,
      });
  }
}

function bind(server: grpc.Server, host: string, port: number, creds: grpc.ServerCredentials): Promise<number> {
  return new Promise((resolve, reject) => server.bindAsync(hostPort(host, port), creds, (err, p) => (err ? reject(err) : resolve(p))));
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
      console.error(`epp: ${err.message}\n\n${usage()}`);
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
