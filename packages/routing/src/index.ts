// @kv-epp/routing: the routing decision and its state, with no socket, process or flag of its own. The
// EPP runs it over its live index and workers; bench:trace's simulation runs the same code in virtual time.

// The ports a runner implements.
export { NO_METRICS, type Candidate, type Clock, type IndexLookup, type ModelIndex, type RoutingMetrics, type WorkerSignals } from "./ports.ts";
// The decision: the Picker over the ports, the pure decide() and cost it ends in, the latency model.
export { Picker, DEFAULT_COST, type CostModel, type Decision, type PickRequest, type PrefillDecision, type ScoredCandidate } from "./picker.ts";
export { decide } from "./decide.ts";
// Prefill/decode disaggregation: the pool's role sets and the decider.
export { decideDisagg, DEFAULT_PD_THRESHOLD_TOKENS, roleSets, type DisaggReason, type Disaggregation } from "./disagg.ts";
export { choose, DEFAULT_SHAPE, DEFAULT_WEIGHTS, SCORE_SHAPE, type CostShape, type Weights } from "./cost.ts";
export { LatencyModel, DEFAULT_AWAY_WEIGHT, DEFAULT_FOLLOWER_WEIGHT, DEFAULT_FOLLOWER_WEIGHT_MAX, uncachedTokens } from "./latency.ts";
export { EvictionRegret, FollowerWeight, followerRange, type FollowerRange } from "./eviction-regret.ts";
export type { ReplicaSet } from "./home.ts";
export type { LoraAdapters } from "./lora.ts";
export { EXPLAIN_REQUEST_HEADER, EXPLANATION_HEADER, explanation } from "./explain.ts";
// One request's routing life: route -> decision + lease, first byte, served by, end -> calibration.
export { RoutedRequest, type Reported, type RouteOptions, type Routing, type RoutingContext } from "./routed-request.ts";
// Load and in-flight prefixes: this replica's own, its peers', and their sum.
export { ActiveLoad, sumLoad, type Lease, type LoadTotals, type LoadView } from "./load.ts";
export { combinedPending, PendingPrefixes, DEFAULT_PENDING, INFLIGHT_PREFIX_DEFAULT, type PendingView } from "./pending.ts";
// Routing's options (schema, default, help), declared once for the EPP and bench:trace, and the settings they make.
export { CHOICE_OPTIONS, DEFAULT_LATENCY_SETTINGS, DISAGG_OPTIONS, LATENCY_OPTIONS, PENDING_OPTIONS, ROUTING_OPTIONS, SHAPE_OPTIONS, latencyModel, latencySettings, pendingPrefixes, routingSettings, shapeSettings, type LatencySettings, type RoutingSettings, type ShapeSettings } from "./options.ts";
// What the responses tell of the predictions.
export { RoutingQuality } from "./quality.ts";
export type { ReportedUsage } from "./usage-scan.ts";
// replica-agg as state and wire format (the EPP's sockets carry it; the simulation delivers it in virtual time).
export { AGG_TOPIC, AggDecodeError, decodeAggMessage, encodeAggMessage, opOf, type AggMessage, type AggOp } from "./replica-agg/codec.ts";
export { AggOutbox, deltaParts } from "./replica-agg/outbox.ts";
export { PeerLoads, type PeerStatus } from "./replica-agg/peer-loads.ts";
