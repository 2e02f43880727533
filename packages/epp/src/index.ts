// @kv-epp/epp: the endpoint picker server. `bun run epp` runs src/main.ts; tests, the demo and the
// benches start it in-process through startEpp.
export { startEpp, type EppHandle } from "./main.ts";
export { parseConfig, usage, ConfigError, type EppConfig } from "./config.ts";
// The gateway's side of ext_proc, for the demo's load generator and the cluster simulation.
export { loadProtos } from "./extproc/protos.ts";
export type { ProcessingRequest } from "./extproc/messages.ts";
export { DESTINATION_HEADER, METADATA_NAMESPACE } from "./extproc/messages.ts";
export { ExtProcClient, extProcChannel, RoutingError, type ClientBodyMode, type Routed } from "./extproc/client.ts";
// The rules a simulation must share to decide as the EPP does: the decision (decide, and the choice
// it ends in), its weights and latency model, and load as the picker counts it; the Picker itself so
// the simulation can check that its policy and the EPP choose alike.
export { decide, overlapOf, prefillBlocksOf, ttftInput, type CandidateState, type DecisionInput, type DecisionOutcome } from "./picker/decide.ts";
export { choose, DEFAULT_SHAPE, DEFAULT_WEIGHTS, SCORE_SHAPE, type Weights, type CostShape } from "./picker/cost.ts";
export { Picker, DEFAULT_COST, type CostModel } from "./picker/picker.ts";
export { LatencyModel, DEFAULT_AWAY_WEIGHT, DEFAULT_FOLLOWER_WEIGHT, DEFAULT_FOLLOWER_WEIGHT_MAX, uncachedTokens, type TtftInput } from "./picker/latency.ts";
export { EvictionRegret, FollowerWeight, followerRange, type FollowerRange } from "./picker/eviction-regret.ts";
export { AwayWorkers, type ReplicaSet } from "./picker/home.ts";
export type { Candidate } from "./workers/registry.ts";
export { ActiveLoad, sumLoad, type Lease, type LoadView } from "./picker/load.ts";
export { combinedPending, PendingPrefixes, prefixKeys, DEFAULT_PENDING, INFLIGHT_PREFIX_DEFAULT, type PendingView, type PrefixKeys } from "./picker/pending.ts";
// replica-agg's sending numbering and receiving state, so a simulation runs the same rules in virtual time.
export { AggOutbox } from "./replica-agg/publisher.ts";
export { PeerLoads } from "./replica-agg/peer-loads.ts";
export { opOf, type AggMessage } from "./replica-agg/codec.ts";
