// Replays a trace against a prefill/decode (P/D) pool in virtual time: prefill workers and decode
// workers (the same simulated engines as replay.ts), a router that picks a pair per request, and the
// P/D sidecar's protocol in between. A disaggregated request runs its prefill leg (one output token)
// on the prefill worker, then the decode worker reads the blocks it lacks (`transferMsPerBlock` each,
// vLLM's NixlConnector as the mock worker's `--role decode` plays it) and computes only the last
// prompt token before its first output token; a request the decider keeps local runs whole on the
// decode worker. TTFT = arrival to the decode worker's first token, transfer included.
import { KvIndex } from "@kv-epp/index-wasm";
import type { WorkerRef } from "@kv-epp/protocol";
import { EvictionRegret, uncachedTokens } from "@kv-epp/routing";
import { seededRandom } from "@kv-epp/testkit";
import { POLICIES, type PolicyName, type Router } from "../policies/index.ts";
import type { TraceRecord } from "../trace.ts";
import { EventQueue } from "./event-queue.ts";
import { adapterOf } from "./lora-mix.ts";
import { percentile, Recorder } from "./recorder.ts";
import { applyToIndex, burstArrivals, createRouters, type ReplayOptions } from "./replay.ts";
import { cacheIdentity, toSimRequest, type SimRequest } from "./request.ts";
import { SimWorker } from "./worker.ts";

/**
 * How the pair is chosen. `llm-d`: llm-d's disagg profile handler over GAIE's approximate prefix scorer
 * (its own routing history per pod, with the queue and KV-usage scorers), one router per role: the
 * decode pod first, then its prefix-based decider on the tokens that pod's history does not cover,
 * then the prefill pod by the same scorer. `kv-epp`: the EPP's routing core over the whole pool, its
 * candidates carrying their roles (routing's Picker with the latency cost, the KV index fed by every
 * worker's events, the load of its routing decisions per role, shared by replica-agg): the decode
 * rank, the decider on its exact overlap, the prefill rank by overlap and prefill load.
 */
export const PD_POLICIES = ["llm-d", "kv-epp"] as const;
export type PdPolicy = (typeof PD_POLICIES)[number];
const ROLE_POLICY: Record<PdPolicy, PolicyName> = { "llm-d": "approx-prefix", "kv-epp": "kv-latency" };

export type PdOptions = Omit<ReplayOptions, "workers"> & {
  prefillWorkers: number;
  decodeWorkers: number;
  /** virtual ms to read one block from the prefill worker */
  transferMsPerBlock: number;
  /** disaggregate when the decode worker would compute at least this many tokens (llm-d's nonCachedTokens) */
  thresholdTokens: number;
};

export type PdRunResult = {
  policy: PdPolicy;
  label: string;
  replicas: number;
  requests: number;
  /** requests prefilled on a prefill worker */
  disaggregated: number;
  promptTokens: number;
  /** prompt tokens found cached where the prompt was computed (the prefill worker, or the decode worker for a local one) */
  cachedTokens: number;
  hitRate: number;
  ttftP50Ms: number;
  ttftP99Ms: number;
  /** KV read time of the disaggregated requests */
  transferP50Ms: number;
  transferP99Ms: number;
  /** in-flight imbalance (max / mean of ∫ in-flight dt) over the decode workers, and over the prefill workers */
  decodeImbalance: number;
  prefillImbalance: number;
  durationMs: number;
};

export function pdLabel(policy: PdPolicy, replicas: number): string {
  return `${policy} P/D x${replicas}${policy === "kv-epp" && replicas > 1 ? " agg" : ""}`;
}

/** The pair for one request: the decode worker always, a prefill worker when the decider says so. */
type Pair = { decode: number; prefill: number | null };

/** One router replica's view of a request's life in the pool. */
interface PairRouter {
  pick(req: SimRequest): Pair;
  /** The prefill leg ended (the sidecar got its answer). */
  prefillDone(req: SimRequest, worker: number, seen: { ttftMs: number; cachedTokens: number }): void;
  /** The decode worker read the blocks: the sidecar's decode leg starts. */
  transferred(req: SimRequest): void;
  firstToken(req: SimRequest): void;
  finished(req: SimRequest, worker: number, seen: { ttftMs: number; cachedTokens: number }): void;
}

/** llm-d's shape: a router per role, the decode pick first, the decider on what it knows of that pod. */
class RoleRouters implements PairRouter {
  constructor(
    private readonly decode: Router,
    private readonly prefill: Router,
    private readonly blockSize: number,
    private readonly thresholdTokens: number,
  ) {}

  pick(req: SimRequest): Pair {
    const decode = this.decode.pick(req);
    this.decode.routed?.(req, decode);
    const uncached = uncachedTokens(req.promptTokens, this.decode.matchedBlocks?.(decode) ?? 0, this.blockSize);
    if (this.thresholdTokens <= 0 || uncached < this.thresholdTokens) return { decode, prefill: null };
    const prefill = this.prefill.pick(req);
    this.prefill.routed?.(req, prefill);
    return { decode, prefill };
  }

  /** The prefill leg ended (the sidecar got its answer): the prefill worker's share of the request is done. */
  prefillDone(req: SimRequest, worker: number, seen: { ttftMs: number; cachedTokens: number }): void {
    this.prefill.firstToken?.(req);
    this.prefill.finished?.(req, worker, seen);
  }

  transferred(): void {}

  firstToken(req: SimRequest): void {
    this.decode.firstToken?.(req);
  }

  finished(req: SimRequest, worker: number, seen: { ttftMs: number; cachedTokens: number }): void {
    this.decode.finished?.(req, worker, seen);
  }
}

/**
 * The EPP's shape: one router over the whole pool (prefill workers first, then decode workers), whose
 * pick is the decode worker and names the prefill worker when it disaggregates. As the EPP sees it, a
 * disaggregated request's first byte comes once the prefill and the KV read are done (the sidecar
 * answers only then): the prefill rank's lease ends there, the decode rank's at the end.
 */
class PoolRouter implements PairRouter {
  private readonly remote = new Set<number>();

  constructor(private readonly router: Router, private readonly prefillWorkers: number) {}

  pick(req: SimRequest): Pair {
    const w = this.router.pick(req);
    this.router.routed?.(req, w);
    const p = this.router.prefillWorker?.();
    if (p !== undefined) this.remote.add(req.id);
    return { decode: w - this.prefillWorkers, prefill: p ?? null };
  }

  prefillDone(): void {}

  transferred(req: SimRequest): void {
    this.router.firstToken?.(req);
  }

  firstToken(req: SimRequest): void {
    if (!this.remote.delete(req.id)) this.router.firstToken?.(req);
  }

  finished(req: SimRequest, worker: number, seen: { ttftMs: number; cachedTokens: number }): void {
    this.router.finished?.(req, worker + this.prefillWorkers, seen);
  }
}

export function replayPd(trace: readonly TraceRecord[], policy: PdPolicy, opts: PdOptions): PdRunResult {
  const spec = POLICIES[ROLE_POLICY[policy]];
  const queue = new EventQueue();
  const decodeRec = new Recorder(opts.decodeWorkers, opts.bucketMs);
  const prefillRec = new Recorder(opts.prefillWorkers, opts.bucketMs);
  const refsOf = (role: string, n: number): WorkerRef[] => Array.from({ length: n }, (_, i) => ({ workerId: `${role}-${i}`, dpRank: 0 }));
  const prefillRefs = refsOf("prefill", opts.prefillWorkers);
  const decodeRefs = refsOf("decode", opts.decodeWorkers);
  const engine = { blockSize: opts.blockSize, capacityBlocks: opts.capacityBlocks, timing: opts.timing };

  const state = new Map<number, { pair: Pair; router: PairRouter; arrivalMs: number; hit: number; ttftMs?: number }>();
  const ttfts: number[] = [];
  const transfers: number[] = [];
  let cachedTokens = 0;

  const prefills = prefillRefs.map(
    (_, i) =>
      new SimWorker(i, engine, queue, {
        // The prefill leg's hit is known at its first token, which is also its last.
        onFirstToken: (f) => {
          state.get(f.req.id)!.hit = f.cachedTokens;
        },
        onFinished: (req, w, now) => {
          // The prefill answered: the sidecar sends the decode leg, which reads what its worker lacks.
          prefillRec.inflightChange(w, now, -1);
          const s = state.get(req.id)!;
          s.router.prefillDone(req, w, { ttftMs: now - s.arrivalMs, cachedTokens: s.hit });
          const d = decodes[s.pair.decode]!;
          const bs = opts.blockSize;
          const local = Math.min(d.cache.peekHitBlocks(req.tokens!, cacheIdentity(req)), Math.floor((req.promptTokens - 1) / bs));
          const pulled = Math.max(0, Math.ceil(req.promptTokens / bs) - local);
          const transferMs = pulled * opts.transferMsPerBlock;
          transfers.push(transferMs);
          queue.schedule(now + transferMs, (t) => {
            s.router.transferred(req);
            d.submit(req, t, "pulled");
          });
        },
      }),
  );
  const decodes: SimWorker[] = decodeRefs.map(
    (_, i) =>
      new SimWorker(i, engine, queue, {
        onFirstToken: (f) => {
          const s = state.get(f.req.id)!;
          // A pulled leg's own "hit" is the transfer; what the request saved is the prefill's hit.
          if (f.leg !== "pulled") s.hit = f.cachedTokens;
          cachedTokens += s.hit;
          s.ttftMs = f.atMs - s.arrivalMs;
          ttfts.push(s.ttftMs);
          decodeRec.firstToken(f.atMs, f.req.promptTokens, s.hit, s.ttftMs);
          s.router.firstToken(f.req);
        },
        onFinished: (req, w, now) => {
          decodeRec.inflightChange(w, now, -1);
          const s = state.get(req.id)!;
          s.router.finished(req, w, { ttftMs: s.ttftMs ?? 0, cachedTokens: s.hit });
          state.delete(req.id);
        },
      }),
  );

  // One index of every worker's events: both roles publish (the decode workers' read blocks too).
  const index = KvIndex.create({ blockSize: opts.blockSize });
  const regret = new EvictionRegret();
  const feed = (w: SimWorker, ref: WorkerRef) =>
    w.onCacheEvents((events) => {
      if (!spec.usesIndex) return;
      const apply = () => applyToIndex(index, regret, ref, events);
      if (opts.eventLagMs > 0) queue.schedule(queue.now + opts.eventLagMs, apply);
      else apply();
    });
  prefills.forEach((w, i) => feed(w, prefillRefs[i]!));
  decodes.forEach((w, i) => feed(w, decodeRefs[i]!));

  const random = seededRandom(opts.seed);
  const setupOpts = { ...opts, workers: 0 };
  const sets: ReturnType<typeof createRouters>[] = [];
  let routers: PairRouter[];
  if (policy === "kv-epp") {
    const pool = createRouters({
      spec, workers: [...prefills, ...decodes], refs: [...prefillRefs, ...decodeRefs], queue, opts: setupOpts, index, regret, random,
      roles: [...prefillRefs.map(() => "prefill" as const), ...decodeRefs.map(() => "decode" as const)], pdThresholdTokens: opts.thresholdTokens,
    });
    sets.push(pool);
    routers = pool.routers.map((r) => new PoolRouter(r, opts.prefillWorkers));
  } else {
    const decodeSet = createRouters({ spec, workers: decodes, refs: decodeRefs, queue, opts: setupOpts, index, regret, random });
    const prefillSet = createRouters({ spec, workers: prefills, refs: prefillRefs, queue, opts: setupOpts, index, regret, random: seededRandom(opts.seed + 31), seedOffset: 31 });
    sets.push(decodeSet, prefillSet);
    routers = decodeSet.routers.map((d, r) => new RoleRouters(d, prefillSet.routers[r]!, opts.blockSize, opts.thresholdTokens));
  }

  let disaggregated = 0;
  const arrivals = burstArrivals(trace, { ...opts, workers: 0 });
  trace.forEach((record, id) => {
    const at = arrivals[id]!;
    queue.runUntil(at);
    const req = toSimRequest(id, record, at, opts.blockSize, adapterOf(record, opts.loraAdapters ?? 0));
    const router = routers[id % routers.length]!;
    decodeRec.sampleInstant();
    const pair = router.pick(req);
    state.set(id, { pair, router, arrivalMs: at, hit: 0 });
    decodeRec.inflightChange(pair.decode, at, +1);
    if (pair.prefill === null) decodes[pair.decode]!.submit(req, at);
    else {
      disaggregated++;
      prefillRec.inflightChange(pair.prefill, at, +1);
      prefills[pair.prefill]!.submit(req, at, "prefill");
    }
  });
  for (const set of sets) set.agg?.stop();
  queue.runUntil(Number.POSITIVE_INFINITY);
  decodeRec.finish(queue.now);
  prefillRec.finish(queue.now);

  return {
    policy,
    label: pdLabel(policy, opts.replicas),
    replicas: opts.replicas,
    requests: trace.length,
    disaggregated,
    promptTokens: decodeRec.promptTokens,
    cachedTokens,
    hitRate: decodeRec.promptTokens > 0 ? cachedTokens / decodeRec.promptTokens : 0,
    ttftP50Ms: percentile(ttfts, 0.5),
    ttftP99Ms: percentile(ttfts, 0.99),
    transferP50Ms: percentile(transfers, 0.5),
    transferP99Ms: percentile(transfers, 0.99),
    decodeImbalance: decodeRec.imbalance(),
    prefillImbalance: prefillRec.imbalance(),
    durationMs: queue.now,
  };
}
