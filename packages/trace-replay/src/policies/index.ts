import { approxPrefix } from "./approx-prefix.ts";
import { leastLoaded, random, roundRobin } from "./baselines.ts";
import { kvAware, kvLatency } from "./kv-aware.ts";
import { exactIndex } from "./exact-index.ts";
import { ttftOracle } from "./ttft-oracle.ts";
import type { PolicyName, PolicySpec } from "./types.ts";
import { DEFAULT_COST } from "@kv-epp/routing";

export const POLICIES: Record<PolicyName, PolicySpec> = {
  "kv-aware": kvAware,
  "kv-latency": kvLatency,
  "round-robin": roundRobin,
  random,
  "least-loaded": leastLoaded,
  "approx-prefix": approxPrefix,
  "exact-index": exactIndex,
  "ttft-oracle": ttftOracle,
};
/** The policy that decides as the EPP does by default (its --cost). */
export const DEFAULT_POLICY: PolicyName = DEFAULT_COST === "latency" ? "kv-latency" : "kv-aware";
export { POLICY_NAMES, type PolicyName, type PolicySpec, type Router, type ReplicaContext } from "./types.ts";
