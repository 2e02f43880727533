// deploy/overlays/pd: the P/D pool's manifests render (the testkit's renderer, and kubectl where it
// exists, agreeing), label each pod with its llm-d role, put the sidecar on the pool's target port of
// every decode pod, pass flags the programs accept, and have the sidecar's metrics scraped;
// deploy/overlays/pd-monitoring adds the monitoring kit to that pool.
import { describe, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { parseConfig as parseWorkerConfig } from "@kv-epp/mock-worker";
import { renderKustomization, renderWithKubectl, type KubeObject } from "@kv-epp/testkit";
import { parseConfig as parseSidecarConfig } from "../src/index.ts";

const DEPLOY = join(import.meta.dir, "..", "..", "..", "deploy");
type Container = { name: string; command?: string[]; args?: string[]; env?: { name: string; value?: string }[]; ports?: { name?: string; containerPort: number }[] };
type Deployment = KubeObject & {
  spec: { selector: { matchLabels: Record<string, string> }; template: { metadata: { labels: Record<string, string>; annotations?: Record<string, string> }; spec: { containers: Container[] } } };
};
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

  test("a decode pod is scraped as the EPP's pods are, at the sidecar's own metrics", () => {
    const sidecar = container(deployment("vllm-decode"), "pd-sidecar");
    const annotations = deployment("vllm-decode").spec.template.metadata.annotations ?? {};
    // The same annotation-driven discovery as deploy/base's EPP pods.
    const epp = renderKustomization(join(DEPLOY, "base")).find((o) => o.kind === "Deployment" && o.metadata?.name === "dynamo-epp") as Deployment;
    expect(epp.spec.template.metadata.annotations?.["prometheus.io/scrape"]).toBe("true");
    expect(annotations["prometheus.io/scrape"]).toBe("true");
    // The sidecar's port (its /metrics is the worker's, passed through): the sidecar serves its own under this path.
    expect(Number(annotations["prometheus.io/port"])).toBe(parseSidecarConfig(sidecar.args!).port);
    expect(sidecar.ports!.map((p) => p.containerPort)).toContain(Number(annotations["prometheus.io/port"]));
    expect(annotations["prometheus.io/path"]).toBe("/sidecar/metrics");
  });

  test("the image has the sidecar's entry point", () => {
    const dockerfile = readFileSync(join(DEPLOY, "Dockerfile"), "utf8");
    expect(dockerfile).toContain("/usr/local/bin/pd-sidecar");
    expect(dockerfile).toContain("--filter @kv-epp/pd-sidecar");
  });
});

describe("deploy/overlays/pd-monitoring", () => {
  const dir = join(DEPLOY, "overlays", "pd-monitoring");
  const withKit = renderKustomization(dir);
  const key = (o: KubeObject) => `${o.kind}/${o.metadata?.namespace}/${o.metadata?.name}`;

  test("is the P/D pool plus the monitoring kit (its alerts and dashboard), with no base workers back", () => {
    const kit = renderKustomization(join(DEPLOY, "overlays", "monitoring", "kit"));
    expect(kit.map((o) => o.kind).sort()).toEqual(["ConfigMap", "PrometheusRule"]);
    expect(withKit.map(key).sort()).toEqual([...objs, ...kit].map(key).sort());
    expect(withKit.some((o) => o.metadata?.name === "vllm-mock")).toBe(false);
  });

  test("renders as kubectl renders it", () => {
    const kubectl = renderWithKubectl(dir);
    if (kubectl === null) return; // no kubectl here: the testkit's renderer alone
    expect(kubectl.map(key).sort()).toEqual(withKit.map(key).sort());
  });
});
