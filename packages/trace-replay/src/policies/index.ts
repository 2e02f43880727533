import { approxPrefix } from "./approx-prefix.ts";
import { leastLoaded, random, roundRobin } from "./baselines.ts";
import { kvAware, kvLatency } from "./kv-aware.ts";
import { exactIndex } from "./exact-index.ts";
import { ttftOracle } from "./ttft-oracle.ts";
import type { PolicyName, PolicySpec } from "./types.ts";

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
export { POLICY_NAMES, type PolicyName, type PolicySpec, type Router, type ReplicaContext } from "./types.ts";
