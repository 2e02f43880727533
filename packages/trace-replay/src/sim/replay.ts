// Replays a trace against simulated workers under one routing policy, as a discrete-event simulation in
// virtual time: arrivals come from the (time-compressed) trace, workers admit, prefill and decode per
// mock-worker's step scheduler, KV events reach the KV index after a configurable lag. Nothing sleeps, so
// a whole trace runs in seconds and the same seed gives the same figures.
import { workerKey, type WorkerRef, type WorkerRole } from "@kv-epp/protocol";
import { fromWireExtraKeys, KvIndex } from "@kv-epp/index-wasm";
import type { CacheEvent, TimingParams } from "@kv-epp/mock-worker";
import { ActiveLoad, DEFAULT_LATENCY_SETTINGS, DEFAULT_PENDING, EvictionRegret, PendingPrefixes, type Candidate, type Clock, type LatencySettings, type Weights } from "@kv-epp/routing";
import { seededRandom } from "@kv-epp/testkit";
import { POLICIES, type PolicyName, type PolicySpec, type ReplicaContext, type Router } from "../policies/index.ts";
import { arrivalTimes, type TraceRecord } from "../trace.ts";
import { EventQueue } from "./event-queue.ts";
import { DEFAULT_AGG_SIM, SimReplicaAgg, type AggSimOptions, type AggSimStats } from "./replica-agg.ts";
import { percentile, Recorder, type RunSeries } from "./recorder.ts";
import { adapterOf } from "./lora-mix.ts";
import { toSimRequest } from "./request.ts";
import { SimWorker } from "./worker.ts";

export type ReplayOptions = {
  workers: number;
  capacityBlocks: number;
  blockSize: number;
  /** replay this many times faster than the trace's timestamps */
  timeScale: number;
  /** router replicas, request i goes to replica i mod N */
  replicas: number;
  /** replicas share the load of their routing decisions (replica-agg) instead of each knowing only its own */
  replicaAgg: boolean;
  /** how replica-agg delivers it (lag, heartbeat, timeout, loss); the EPP's defaults when absent */
  agg?: AggSimOptions;
  /**
   * arrivals as the trace's (quantised) timestamps say, spread evenly within each timestamp group, or in
   * bursts (every record of a 30 s window of trace time at the window's start)
   */
  arrivals?: "recorded" | "spread" | "bursts";
  /** a worker's cache reset mid-run (a scenario) */
  reset?: CacheReset;
  /** LoRA adapters half the conversations run on (the LoRA-mix scenario; 0 or absent: base model only) */
  loraAdapters?: number;
  /** virtual ms between a cache change on a worker and its KV event reaching the index */
  eventLagMs: number;
  seed: number;
  timing: Partial<TimingParams>;
  weights: Weights;
  /** the latency cost's settings (the EPP's --latency-* options); their defaults when absent */
  latency?: LatencySettings;
  /**
   * in-flight prefixes (the EPP's --inflight-prefix): `own`, each replica those of its own routed
   * requests, and with replica-agg on its peers' as they arrive over it (as the EPP does); `shared`,
   * every replica all of them at once, with no lag (a bound for what replica-agg can carry); `off` or
   * absent: none
   */
  inflightPrefix?: InflightPrefixMode;
  /** the EPP's --queue-threshold; 0 (off) when absent */
  queueThreshold?: number;
  /** width of the time buckets of the series, virtual ms */
  bucketMs: number;
};

export type InflightPrefixMode = "off" | "own" | "shared";

/** At `atMs` (virtual) worker `worker`'s cache is cleared; `silent`: no event reaches the index. */
export type CacheReset = { atMs: number; worker: number; silent: boolean };

/** The one model's index key (scopes in-flight prefix keys as the EPP's indexer key does). */
const SIM_MODEL_KEY = "sim";

/** Trace time gathered into one burst (the bursts scenario). */
const BURST_WINDOW_MS = 30_000;

export type RunResult = {
  policy: PolicyName;
  /** e.g. "kv-aware", "kv-aware x2 agg" */
  label: string;
  replicas: number;
  replicaAgg: boolean;
  requests: number;
  promptTokens: number;
  cachedTokens: number;
  hitRate: number;
  ttftP50Ms: number;
  ttftP99Ms: number;
  imbalance: number;
  instantImbalance: number;
  picksPerSec: number;
  /** blocks evicted over all workers (shows the capacity is tight enough to matter) */
  evictedBlocks: number;
  /** replica-agg messages, losses, gaps and timeouts, for runs with several replicas sharing load */
  agg?: AggSimStats;
  /** virtual ms from the first arrival to the last finish */
  durationMs: number;
  ttftMs: number[];
  series: RunSeries;
};

function runLabel(policy: PolicyName, replicas: number, replicaAgg: boolean): string {
  if (replicas <= 1) return policy;
  return `${policy} x${replicas}${POLICIES[policy].usesRouterLoad ? (replicaAgg ? " agg" : " no-agg") : ""}`;
}

export function replayPolicy(trace: readonly TraceRecord[], policy: PolicyName, opts: ReplayOptions): RunResult {
  const spec = POLICIES[policy];
  const queue = new EventQueue();
  const rec = new Recorder(opts.workers, opts.bucketMs);
  const random = seededRandom(opts.seed);
  const refs: WorkerRef[] = Array.from({ length: opts.workers }, (_, i) => ({ workerId: `worker-${i}`, dpRank: 0 }));
  let routers: Router[] = [];
  let evictedBlocks = 0;

  const workers = refs.map(
    (_, i) =>
      new SimWorker(i, { blockSize: opts.blockSize, capacityBlocks: opts.capacityBlocks, timing: opts.timing }, queue, {
        onFirstToken: (f) => {
          const ttftMs = f.atMs - f.req.arrivalMs;
          rec.firstToken(f.atMs, f.req.promptTokens, f.cachedTokens, ttftMs);
          routerOf.get(f.req.id)?.firstToken?.(f.req);
          seen.set(f.req.id, { ttftMs, cachedTokens: f.cachedTokens });
        },
        onFinished: (req, w, now) => {
          rec.inflightChange(w, now, -1);
          routerOf.get(req.id)?.finished?.(req, w, seen.get(req.id)!);
          seen.delete(req.id);
          routerOf.delete(req.id);
        },
      }),
  );
  const routerOf = new Map<number, Router>();
  /** What each request's response will tell the router that sent it. */
  const seen = new Map<number, { ttftMs: number; cachedTokens: number }>();

  // Every replica subscribes to every worker, so their indexes hold the same blocks: one index stands
  // for all of them. Events are applied in order per worker, `eventLagMs` after the cache changed.
  const index = KvIndex.create({ blockSize: opts.blockSize });
  // The EPP's listener feeds its eviction regret from the same events as its index.
  const regret = new EvictionRegret();
  let resetting = false;
  workers.forEach((w, i) =>
    w.onCacheEvents((events) => {
      for (const e of events) if (e.kind === "removed") evictedBlocks += e.hashes.length;
      if (!spec.usesIndex || resetting) return;
      const apply = () => applyToIndex(index, regret, refs[i]!, events);
      if (opts.eventLagMs > 0) queue.schedule(queue.now + opts.eventLagMs, apply);
      else apply();
    }),
  );

  const set = createRouters({ spec, workers, refs, queue, opts, index, regret, random });
  routers = set.routers;
  const agg = set.agg;

  const reset = opts.reset;
  if (reset && reset.worker < workers.length)
    queue.schedule(reset.atMs, () => {
      // A silent reset still tells the policies reading the true caches (their mirrors follow the event).
      resetting = reset.silent;
      workers[reset.worker]!.cache.clear();
      resetting = false;
    });

  let pickNs = 0;
  const arrivals = burstArrivals(trace, opts);
  trace.forEach((record, id) => {
    const at = arrivals[id]!;
    queue.runUntil(at);
    const req = toSimRequest(id, record, at, opts.blockSize, adapterOf(record, opts.loraAdapters ?? 0));
    const router = routers[id % routers.length]!;
    rec.sampleInstant();
    const t0 = Bun.nanoseconds();
    const w = router.pick(req);
    pickNs += Bun.nanoseconds() - t0;
    router.routed?.(req, w);
    routerOf.set(id, router);
    rec.inflightChange(w, at, +1);
    workers[w]!.submit(req, at);
  });
  agg?.stop();
  queue.runUntil(Number.POSITIVE_INFINITY);
  rec.finish(queue.now);

  return {
    policy,
    label: runLabel(policy, opts.replicas, opts.replicaAgg),
    replicas: opts.replicas,
    replicaAgg: opts.replicaAgg,
    requests: trace.length,
    promptTokens: rec.promptTokens,
    cachedTokens: rec.cachedTokens,
    hitRate: rec.promptTokens > 0 ? rec.cachedTokens / rec.promptTokens : 0,
    ttftP50Ms: percentile(rec.ttftMs, 0.5),
    ttftP99Ms: percentile(rec.ttftMs, 0.99),
    imbalance: rec.imbalance(),
    instantImbalance: rec.instantImbalance(),
    picksPerSec: pickNs > 0 ? trace.length / (pickNs / 1e9) : Number.POSITIVE_INFINITY,
    evictedBlocks,
    agg: agg?.stats,
    durationMs: queue.now,
    ttftMs: rec.ttftMs,
    series: rec.series(),
  };
}

/** What one policy's router replicas are built over: the workers they route to and what they all share. */
export type RouterSetup = {
  spec: PolicySpec;
  workers: readonly SimWorker[];
  refs: readonly WorkerRef[];
  queue: EventQueue;
  opts: ReplayOptions;
  index: KvIndex;
  regret: EvictionRegret;
  /** replica 0's random source; the others are seeded from `opts.seed` (+ `seedOffset`) */
  random: () => number;
  seedOffset?: number;
  /** each worker's P/D role (by position), for a pool with roles; with `pdThresholdTokens` for the decider */
  roles?: readonly WorkerRole[];
  pdThresholdTokens?: number;
};

/**
 * `opts.replicas` routers under one policy over `workers`, each with its own load and in-flight
 * prefixes, sharing them through a simulated replica-agg when `opts.replicaAgg` is on.
 */
export function createRouters(s: RouterSetup): { routers: Router[]; agg?: SimReplicaAgg } {
  const { spec, workers, refs, queue, opts, index, regret } = s;
  const offset = s.seedOffset ?? 0;
  const workerKeys = refs.map(workerKey);
  const candidates: Candidate[] = refs.map((ref, i) => ({ ...ref, key: workerKeys[i]!, endpoint: workerKeys[i]!, rankHeader: undefined, ...(s.roles ? { role: s.roles[i] } : {}) }));
  const clock: Clock = { now: () => queue.now };
  // Virtual time ages the in-flight prefixes, as wall time does in the EPP.
  const newPending = () => new PendingPrefixes({ ...DEFAULT_PENDING, now: () => queue.now });
  const shared = opts.inflightPrefix === "shared" ? newPending() : undefined;
  const pendingFor = () => shared ?? (opts.inflightPrefix === "own" ? newPending() : undefined);
  const ownLoads = Array.from({ length: Math.max(1, opts.replicas) }, () => new ActiveLoad(pendingFor()));
  // One replica needs no sharing; several share through the simulated replica-agg when it is on.
  const agg =
    opts.replicaAgg && spec.usesRouterLoad && ownLoads.length > 1
      ? new SimReplicaAgg(queue, ownLoads, opts.agg ?? DEFAULT_AGG_SIM, seededRandom(opts.seed + offset + 104729), opts.inflightPrefix === "own" ? ownLoads.map(() => newPending()) : undefined)
      : undefined;
  const routers = ownLoads.map((ownLoad, r) => {
    const ctx: ReplicaContext = {
      workers,
      workerKeys,
      candidates,
      clock,
      random: r === 0 ? s.random : seededRandom(opts.seed + offset + 7919 * r),
      ownLoad,
      pending: agg ? agg.pendingView(r) : ownLoad.pending,
      load: agg ? agg.view(r) : ownLoad,
      index,
      modelKey: SIM_MODEL_KEY,
      weights: opts.weights,
      latency: opts.latency ?? DEFAULT_LATENCY_SETTINGS,
      replicas: agg ? () => agg.replicas(r) : undefined,
      regret,
      queueThreshold: opts.queueThreshold ?? 0,
      blockSize: opts.blockSize,
      capacityBlocks: opts.capacityBlocks,
      pdThresholdTokens: s.pdThresholdTokens,
    };
    return spec.create(ctx);
  });
  return { routers, agg };
}

export function burstArrivals(trace: readonly TraceRecord[], opts: ReplayOptions): number[] {
  if (opts.arrivals !== "bursts") return arrivalTimes(trace, opts.timeScale, opts.arrivals ?? "recorded");
  const window = BURST_WINDOW_MS / opts.timeScale;
  return arrivalTimes(trace, opts.timeScale, "recorded").map((t) => Math.floor(t / window) * window);
}

/** Worker KV events (what the mock publishes) applied to the index and the eviction regret, as the EPP's listener does. */
export function applyToIndex(index: KvIndex, regret: EvictionRegret, worker: WorkerRef, events: CacheEvent[]): void {
  const b = index.batch();
  for (const e of events) {
    if (e.kind === "stored") {
      // The blocks' extra_keys (an adapter's name) fold into their hashes, as the EPP's listener folds them.
      const extras = e.extraKeys.some((k) => k !== null) ? e.extraKeys.map((k) => fromWireExtraKeys(k)) : undefined;
      b.stored(worker, e.parent, e.hashes, { tokenIds: e.tokenIds, extras });
      regret.stored(worker, e.hashes);
    } else if (e.kind === "removed") {
      b.removed(worker, e.hashes);
      regret.removed(worker, e.hashes);
    } else b.cleared(worker);
  }
  if (b.events > 0) b.apply();
}
