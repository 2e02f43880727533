// One flag chooses the backend for a process: `--discovery kubernetes` (Leases in POD_NAMESPACE, owned
// by POD_NAME/POD_UID) or `--discovery http://HOST:PORT` (an HTTP-served in-memory store).
import type { KubeConfig } from "@kubernetes/client-node";
import type { Logger } from "pino";
import { connectHttpDiscovery } from "./http.ts";
import type { Discovery } from "./types.ts";

export type DiscoveryConfig =
  | { kind: "kubernetes"; namespace: string; pod?: { name: string; uid: string } }
  | { kind: "http"; url: string };

/** Parses the flag's value at the edge; the error names the value. */
export function parseDiscoveryConfig(value: string, env: Record<string, string | undefined>): DiscoveryConfig {
  if (value === "kubernetes") {
    const name = env.POD_NAME;
    const uid = env.POD_UID;
    return { kind: "kubernetes", namespace: env.POD_NAMESPACE || "default", ...(name && uid ? { pod: { name, uid } } : {}) };
  }
  if (/^https?:\/\/[^\s/]+\/?$/.test(value)) return { kind: "http", url: value };
  throw new Error(`invalid discovery ${JSON.stringify(value)} (expected "kubernetes" or http://HOST:PORT)`);
}

export async function openDiscovery(cfg: DiscoveryConfig, o: { kubeConfig?: KubeConfig; producer?: string; log?: Logger } = {}): Promise<Discovery> {
  if (cfg.kind === "http") return connectHttpDiscovery({ url: cfg.url, producer: o.producer, log: o.log });
  // Loaded only when chosen: a process on the HTTP store never loads @kubernetes/client-node.
  const [{ kubernetesDiscovery }, { defaultKubeConfig }] = await Promise.all([import("./kubernetes.ts"), import("@kv-epp/kube")]);
  return kubernetesDiscovery({ kubeConfig: o.kubeConfig ?? defaultKubeConfig(), namespace: cfg.namespace, pod: cfg.pod, producer: o.producer, log: o.log });
}
