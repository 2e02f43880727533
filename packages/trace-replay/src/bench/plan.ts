// Which replays one benchmark run makes, and with which simulation options.
import { DEFAULT_TIMING } from "@kv-epp/mock-worker";
import { POLICIES, type PolicyName } from "../policies/index.ts";
import type { ReplayOptions } from "../sim/replay.ts";
import type { TraceRecord } from "../trace.ts";
import type { BenchOptions } from "./options.ts";

export type RunSpec = { policy: PolicyName; replicas: number; replicaAgg: boolean };

/** Every policy with one router; then the replica policies with N routers, with and/or without replica-agg. */
export function planRuns(o: BenchOptions): RunSpec[] {
  const runs: RunSpec[] = o.policies.map((policy) => ({ policy, replicas: 1, replicaAgg: true }));
  for (const replicas of o.replicas) {
    for (const policy of o.replicaPolicies) {
      const aggModes = !POLICIES[policy].usesRouterLoad ? [true] : o.replicaAgg === "both" ? [true, false] : [o.replicaAgg === "on"];
      for (const replicaAgg of aggModes) runs.push({ policy, replicas, replicaAgg });
    }
  }
  return runs;
}

/** Series buckets: about 60 over the replayed span, in whole seconds. */
export function bucketMsFor(trace: readonly TraceRecord[], timeScale: number): number {
  const span = trace.length > 1 ? (trace[trace.length - 1]!.timestamp - trace[0]!.timestamp) / timeScale : 0;
  return Math.max(1000, Math.ceil(span / 60 / 1000) * 1000);
}

export function replayOptions(o: BenchOptions, run: RunSpec, bucketMs: number): ReplayOptions {
  return {
    workers: o.workers,
    capacityBlocks: o.capacityBlocks,
    blockSize: o.blockSize,
    timeScale: o.timeScale,
    arrivals: o.arrivals,
    replicas: run.replicas,
    replicaAgg: run.replicaAgg,
    agg: o.agg,
    eventLagMs: o.eventLagMs,
    inflightPrefix: o.inflightPrefix,
    reset: o.reset,
    loraAdapters: o.loraAdapters,
    seed: o.seed,
    timing: { ...DEFAULT_TIMING, maxNumSeqs: o.maxNumSeqs, maxNumBatchedTokens: o.maxNumBatchedTokens },
    latency: o.latency,
    weights: { prefillLoadScale: o.prefillLoadScale, decodeLoadScale: o.decodeLoadScale, queueWeight: 0, temperature: 0, shape: o.costShape },
    bucketMs,
  };
}
