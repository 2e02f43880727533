import { KubeConfig } from "@kubernetes/client-node";

/** The process's client configuration: KUBECONFIG, ~/.kube/config, or the in-cluster service account. */
export function defaultKubeConfig(): KubeConfig {
  const kc = new KubeConfig();
  kc.loadFromDefault();
  return kc;
}
