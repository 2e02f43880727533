// `bun run bench:trace` options, parsed once at the edge.
import { z } from "zod";
import { POLICY_NAMES, type PolicyName } from "../policies/index.ts";
import { FlagError, parseFlags } from "../cli-flags.ts";
import { DEFAULT_AGG_SIM, type AggSimOptions } from "../sim/replica-agg.ts";
import type { CacheReset, InflightPrefixMode } from "../sim/replay.ts";
import { DEFAULT_TIMING } from "@kv-epp/mock-worker";
import { DEFAULT_AWAY_WEIGHT, DEFAULT_PD_THRESHOLD_TOKENS, DEFAULT_FOLLOWER_WEIGHT, DEFAULT_FOLLOWER_WEIGHT_MAX, DEFAULT_SHAPE, DEFAULT_WEIGHTS, INFLIGHT_PREFIX_DEFAULT, SCORE_SHAPE, followerRange, type CostShape, type FollowerRange } from "@kv-epp/routing";
import { DEFAULT_TRACE_PATH } from "../trace.ts";

const positiveInt = z.coerce.number().int().positive();
const nonNegative = z.coerce.number().min(0);

const schema = z.object({
  trace: z.string().min(1).default(DEFAULT_TRACE_PATH),
  // 8 workers of 32768 blocks x 16 tokens = 512k tokens each (about what an 80 GB GPU holds for an 8B
  // model): the trace's working set is ~93M tokens, so caches evict all the time and where a request
  // lands decides whether its conversation's earlier turns are still cached.
  workers: positiveInt.default(8),
  "capacity-blocks": positiveInt.default(32768),
  "block-size": positiveInt.default(16),
  // 1x: the trace at its recorded rate. The first 4000 conversation requests (~22 min, ~3 requests/s,
  // ~13k-token prompts) keep each simulated worker's engine about half busy with prefill; at 2x queues
  // build, at 10x they grow without bound.
  "time-scale": z.coerce.number().positive().default(1),
  // The trace's timestamps come in ~3 s steps; "spread" spaces each step's records evenly instead of
  // letting them arrive at one instant.
  arrivals: z.enum(["recorded", "spread", "bursts"]).default("recorded"),
  // Scenario: at this virtual ms one worker's cache is reset ("announced": AllBlocksCleared reaches the
  // index; "silent": behind its back, the index keeps claiming the blocks).
  "reset-at-ms": nonNegative.optional(),
  "reset-worker": z.coerce.number().int().min(0).default(0),
  "reset-mode": z.enum(["announced", "silent"]).default("silent"),
  // Scenario: half the conversations run on one of this many LoRA adapters (0: base model only).
  "lora-adapters": z.coerce.number().int().min(0).default(0),
  /** 0 = the whole trace */
  requests: z.coerce.number().int().min(0).default(4000),
  /** router replica counts for the extra multi-replica rows (with and without replica-agg), comma-separated; 1 = none */
  replicas: z.string().regex(/^\d+(,\d+)*$/, "a comma-separated list of replica counts").default("2,3"),
  "replica-agg": z.enum(["both", "on", "off"]).default("both"),
  "replica-policies": z.string().default("kv-latency,kv-aware,approx-prefix"),
  // Simulated replica-agg (the EPP's defaults): lag of a change to reach a peer (loopback measured
  // p50 0.2 ms, max 3 ms), snapshot/heartbeat period, silence timeout, message loss probability.
  "agg-lag-ms": nonNegative.default(DEFAULT_AGG_SIM.lagMs),
  "agg-heartbeat-ms": z.coerce.number().positive().default(DEFAULT_AGG_SIM.heartbeatMs),
  "agg-timeout-ms": z.coerce.number().positive().default(DEFAULT_AGG_SIM.timeoutMs),
  "agg-loss": z.coerce.number().min(0).max(1).default(DEFAULT_AGG_SIM.loss),
  policies: z.string().default(POLICY_NAMES.join(",")),
  "event-lag-ms": nonNegative.default(10),
  // The EPP's --inflight-prefix (its default): own (each replica its own routed requests' prefixes, and
  // with replica-agg its peers' as they arrive over it, as the EPP keeps them), shared (every
  // replica's at once, with no lag: the bound for what replica-agg carries), off.
  "inflight-prefix": z.enum(["own", "shared", "off"]).default(INFLIGHT_PREFIX_DEFAULT ? "own" : "off"),
  seed: z.coerce.number().int().default(1),
  // The EPP's defaults (routing cost.ts DEFAULT_WEIGHTS).
  "prefill-load-scale": nonNegative.default(DEFAULT_WEIGHTS.prefillLoadScale),
  "decode-load-scale": nonNegative.default(DEFAULT_WEIGHTS.decodeLoadScale),
  "latency-follower-weight": nonNegative.default(DEFAULT_FOLLOWER_WEIGHT),
  // As the EPP's flag: below the base it is the base (a fixed weight).
  "latency-follower-weight-max": nonNegative.default(DEFAULT_FOLLOWER_WEIGHT_MAX),
  // The EPP's --latency-away-weight (routing home.ts): applies with replica-agg on.
  "latency-away-weight": nonNegative.default(DEFAULT_AWAY_WEIGHT),
  // The EPP's cost shapes and their defaults (routing cost.ts CostShape, DEFAULT_SHAPE, SCORE_SHAPE):
  // score, or blocks (the two weights above).
  "cost-shape": z.enum(["score", "blocks"]).default(DEFAULT_SHAPE.kind),
  "prefix-weight": nonNegative.default(SCORE_SHAPE.prefix),
  "load-weight": nonNegative.default(SCORE_SHAPE.load),
  "prefix-cap-blocks": z.coerce.number().int().min(0).default(SCORE_SHAPE.prefixCapBlocks),
  "load-by": z.enum(["requests", "blocks"]).default(SCORE_SHAPE.loadBy),
  // The engine (mock-worker's StepScheduler): vLLM's --max-num-seqs and --max-num-batched-tokens.
  "max-num-seqs": positiveInt.default(DEFAULT_TIMING.maxNumSeqs),
  "max-num-batched-tokens": positiveInt.default(DEFAULT_TIMING.maxNumBatchedTokens),
  // A prefill/decode pool instead (`P,D`: prefill and decode workers): rows for llm-d's rule and the
  // EPP's (src/sim/pd-replay.ts), the decider's threshold and the KV read time per block.
  pd: z.string().regex(/^[1-9]\d*,[1-9]\d*$/, "P,D: prefill and decode worker counts").optional(),
  "pd-threshold-tokens": z.coerce.number().int().min(0).default(DEFAULT_PD_THRESHOLD_TOKENS),
  "transfer-ms-per-block": nonNegative.default(0.1),
  jobs: positiveInt.optional(),
  out: z.string().min(1).default("reports"),
  png: z.enum(["auto", "off"]).default("auto"),
});

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
  latencyFollowerWeight: FollowerRange;
  awayWeight: number;
  costShape: CostShape;
  maxNumSeqs: number;
  maxNumBatchedTokens: number;
  /** a P/D pool's run instead of the pooled one */
  pd: { prefillWorkers: number; decodeWorkers: number; thresholdTokens: number; transferMsPerBlock: number } | undefined;
  jobs: number | undefined;
  outDir: string;
  png: boolean;
};

function policyList(flag: string, v: string): PolicyName[] {
  const names = v.split(",").map((s) => s.trim()).filter(Boolean);
  for (const n of names)
    if (!(POLICY_NAMES as readonly string[]).includes(n))
      throw new FlagError(`--${flag}: unknown policy ${JSON.stringify(n)} (know ${POLICY_NAMES.join(", ")})`);
  return names as PolicyName[];
}

function shapeOf(o: z.infer<typeof schema>): CostShape {
  const loadBy = o["load-by"];
  return o["cost-shape"] === "blocks" ? { kind: "blocks" } : { kind: "score", prefix: o["prefix-weight"], load: o["load-weight"], loadBy, prefixCapBlocks: o["prefix-cap-blocks"] };
}

/** A bare argument is the trace path. */
export function parseBenchArgs(argv: string[]): BenchOptions {
  const o = parseFlags(schema, argv, "trace");
  return {
    tracePath: o.trace,
    workers: o.workers,
    capacityBlocks: o["capacity-blocks"],
    blockSize: o["block-size"],
    timeScale: o["time-scale"],
    arrivals: o.arrivals,
    requests: o.requests,
    replicas: [...new Set(o.replicas.split(",").map(Number))].filter((n) => n > 1),
    reset: o["reset-at-ms"] === undefined ? undefined : { atMs: o["reset-at-ms"], worker: o["reset-worker"], silent: o["reset-mode"] === "silent" },
    loraAdapters: o["lora-adapters"],
    replicaAgg: o["replica-agg"],
    replicaPolicies: policyList("replica-policies", o["replica-policies"]),
    agg: { lagMs: o["agg-lag-ms"], heartbeatMs: o["agg-heartbeat-ms"], timeoutMs: o["agg-timeout-ms"], loss: o["agg-loss"] },
    policies: policyList("policies", o.policies),
    eventLagMs: o["event-lag-ms"],
    inflightPrefix: o["inflight-prefix"],
    seed: o.seed,
    prefillLoadScale: o["prefill-load-scale"],
    decodeLoadScale: o["decode-load-scale"],
    latencyFollowerWeight: followerRange(o["latency-follower-weight"], o["latency-follower-weight-max"]),
    awayWeight: o["latency-away-weight"],
    costShape: shapeOf(o),
    maxNumSeqs: o["max-num-seqs"],
    maxNumBatchedTokens: o["max-num-batched-tokens"],
    pd: o.pd === undefined ? undefined : {
      prefillWorkers: Number(o.pd.split(",")[0]), decodeWorkers: Number(o.pd.split(",")[1]),
      thresholdTokens: o["pd-threshold-tokens"], transferMsPerBlock: o["transfer-ms-per-block"],
    },
    jobs: o.jobs,
    outDir: o.out,
    png: o.png === "auto",
  };
}
