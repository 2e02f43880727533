// The one place this package takes the simulation's pieces from its sibling packages.
export { PrefixCacheSim, StepScheduler, DEFAULT_TIMING, idleTtftMs, chainBlockIds, type CacheEvent, type Lease, type TimingParams } from "@kv-epp/mock-worker";
export { choose, decide, overlapOf, prefillBlocksOf, ttftInput, LatencyModel, EvictionRegret, FollowerWeight, followerRange, type FollowerRange, DEFAULT_COST, DEFAULT_FOLLOWER_WEIGHT, DEFAULT_FOLLOWER_WEIGHT_MAX, uncachedTokens, type TtftInput, type CostModel, DEFAULT_WEIGHTS, DEFAULT_SHAPE, SCORE_SHAPE, type Weights, type CostShape, ActiveLoad, type Lease as LoadLease, type LoadView, sumLoad } from "@kv-epp/routing";
export { combinedPending, PendingPrefixes, prefixKeys, DEFAULT_PENDING, INFLIGHT_PREFIX_DEFAULT, type PendingView, type PrefixKeys } from "@kv-epp/routing";
export { AggOutbox, PeerLoads, opOf, type AggMessage } from "@kv-epp/routing";
export { AwayWorkers, DEFAULT_AWAY_WEIGHT, type ReplicaSet } from "@kv-epp/routing";
