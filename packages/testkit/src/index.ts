// @kv-epp/testkit: shared fixtures for process-level tests (fake Kubernetes API server, child
// processes, waiting, ports, a simulated cluster, hostile peers). It imports only @kv-epp/protocol: the packages
// it serves import it, never the other way.
export { startFakeKubeApi, ADMIN_USER, type FakeKubeApi, type FakeKubeApiOptions, type RequestRecord } from "./kube/server.ts";
export type { KubeObject, KubeMeta } from "./kube/resources.ts";
export { parseLabelSelector, parseFieldSelector } from "./kube/selectors.ts";
export { spawnProcess, spawnBun, killAll, type ProcessHandle, type SpawnOptions } from "./process.ts";
export { waitFor, type WaitOptions } from "./wait.ts";
export { tempDir } from "./temp-dir.ts";
export { freePort, heldPorts } from "./net.ts";
export { LOOPBACK, LOOPBACK_PATTERN } from "./loopback.ts";
export { TcpProxy } from "./tcp-proxy.ts";
export { freshWords, mulberry32, seededRandom } from "./prng.ts";
export { renderKustomization, renderWithKubectl, rbacAuthorizer, rbacAuthorizerFor } from "./kustomize.ts";
export { SimCluster, POD_INHERITED_ENV, type SimClusterOptions, type SimPodSpec, type SimService, type PodIdentity, type Probe } from "./cluster/sim.ts";
export { HealthProbe, healthServiceDefinition, type HealthCheckRequest, type ServingStatus, type ProbeResult } from "./cluster/grpc-health.ts";
export { SimDeployment, type SimDeploymentOptions } from "./cluster/deployment.ts";
export { podSpecFromTemplate, simDeploymentFromManifest, simServiceFromManifest, type ManifestRuntime, type PodTemplate, type ContainerSpec } from "./cluster/manifest.ts";
export { hostileDumpPeer, type HostileDump, type HostilePeer } from "./hostile-peers.ts";
export { processMemory } from "./proc-memory.ts";
