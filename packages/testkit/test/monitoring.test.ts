// deploy/overlays/monitoring: the alert rules pass `promtool test rules` (kit/rules.test.yaml), every metric
// the rules and the Grafana dashboard query is one a real EPP process exports on /metrics (its own and llm-d's
// names) or a real P/D sidecar process on /sidecar/metrics, and every tokenization metric the EPP exports, llm-d's
// token, per-token latency and load-spread series, and every metric of the sidecar's are charted.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import YAML from "yaml";
import { freePort, renderKustomization, spawnBun, tempDir, waitFor, type KubeObject, type ProcessHandle, LOOPBACK } from "../src/index.ts";

const REPO = join(import.meta.dir, "..", "..", "..");
const OVERLAY = join(REPO, "deploy", "overlays", "monitoring");
/** The kit itself (rules, their unit tests, the dashboard), a kustomization other overlays add too. */
const KIT = join(OVERLAY, "kit");
const objects = renderKustomization(OVERLAY);
const rule = objects.find((o) => o.kind === "PrometheusRule") as KubeObject & { spec: { groups: { rules: { alert?: string; expr: string }[] }[] } };
const configMap = objects.find((o) => o.kind === "ConfigMap" && o.metadata?.name === "dynamo-epp-dashboard") as KubeObject & { data: Record<string, string> };
const promtool = Bun.which("promtool");
if (!promtool) console.warn("monitoring.test.ts: promtool not found (Debian: apt-get install prometheus); the rule unit tests are SKIPPED");

type Panel = { title: string; targets?: { expr: string }[]; panels?: Panel[] };
const dashboard = JSON.parse(readFileSync(join(KIT, "dashboard.json"), "utf8")) as { panels: Panel[] };
const panelExprs = dashboard.panels.flatMap((p) => [p, ...(p.panels ?? [])]).flatMap((p) => (p.targets ?? []).map((t) => ({ where: `panel "${p.title}"`, expr: t.expr })));
const ruleExprs = rule.spec.groups.flatMap((g) => g.rules.map((r) => ({ where: `alert ${r.alert}`, expr: r.expr })));

describe("the monitoring overlay", () => {
  test("renders base plus a PrometheusRule and the dashboard ConfigMap (Grafana sidecar label), in kv-epp", () => {
    expect(rule?.metadata?.namespace).toBe("kv-epp");
    expect(configMap?.metadata?.namespace).toBe("kv-epp");
    expect(configMap.metadata?.labels?.grafana_dashboard).toBe("1");
    expect(JSON.parse(configMap.data["dynamo-epp.json"]!)).toEqual(dashboard);
    expect(objects.some((o) => o.kind === "Deployment" && o.metadata?.name === "dynamo-epp")).toBe(true);
    expect(panelExprs.length).toBeGreaterThan(10);
  });

  test.skipIf(!promtool)("the alert rules pass promtool check rules and promtool test rules (rules.test.yaml)", () => {
    const dir = tempDir("epp-rules-");
    writeFileSync(join(dir, "rules.yaml"), YAML.stringify({ groups: rule.spec.groups }));
    writeFileSync(join(dir, "rules.test.yaml"), readFileSync(join(KIT, "rules.test.yaml")));
    for (const args of [["check", "rules", "rules.yaml"], ["test", "rules", "rules.test.yaml"]]) {
      const r = Bun.spawnSync([promtool!, ...args], { cwd: dir, stdout: "pipe", stderr: "pipe" });
      expect({ args: args.join(" "), exit: r.exitCode, out: r.exitCode === 0 ? "" : `${r.stdout}${r.stderr}` }).toEqual({ args: args.join(" "), exit: 0, out: "" });
    }
    // Every alert the rules define has a unit test.
    const tested = new Set([...readFileSync(join(KIT, "rules.test.yaml"), "utf8").matchAll(/alertname: (\w+)/g)].map((m) => m[1]));
    expect(ruleExprs.map((r) => r.where.replace("alert ", "")).filter((a) => !tested.has(a))).toEqual([]);
  });
});

/** A metric of the EPP's: its own, or one of llm-d's it writes under llm-d's name (packages/epp/src/llmd-metrics.ts). */
const EPP_METRIC = /\b(?:dynamo_epp|llm_d_epp)_[a-z0-9_]+/g;

/** The cgroup's CPU throttling counters (cpuThrottlingMetrics in packages/epp/src/metrics.ts). */
const THROTTLING = ["dynamo_epp_cpu_throttled_seconds_total", "dynamo_epp_cpu_throttled_periods_total"];

describe("against a live EPP process's /metrics", () => {
  const HOST = `${LOOPBACK}.4.240`;
  let epp: ProcessHandle;
  let exported: Map<string, string>;
  beforeAll(async () => {
    const dir = tempDir("epp-monitoring-");
    writeFileSync(join(dir, "epp.yaml"), YAML.stringify({ model: "m", blockSize: 16, workers: [{ id: "w", address: `${HOST}:8000`, kvEvents: `tcp://${HOST}:1` }] }));
    const metricsPort = await freePort(HOST);
    epp = spawnBun(
      [join(REPO, "packages", "epp", "src", "main.ts"), "--config", join(dir, "epp.yaml"), "--listen", HOST, "--grpc-port", "0", "--grpc-health-port", "0",
        "--metrics-port", String(metricsPort), "--replica-agg-port", "0", "--selection-port", "0", "--scrape-interval-ms", "0", "--subscribe-wait-ms", "0"],
      {},
      { name: "epp" },
    );
    await epp.waitForLog(/ready with an EMPTY KV index/, { timeoutMs: 30_000 });
    const text = await (await fetch(`http://${HOST}:${metricsPort}/metrics`)).text();
    exported = new Map([...text.matchAll(/^# TYPE (\S+) (\S+)$/gm)].map((m) => [m[1]!, m[2]!]));
  });
  afterAll(() => epp?.kill("SIGTERM", 3000));

  /**
   * The series names an expression queries; a histogram's _bucket/_sum/_count count as the histogram. The throttling
   * counters may be absent here: the EPP exports them only where its cgroup's cpu.stat tells throttling.
   */
  const missing = (expr: string) =>
    [...expr.matchAll(EPP_METRIC)]
      .map((m) => m[0])
      .filter((n) => !exported.has(n) && exported.get(n.replace(/_(bucket|sum|count)$/, "")) !== "histogram")
      .filter((n) => !(THROTTLING.includes(n) && !exported.has(THROTTLING[0]!)));

  test("every expression of the rules and the dashboard names only metrics the EPP exports", () => {
    expect(exported.size).toBeGreaterThan(40);
    const bad = [...ruleExprs, ...panelExprs].map((e) => ({ ...e, missing: missing(e.expr) })).filter((e) => e.missing.length > 0);
    expect(bad).toEqual([]);
    // And each queries at least one metric of the EPP's or the P/D sidecar's (nothing from another exporter the kit does not install).
    expect([...ruleExprs, ...panelExprs].filter((e) => !/\b(?:dynamo_epp|llm_d_epp|pd_sidecar)_/.test(e.expr)).map((e) => e.where)).toEqual([]);
    expect([...ruleExprs, ...panelExprs].filter((e) => /\b(kube_|vllm:|up\b)/.test(e.expr)).map((e) => e.where)).toEqual([]);
  });

  test("every tokenization metric the EPP exports (the pool's, its members' segment caches, the decision thread's lag, body reads, the cgroup's CPU throttling) has a panel", () => {
    const charted = new Set(panelExprs.flatMap((e) => [...e.expr.matchAll(EPP_METRIC)].map((m) => m[0].replace(/_(bucket|sum|count)$/, ""))));
    const tokenization = [...exported.keys()].filter((n) => /^dynamo_epp_(tokenizer_|cpu_throttled_|event_loop_lag_seconds$|ext_proc_bodies_read_total$)/.test(n));
    expect(tokenization).toContain("dynamo_epp_tokenizer_pool_placements_total");
    expect(tokenization.filter((n) => !charted.has(n))).toEqual([]);
    // The throttling counters are charted even where this host's cgroup does not export them, and are all of them where it does.
    expect(THROTTLING.filter((n) => !charted.has(n))).toEqual([]);
    if (exported.has(THROTTLING[0]!)) expect([...exported.keys()].filter((n) => n.startsWith("dynamo_epp_cpu_throttled_")).sort()).toEqual([...THROTTLING].sort());
  });

  test("llm-d's token histograms, times per output token and load spreads the EPP exports are charted", () => {
    const charted = new Set(panelExprs.flatMap((e) => [...e.expr.matchAll(EPP_METRIC)].map((m) => m[0].replace(/_(bucket|sum|count)$/, ""))));
    const llmd = [...exported.keys()].filter((n) => /^llm_d_epp_(request_\w+_tokens|request_ntpot_seconds|request_streaming_\w+|std_dev_\w+)$/.test(n));
    expect(llmd.sort()).toEqual([
      "llm_d_epp_request_cached_tokens", "llm_d_epp_request_input_tokens", "llm_d_epp_request_ntpot_seconds", "llm_d_epp_request_output_tokens",
      "llm_d_epp_request_streaming_itl_seconds", "llm_d_epp_request_streaming_tpot_seconds",
      "llm_d_epp_std_dev_kv_cache_utilization", "llm_d_epp_std_dev_queue_size", "llm_d_epp_std_dev_running_requests",
    ]);
    expect(llmd.filter((n) => !charted.has(n))).toEqual([]);
  });
});

/** A metric of the P/D sidecar's (packages/pd-sidecar/src/metrics.ts), scraped from the decode pods of deploy/overlays/pd. */
const SIDECAR_METRIC = /\bpd_sidecar_[a-z0-9_]+/g;

describe("against a live P/D sidecar process's /sidecar/metrics", () => {
  const HOST = `${LOOPBACK}.4.241`;
  let sidecar: ProcessHandle;
  let exported: Map<string, string>;
  beforeAll(async () => {
    // Its decode worker need not run: /sidecar/metrics is the sidecar's own, and every metric is declared at start.
    const port = await freePort(HOST);
    sidecar = spawnBun(
      [join(REPO, "packages", "pd-sidecar", "src", "main.ts"), "--listen", HOST, "--port", String(port), "--decoder", `http://${HOST}:1`],
      { PD_SIDECAR_LOG_LEVEL: "silent" },
      { name: "pd-sidecar" },
    );
    const url = `http://${HOST}:${port}/sidecar/metrics`;
    const text = await waitFor(() => fetch(url).then((r) => (r.ok ? r.text() : null), () => null), { message: `${url} up` });
    exported = new Map([...text.matchAll(/^# TYPE (\S+) (\S+)$/gm)].map((m) => [m[1]!, m[2]!]));
  });
  afterAll(() => sidecar?.kill("SIGTERM", 3000));

  const names = (expr: string) => [...expr.matchAll(SIDECAR_METRIC)].map((m) => m[0]);
  const known = (n: string) => exported.has(n) || exported.get(n.replace(/_(bucket|sum|count)$/, "")) === "histogram";

  test("every sidecar metric the rules and the dashboard name is one it exports", () => {
    expect(exported.size).toBeGreaterThan(4);
    const bad = [...ruleExprs, ...panelExprs].map((e) => ({ ...e, missing: names(e.expr).filter((n) => !known(n)) })).filter((e) => e.missing.length > 0);
    expect(bad).toEqual([]);
  });

  test("every metric the sidecar exports has a panel, and its prefill failures an alert", () => {
    const charted = new Set(panelExprs.flatMap((e) => names(e.expr).map((n) => n.replace(/_(bucket|sum|count)$/, ""))));
    expect([...exported.keys()].filter((n) => !charted.has(n))).toEqual([]);
    expect(ruleExprs.filter((e) => names(e.expr).includes("pd_sidecar_failures_total")).map((e) => e.where)).toEqual(["alert PdSidecarPrefillFailing"]);
  });
});
