// @kv-epp/epp: the endpoint picker server. `bun run epp` runs src/main.ts; other packages' tests start
// it in-process through startEpp. The routing decision itself is @kv-epp/routing's.
export { startEpp, type EppHandle } from "./main.ts";
export { parseConfig } from "./config.ts";
// The gateway's side of ext_proc, for the demo's gateway and the cluster simulation's.
export { loadProtos } from "./extproc/protos.ts";
export type { ProcessingRequest } from "./extproc/messages.ts";
export { DESTINATION_HEADER, METADATA_NAMESPACE } from "./extproc/messages.ts";
export { ExtProcClient, extProcChannel, RoutingError, type ClientBodyMode } from "./extproc/client.ts";
