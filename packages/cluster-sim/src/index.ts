// @kv-epp/cluster-sim: deploy/base running in the testkit's cluster simulation (real EPP and mock
// worker processes, the fake API server, kubelet and EndpointSlice controller), plus the gateway's
// side of a request and the observations the validation scenario makes. Its own package because it
// depends on the EPP (protos) and on the testkit, which the EPP's tests depend on.
export { SimulatedCluster, tearDown, REPO_ROOT, type SimulatedClusterOptions } from "./cluster.ts";
export { Gateway, type Routed } from "./gateway.ts";
export { blockFacts, dumpEvents, eppLoad, eppWorkers, logMessages, logRecords, recoveryState, workerCachedBlocks, type EppLoad, type EppWorker, type LogRecord, type RecoveryStateName } from "./observe.ts";
export { hostLease, intentLeases, loggedAttachments, type HostLease, type IntentLease, type OwnerRef } from "./intents.ts";
export { ReadyEndpointsWatch } from "./slices.ts";
