// @kv-epp/epp: the endpoint picker server. `bun run epp` runs src/main.ts; tests, the demo and the
// benches start it in-process through startEpp.
export { startEpp, type EppHandle } from "./main.ts";
export { parseConfig, usage, ConfigError, type EppConfig } from "./config.ts";
export { loadProtos, PROTO_DIR, EXT_PROC_SERVICE } from "./extproc/protos.ts";
export type { ProcessingRequest, ProcessingResponse } from "./extproc/messages.ts";
export { DESTINATION_HEADER, METADATA_NAMESPACE, SUBSET_NAMESPACE, SUBSET_KEY } from "./extproc/messages.ts";
// The gateway's side of ext_proc, for the demo's load generator and the cluster simulation.
export { ExtProcClient, extProcChannel, RoutingError, type ClientBodyMode, type Routed } from "./extproc/client.ts";
// The picker's decision, cost function and load tracking, for simulations that must decide exactly as
// the EPP does; the Picker itself so a simulation can check that it does.
export { cost, choose, DEFAULT_WEIGHTS, type Weights, type CandidateLoad } from "./picker/cost.ts";
export { decide, type CandidateState, type DecisionInput, type DecisionOutcome } from "./picker/decide.ts";
export { Picker, type PickerOptions, type IndexLookup, type CostModel } from "./picker/picker.ts";
export { LatencyModel, DEFAULT_LATENCY_PRIORS, type LatencyPriors, type TtftSample } from "./picker/latency.ts";
export type { Candidate } from "./workers/registry.ts";
export { ActiveLoad, sumLoad, type Lease, type LoadView } from "./picker/load.ts";
// replica-agg's sending numbering and receiving state, so a simulation runs the same rules in virtual time.
export { AggOutbox } from "./replica-agg/publisher.ts";
export { PeerLoads } from "./replica-agg/peer-loads.ts";
export { opOf, type AggMessage } from "./replica-agg/codec.ts";
