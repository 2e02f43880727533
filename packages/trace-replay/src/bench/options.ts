// `bun run bench:trace` options, declared once and resolved at the edge (flags only). Routing's cost
// shape and latency knobs are routing's own declarations, the EPP's flags with the EPP's defaults.
import { ConfigError, count, group, nonNegative, opt, positive, resolveOptions, usageText, type Values } from "@kv-epp/options";
import { DEFAULT_TIMING } from "@kv-epp/mock-worker";
import { DISAGG_OPTIONS, INFLIGHT_PREFIX_DEFAULT, LATENCY_OPTIONS, SHAPE_OPTIONS, latencySettings, shapeSettings, type CostShape, type LatencySettings } from "@kv-epp/routing";
import { z } from "zod";
import { POLICY_NAMES, type PolicyName } from "../policies/index.ts";
import { DEFAULT_AGG_SIM, type AggSimOptions } from "../sim/replica-agg.ts";
import type { CacheReset, InflightPrefixMode } from "../sim/replay.ts";
import { DEFAULT_TRACE_PATH } from "../trace.ts";

const BENCH_PROGRAM = { positional: "trace" } as const;

export const BENCH_OPTIONS = {
  ...group("Trace", {
    trace: opt.string(z.string().min(1).default(DEFAULT_TRACE_PATH), "trace file (JSONL; a bare argument too), or synthetic"),
    requests: opt.int(count.default(4000), "requests replayed from the start of the trace (0: the whole trace)"),
    // 1x: the trace at its recorded rate. The first 4000 conversation requests (~22 min, ~3 requests/s,
    // ~13k-token prompts) keep each simulated worker's engine about half busy with prefill; at 2x queues
    // build, at 10x they grow without bound.
    timeScale: opt.number(z.number().positive().default(1), "arrival rate as a multiple of the trace's"),
    // The trace's timestamps come in ~3 s steps; "spread" spaces each step's records evenly instead of
    // letting them arrive at one instant.
    arrivals: opt.choice(["recorded", "spread", "bursts"], "recorded", "arrival times: as recorded, spread evenly over each recorded step, or in bursts"),
    seed: opt.int(z.number().int().default(1), "seed of every random choice (same seed, same figures)"),
  }),
  ...group("Simulated workers", {
    // 8 workers of 32768 blocks x 16 tokens = 512k tokens each (about what an 80 GB GPU holds for an 8B
    // model): the trace's working set is ~93M tokens, so caches evict all the time and where a request
    // lands decides whether its conversation's earlier turns are still cached.
    workers: opt.int(positive.default(8), "simulated workers"),
    capacityBlocks: opt.int(positive.default(32768), "KV cache capacity per worker, in blocks"),
    blockSize: opt.int(positive.default(16), "tokens per KV block"),
    // The engine (mock-worker's StepScheduler): vLLM's --max-num-seqs and --max-num-batched-tokens.
    maxNumSeqs: opt.int(positive.default(DEFAULT_TIMING.maxNumSeqs), "vLLM's --max-num-seqs: requests running at once per worker"),
    maxNumBatchedTokens: opt.int(positive.default(DEFAULT_TIMING.maxNumBatchedTokens), "vLLM's --max-num-batched-tokens: tokens one engine step computes"),
    eventLagMs: opt.number(nonNegative.default(10), "delay of a KV event from the worker to the index"),
  }),
  ...group("Policies and router replicas", {
    policies: opt.string(z.string().default(POLICY_NAMES.join(",")), "policies replayed with one router, comma-separated"),
    replicas: opt.string(
      z.string().regex(/^\d+(,\d+)*$/, "a comma-separated list of replica counts").default("2,3"),
      "router replica counts for the extra multi-replica rows (with and without replica-agg), comma-separated; 1: none",
    ),
    replicaAgg: opt.choice(["both", "on", "off"], "both", "multi-replica rows with replica-agg, without, or both"),
    replicaPolicies: opt.string(z.string().default("kv-latency,kv-aware,approx-prefix"), "policies of the multi-replica rows, comma-separated"),
    // The EPP's --inflight-prefix (its default): own (each replica its own routed requests' prefixes, and
    // with replica-agg its peers' as they arrive over it, as the EPP keeps them), shared (every
    // replica's at once, with no lag: the bound for what replica-agg carries), off.
    inflightPrefix: opt.choice(["own", "shared", "off"], INFLIGHT_PREFIX_DEFAULT ? "own" : "off", "in-flight prefixes: each replica its own (the EPP's), shared by all at once (a bound), or off"),
  }),
  // Simulated replica-agg (the EPP's defaults): lag of a change to reach a peer (loopback measured
  // p50 0.2 ms, max 3 ms), snapshot/heartbeat period, silence timeout, message loss probability.
  ...group("Simulated replica-agg", {
    aggLagMs: opt.number(nonNegative.default(DEFAULT_AGG_SIM.lagMs), "lag of a load change to reach a peer"),
    aggHeartbeatMs: opt.number(z.number().positive().default(DEFAULT_AGG_SIM.heartbeatMs), "snapshot (heartbeat) period"),
    aggTimeoutMs: opt.number(z.number().positive().default(DEFAULT_AGG_SIM.timeoutMs), "a peer silent this long has its load dropped"),
    aggLoss: opt.number(z.number().min(0).max(1).default(DEFAULT_AGG_SIM.loss), "probability that a message is lost"),
  }),
  ...group("Scenarios", {
    // At this virtual ms one worker's cache is reset ("announced": AllBlocksCleared reaches the index;
    // "silent": behind its back, the index keeps claiming the blocks).
    resetAtMs: opt.number(nonNegative.optional(), "reset one worker's cache at this virtual ms"),
    resetWorker: opt.int(count.default(0), "the worker whose cache is reset"),
    resetMode: opt.choice(["announced", "silent"], "silent", "announced (AllBlocksCleared reaches the index) or silent (the index keeps claiming the blocks)"),
    loraAdapters: opt.int(count.default(0), "half the conversations run on one of this many LoRA adapters (0: base model only)"),
  }),
  ...group("Prefill/decode pool", {
    // A prefill/decode pool instead (`P,D`: prefill and decode workers): rows for llm-d's rule and the
    // EPP's (src/sim/pd-replay.ts), the decider's threshold and the KV read time per block.
    pd: opt.string(z.string().regex(/^[1-9]\d*,[1-9]\d*$/, "P,D: prefill and decode worker counts").optional(), "a P/D pool of P prefill and D decode workers instead of the pooled workers"),
    transferMsPerBlock: opt.number(nonNegative.default(0.1), "P/D: simulated time to read one KV block from the prefill worker"),
  }),
  ...DISAGG_OPTIONS,
  ...SHAPE_OPTIONS,
  ...LATENCY_OPTIONS,
  ...group("Output", {
    jobs: opt.int(positive.optional(), "replays run side by side on this many worker threads (default: the number of cores)"),
    out: opt.string(z.string().min(1).default("reports"), "directory of the report"),
    png: opt.choice(["auto", "off"], "auto", "auto: a PNG of the report when a headless chromium is installed"),
  }),
};

export type BenchOptions = {
  tracePath: string;
  workers: number;
  capacityBlocks: number;
  blockSize: number;
  timeScale: number;
  arrivals: "recorded" | "spread" | "bursts";
  requests: number;
  replicas: number[];
  reset: CacheReset | undefined;
  loraAdapters: number;
  replicaAgg: "both" | "on" | "off";
  replicaPolicies: PolicyName[];
  agg: AggSimOptions;
  policies: PolicyName[];
  eventLagMs: number;
  inflightPrefix: InflightPrefixMode;
  seed: number;
  prefillLoadScale: number;
  decodeLoadScale: number;
  latency: LatencySettings;
  costShape: CostShape;
  maxNumSeqs: number;
  maxNumBatchedTokens: number;
  /** a P/D pool's run instead of the pooled one */
  pd: { prefillWorkers: number; decodeWorkers: number; thresholdTokens: number; transferMsPerBlock: number } | undefined;
  jobs: number | undefined;
  outDir: string;
  png: boolean;
};

type Key = keyof typeof BENCH_OPTIONS;

/** A bare argument is the trace path. Throws ConfigError naming the bad flag. */
export function parseBenchArgs(argv: string[]): BenchOptions {
  const r = resolveOptions(BENCH_OPTIONS, BENCH_PROGRAM, { argv });
  const o: Values<typeof BENCH_OPTIONS> = r.values;
  const policyList = (key: Key & ("policies" | "replicaPolicies")): PolicyName[] => {
    const names = o[key].split(",").map((s) => s.trim()).filter(Boolean);
    for (const n of names)
      if (!(POLICY_NAMES as readonly string[]).includes(n)) r.fail(key, `unknown policy ${JSON.stringify(n)}; know ${POLICY_NAMES.join(", ")}`);
    return names as PolicyName[];
  };
  const shape = shapeSettings(o);
  return {
    tracePath: o.trace,
    workers: o.workers,
    capacityBlocks: o.capacityBlocks,
    blockSize: o.blockSize,
    timeScale: o.timeScale,
    arrivals: o.arrivals,
    requests: o.requests,
    replicas: [...new Set(o.replicas.split(",").map(Number))].filter((n) => n > 1),
    reset: o.resetAtMs === undefined ? undefined : { atMs: o.resetAtMs, worker: o.resetWorker, silent: o.resetMode === "silent" },
    loraAdapters: o.loraAdapters,
    replicaAgg: o.replicaAgg,
    replicaPolicies: policyList("replicaPolicies"),
    agg: { lagMs: o.aggLagMs, heartbeatMs: o.aggHeartbeatMs, timeoutMs: o.aggTimeoutMs, loss: o.aggLoss },
    policies: policyList("policies"),
    eventLagMs: o.eventLagMs,
    inflightPrefix: o.inflightPrefix,
    seed: o.seed,
    prefillLoadScale: shape.prefillLoadScale,
    decodeLoadScale: shape.decodeLoadScale,
    latency: latencySettings(o),
    costShape: shape.shape,
    maxNumSeqs: o.maxNumSeqs,
    maxNumBatchedTokens: o.maxNumBatchedTokens,
    pd: o.pd === undefined ? undefined : {
      prefillWorkers: Number(o.pd.split(",")[0]), decodeWorkers: Number(o.pd.split(",")[1]),
      thresholdTokens: o.pdThresholdTokens, transferMsPerBlock: o.transferMsPerBlock,
    },
    jobs: o.jobs,
    outDir: o.out,
    png: o.png === "auto",
  };
}

export function benchUsage(): string {
  return usageText(BENCH_OPTIONS, { ...BENCH_PROGRAM, command: "bun run bench:trace [TRACE]", note: "Flags only (no environment variables)." });
}

export { ConfigError };
