// @kv-epp/epp: the endpoint picker server. `bun run epp` runs src/main.ts; tests, the demo and the
// benches start it in-process through startEpp.
export { startEpp, type EppHandle } from "./main.ts";
export { parseConfig, usage, ConfigError, type EppConfig } from "./config.ts";
// The gateway's side of ext_proc, for the demo's load generator and the cluster simulation.
export { loadProtos } from "./extproc/protos.ts";
export type { ProcessingRequest } from "./extproc/messages.ts";
export { DESTINATION_HEADER, METADATA_NAMESPACE } from "./extproc/messages.ts";
export { ExtProcClient, extProcChannel, RoutingError, type ClientBodyMode, type Routed } from "./extproc/client.ts";
