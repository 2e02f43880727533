// deploy/overlays/pd: the P/D pool's manifests render (the testkit's renderer, and kubectl where it
// exists, agreeing), label each pod with its llm-d role, put the sidecar on the pool's target port of
// every decode pod, and pass flags the programs accept.
import { describe, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { parseConfig as parseWorkerConfig } from "@kv-epp/mock-worker";
import { renderKustomization, renderWithKubectl, type KubeObject } from "@kv-epp/testkit";
import { parseConfig as parseSidecarConfig } from "../src/index.ts";

const DEPLOY = join(import.meta.dir, "..", "..", "..", "deploy");
type Container = { name: string; command?: string[]; args?: string[]; env?: { name: string; value?: string }[]; ports?: { name?: string; containerPort: number }[] };
type Deployment = KubeObject & { spec: { selector: { matchLabels: Record<string, string> }; template: { metadata: { labels: Record<string, string> }; spec: { containers: Container[] } } } };
type Pool = KubeObject & { spec: { selector: { matchLabels: Record<string, string> }; targetPorts: { number: number }[] } };

const objs = renderKustomization(join(DEPLOY, "overlays", "pd"));
const deployment = (name: string) => {
  const d = objs.find((o) => o.kind === "Deployment" && o.metadata?.name === name) as Deployment | undefined;
  if (!d) throw new Error(`Deployment/${name} missing`);
  return d;
};
const container = (d: Deployment, name: string) => d.spec.template.spec.containers.find((c) => c.name === name)!;
const envOf = (c: Container) => Object.fromEntries((c.env ?? []).filter((e) => e.value !== undefined).map((e) => [e.name, e.value]));

describe("deploy/overlays/pd", () => {
  test("renders as kubectl renders it", () => {
    const kubectl = renderWithKubectl(join(DEPLOY, "overlays", "pd"));
    if (kubectl === null) return; // no kubectl here: the testkit's renderer alone
    const key = (o: KubeObject) => `${o.kind}/${o.metadata?.name}`;
    expect(kubectl.map(key).sort()).toEqual(objs.map(key).sort());
  });

  test("replaces the base's workers with prefill and decode pods, each labelled with its llm-d role", () => {
    expect(objs.some((o) => o.metadata?.name === "vllm-mock")).toBe(false);
    const pool = objs.find((o) => o.kind === "InferencePool") as Pool;
    expect(pool.spec.targetPorts).toEqual([{ number: 8000 }]);
    for (const [name, role] of [["vllm-prefill", "prefill"], ["vllm-decode", "decode"]] as const) {
      const d = deployment(name);
      expect(d.spec.template.metadata.labels["llm-d.ai/role"]).toBe(role);
      expect(d.spec.selector.matchLabels["llm-d.ai/role"]).toBe(role);
      // Both are pods of the one pool: the EPP tells their roles apart by the label.
      for (const [k, v] of Object.entries(pool.spec.selector.matchLabels)) expect(d.spec.template.metadata.labels[k]).toBe(v);
      const worker = container(d, "vllm");
      const cfg = parseWorkerConfig(worker.args!, envOf(worker));
      expect(cfg.role).toBe(role);
    }
  });

  test("a decode pod serves the pool's target port with the sidecar, in front of its worker", () => {
    const d = deployment("vllm-decode");
    const sidecar = container(d, "pd-sidecar");
    expect(sidecar.command).toEqual(["pd-sidecar"]);
    expect(sidecar.ports).toEqual([{ name: "http", containerPort: 8000 }]);
    const worker = parseWorkerConfig(container(d, "vllm").args!, envOf(container(d, "vllm")));
    expect(parseSidecarConfig(sidecar.args!)).toMatchObject({ port: 8000, decoder: `http://127.0.0.1:${worker.port}` });
    expect(worker.port).not.toBe(8000);
    // A prefill pod is called directly by the sidecars: its worker is on the target port.
    expect(parseWorkerConfig(container(deployment("vllm-prefill"), "vllm").args!).port).toBe(8000);
  });

  test("the image has the sidecar's entry point", () => {
    const dockerfile = readFileSync(join(DEPLOY, "Dockerfile"), "utf8");
    expect(dockerfile).toContain("/usr/local/bin/pd-sidecar");
    expect(dockerfile).toContain("--filter @kv-epp/pd-sidecar");
  });
});
