// Routing's options, declared once (schema, default, help) for every program that routes: the EPP takes
// them all, bench:trace the cost shape and the latency model (its policies set the cost model, and its
// in-flight prefix modes are the simulation's own). Their defaults are the constants beside the code
// they tune; the settings objects below are what the Picker, the LatencyModel and PendingPrefixes read.
import { count, group, nonNegative, opt, positive, type Values } from "@kv-epp/options";
import { z } from "zod";
import { DEFAULT_SHAPE, DEFAULT_WEIGHTS, SCORE_SHAPE, type CostShape } from "./cost.ts";
import { followerRange, FollowerWeight, type EvictionRegret, type FollowerRange } from "./eviction-regret.ts";
import { DEFAULT_AWAY_WEIGHT, DEFAULT_FOLLOWER_WEIGHT, DEFAULT_FOLLOWER_WEIGHT_MAX, LatencyModel } from "./latency.ts";
import { DEFAULT_PENDING, INFLIGHT_PREFIX_DEFAULT, PendingPrefixes } from "./pending.ts";
import { DEFAULT_COST, type CostModel } from "./picker.ts";
import { DEFAULT_PD_THRESHOLD_TOKENS } from "./disagg.ts";
import { DEFAULT_LORA_WEIGHT } from "./lora.ts";

/** How the candidates are chosen among: the cost model, the scraped queues, the temperature. */
export const CHOICE_OPTIONS = group("Routing: choice", {
  cost: opt.choice(
    ["latency", "weights"],
    DEFAULT_COST,
    "routing cost: latency (lowest predicted TTFT, calibrated online, plus the delay its prefill adds to the requests behind it) | weights (the cost shape's weights)",
  ),
  queueWeight: opt.number(nonNegative.default(0), "cost per scraped waiting request"),
  queueThreshold: opt.int(count.default(0), "skip workers with more waiting requests (0: off)"),
  temperature: opt.number(nonNegative.default(0), "softmax temperature (0: argmin)"),
  loraAffinityWeight: opt.number(
    nonNegative.default(DEFAULT_LORA_WEIGHT),
    "for a request naming a LoRA adapter: weight of the worker's fit for it from its vllm:lora_requests_info (running 1, room to load 0.8, queued 0.6, full 0); score shape: in score units, beside --prefix-weight and --load-weight; blocks shape and latency cost: a full worker is charged this many prefills of the request (0: off)",
  ),
});

/** The weights cost: its shape and the shape's weights. */
export const SHAPE_OPTIONS = group("Routing: cost shape", {
  costShape: opt.choice(
    ["score", "blocks"],
    DEFAULT_SHAPE.kind,
    "shape of the weights cost: score (prefix-weight x overlap share + load-weight x min-max normalised in-flight load) | blocks (prefill-load-scale x blocks to prefill + decode-load-scale x active blocks)",
  ),
  prefixWeight: opt.number(nonNegative.default(SCORE_SHAPE.prefix), "score shape: weight of the cached share of the request's blocks"),
  loadWeight: opt.number(nonNegative.default(SCORE_SHAPE.load), "score shape: weight of the normalised in-flight load"),
  loadBy: opt.choice(["requests", "blocks"], SCORE_SHAPE.loadBy, "score shape: in-flight load as requests or blocks"),
  prefixCapBlocks: opt.int(count.default(SCORE_SHAPE.prefixCapBlocks), "score shape: the cached share is of at most this many leading blocks (0: all)"),
  prefillLoadScale: opt.number(nonNegative.default(DEFAULT_WEIGHTS.prefillLoadScale), "blocks shape: cost weight of blocks to prefill"),
  decodeLoadScale: opt.number(nonNegative.default(DEFAULT_WEIGHTS.decodeLoadScale), "blocks shape: cost weight of active blocks"),
});

/** The latency cost's knobs (latency.ts, eviction-regret.ts, home.ts). */
export const LATENCY_OPTIONS = group("Routing: latency cost", {
  latencyFollowerWeight: opt.number(
    nonNegative.default(DEFAULT_FOLLOWER_WEIGHT),
    "weight of the delay a request's own prefill adds to each request queued behind it, where the caches hold their working set (0: greedy, its own TTFT alone)",
  ),
  latencyFollowerWeightMax: opt.number(
    nonNegative.default(DEFAULT_FOLLOWER_WEIGHT_MAX),
    "the follower weight where the workers recompute what they evicted; it moves from --latency-follower-weight to this with the eviction regret seen in their KV events (equal to --latency-follower-weight: a fixed weight; below it: raised to it)",
  ),
  latencyAwayWeight: opt.number(
    nonNegative.default(DEFAULT_AWAY_WEIGHT),
    "share of the request's whole prefill time added on the workers outside this replica's home share when replica-agg has peers, so replicas deciding at the same instant split near-equal workers instead of herding onto one (0: off)",
  ),
});

/** In-flight prefixes (pending.ts). */
export const PENDING_OPTIONS = group("Routing: in-flight prefixes", {
  inflightPrefix: opt.bool(
    z.boolean().default(INFLIGHT_PREFIX_DEFAULT),
    "count the blocks of requests routed to a worker and not yet ended as overlap there (the index learns them only after their prefill)",
  ),
  inflightPrefixMaxBlocks: opt.int(
    positive.default(DEFAULT_PENDING.maxBlocks),
    "most in-flight prefix blocks held, the oldest requests' leaving first (turn in-flight prefixes off with --inflight-prefix false)",
  ),
  inflightPrefixTtlMs: opt.int(count.default(DEFAULT_PENDING.ttlMs), "an in-flight prefix leaves after this long even if its request never ended"),
});

/** Prefill/decode disaggregation (disagg.ts): when a pool with prefill-role workers names one. */
export const DISAGG_OPTIONS = group("Routing: prefill/decode", {
  pdThresholdTokens: opt.int(
    count.default(DEFAULT_PD_THRESHOLD_TOKENS),
    "with prefill-role workers: name a prefill worker (x-prefiller-host-port) when the decode worker would prefill at least this many uncached tokens itself (llm-d's nonCachedTokens; 0: never)",
  ),
});

export const ROUTING_OPTIONS = { ...CHOICE_OPTIONS, ...SHAPE_OPTIONS, ...LATENCY_OPTIONS, ...PENDING_OPTIONS, ...DISAGG_OPTIONS };

/** The weights cost as the Picker reads it. */
export type ShapeSettings = { prefillLoadScale: number; decodeLoadScale: number; shape: CostShape };
/** The latency model's knobs as LatencyModel and FollowerWeight read them. */
export type LatencySettings = {
  /** From `base` where the caches hold their working set up to `max` with the eviction regret; max >= base. */
  latencyFollowerWeight: FollowerRange;
  /** The charge on a worker outside this replica's home share, in prefills of the request (home.ts). */
  awayWeight: number;
};
/** Everything routing reads: the Picker's options, the latency model's, and the in-flight prefixes'. */
export type RoutingSettings = ShapeSettings &
  LatencySettings & {
    cost: CostModel;
    queueWeight: number;
    queueThreshold: number;
    temperature: number;
    /** Weight of a rank's fit for the request's LoRA adapter (lora.ts); 0: none. */
    loraWeight: number;
    /** Off: the index's overlap alone. */
    inflightPrefix: { mode: "off" } | { mode: "on"; maxBlocks: number; ttlMs: number };
    /** Prefill/decode disaggregation's decider threshold, in uncached tokens on the decode worker (disagg.ts); 0: never. */
    pdThresholdTokens: number;
  };

export function shapeSettings(v: Values<typeof SHAPE_OPTIONS>): ShapeSettings {
  const shape: CostShape =
    v.costShape === "blocks" ? { kind: "blocks" } : { kind: "score", prefix: v.prefixWeight, load: v.loadWeight, loadBy: v.loadBy, prefixCapBlocks: v.prefixCapBlocks };
  return { prefillLoadScale: v.prefillLoadScale, decodeLoadScale: v.decodeLoadScale, shape };
}

export function latencySettings(v: Values<typeof LATENCY_OPTIONS>): LatencySettings {
  return { latencyFollowerWeight: followerRange(v.latencyFollowerWeight, v.latencyFollowerWeightMax), awayWeight: v.latencyAwayWeight };
}

export const DEFAULT_LATENCY_SETTINGS: LatencySettings = {
  latencyFollowerWeight: followerRange(DEFAULT_FOLLOWER_WEIGHT, DEFAULT_FOLLOWER_WEIGHT_MAX),
  awayWeight: DEFAULT_AWAY_WEIGHT,
};

/** The latency model a runner routes with: its settings, the follower weight moved by `regret` (from the runner's KV events). */
export function latencyModel(s: LatencySettings, regret?: EvictionRegret): LatencyModel {
  return new LatencyModel(undefined, new FollowerWeight(s.latencyFollowerWeight.base, s.latencyFollowerWeight.max, regret), s.awayWeight);
}

export function routingSettings(v: Values<typeof ROUTING_OPTIONS>): RoutingSettings {
  return {
    ...shapeSettings(v),
    ...latencySettings(v),
    cost: v.cost,
    queueWeight: v.queueWeight,
    queueThreshold: v.queueThreshold,
    temperature: v.temperature,
    loraWeight: v.loraAffinityWeight,
    inflightPrefix: v.inflightPrefix ? { mode: "on", maxBlocks: v.inflightPrefixMaxBlocks, ttlMs: v.inflightPrefixTtlMs } : { mode: "off" },
    pdThresholdTokens: v.pdThresholdTokens,
  };
}

/** A runner's in-flight prefixes as the settings say; none when they are off. */
export function pendingPrefixes(s: Pick<RoutingSettings, "inflightPrefix">): PendingPrefixes | undefined {
  const p = s.inflightPrefix;
  return p.mode === "on" ? new PendingPrefixes({ ...DEFAULT_PENDING, maxBlocks: p.maxBlocks, ttlMs: p.ttlMs }) : undefined;
}
