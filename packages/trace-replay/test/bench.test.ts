// The trace benchmark as a user runs it: a short replay of the Mooncake trace through the CLI.
import { afterAll, describe, expect, test } from "bun:test";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import type { ReportData } from "../src/report/data.ts";
import { chromiumPath, noteMissingBrowser, openReport, reportProblems } from "./report-browser.ts";

const REPO_ROOT = resolve(import.meta.dir, "../../..");
const out = mkdtempSync(join(tmpdir(), "trace-bench-"));
afterAll(() => rmSync(out, { recursive: true, force: true }));
noteMissingBrowser("bench.test.ts");

describe("bun run bench:trace", () => {
  // Default workers and capacity (8 x 32768 blocks), the first 150 requests of the trace (as many as show every assertion below; 300 took three times as long).
  test("a 150-request run writes a report with every series it claims, and both costs beat round-robin", () => {
    const r = Bun.spawnSync(
      ["bun", "run", "bench:trace", "--requests", "150", "--out", out],
      { cwd: REPO_ROOT, stdout: "pipe", stderr: "pipe" },
    );
    const stdout = r.stdout.toString();
    expect(r.exitCode, r.stderr.toString()).toBe(0);
    expect(stdout).toContain("kv-latency x2 no-agg");

    const html = readFileSync(join(out, "trace-bench.html"), "utf8");
    // Self-contained: the chart library is inlined, nothing is fetched.
    expect(html).not.toMatch(/<script[^>]+src=/);
    expect(html).toContain("echarts");
    const data = JSON.parse(/<script id="report-data" type="application\/json">(.*?)<\/script>/s.exec(html)![1]!) as ReportData;
    const labels = ["kv-aware", "kv-latency", "round-robin", "random", "least-loaded", "approx-prefix", "exact-index", "ttft-oracle", "kv-latency x2 agg", "kv-latency x2 no-agg", "kv-aware x2 agg", "kv-aware x2 no-agg", "approx-prefix x2", "kv-latency x3 agg", "kv-latency x3 no-agg", "kv-aware x3 agg", "kv-aware x3 no-agg", "approx-prefix x3"];
    expect(data.hitRate.map((s) => s.name)).toEqual(labels);
    expect(data.ttftCdf.map((s) => s.name)).toEqual(labels);
    expect(data.workerLoad.map((s) => s.name)).toEqual(labels);
    for (const s of data.hitRate) expect(s.points.some(([, y]) => y !== null && y > 0)).toBe(true);
    for (const s of data.ttftCdf) expect(s.points.at(-1)![1]).toBe(1);
    for (const run of data.workerLoad) {
      expect(run.workers.map((w) => w.name)).toEqual(Array.from({ length: 8 }, (_, i) => `worker-${i}`));
      expect(run.workers.some((w) => w.points.some(([, y]) => (y ?? 0) > 0))).toBe(true);
    }
    for (const label of labels) expect(html).toContain(`<td>${label}</td>`);
    // Every run's distance to the limits, and the bounds as rows of their own.
    expect(data.limits!.map((l) => l.name)).toEqual(labels);
    expect(data.limits!.find((l) => l.name === "ttft-oracle")!.ttftVsOracle).toBe(1);
    for (const row of ["ref: pooled LRU", "bound: pooled optimal", "bound: unbounded", "bound: TTFT p50"]) expect(html).toContain(`<td>${row}</td>`);
    // No policy passes a true bound.
    const { bounds } = JSON.parse(readFileSync(join(out, "trace-bench.json"), "utf8")) as { bounds: { pooledOptimal: number } };
    for (const l of data.limits!) {
      expect(l.hitVsBound).toBeLessThanOrEqual(1);
      expect(l.ttftVsBound).toBeGreaterThanOrEqual(1);
    }
    expect(bounds.pooledOptimal).toBeGreaterThan(0);
    expect(html).toContain('id="chart-limits"');

    const { figures } = JSON.parse(readFileSync(join(out, "trace-bench.json"), "utf8")) as {
      figures: { label: string; hitRate: number; ttftP50Ms: number; requests: number }[];
    };
    const of = (label: string) => figures.find((f) => f.label === label)!;
    expect(figures.every((f) => f.requests === 150)).toBe(true);
    // Each cost beats round-robin on what it minimises: the weights on cache hits, the latency cost on
    // TTFT (on 150 requests the caches are cold and its hits within a few tenths of a point of round-robin's).
    expect(of("kv-aware").hitRate).toBeGreaterThan(of("round-robin").hitRate);
    expect(of("kv-latency").ttftP50Ms).toBeLessThan(of("round-robin").ttftP50Ms);
    // The hit-rate chart as a PNG when a browser is there, and a reason when not.
    if (chromiumPath) expect([...readFileSync(join(out, "trace-bench.png")).subarray(1, 4)]).toEqual([0x50, 0x4e, 0x47]);
    else expect(stdout).toContain("png:    skipped (no headless chromium");
    // A loaded 2-core machine runs these 18 replays slowly.
  }, 600_000); // 235 s on a 2-core machine under a CPU hog

  test.skipIf(!chromiumPath)("the report opens in headless chromium without errors, and every series in each legend drew", async () => {
    expect(reportProblems(await openReport(join(out, "trace-bench.html")))).toEqual([]);
  }, 120_000);

  test("a bad option is refused with its name", () => {
    const r = Bun.spawnSync(["bun", "run", "bench:trace", "--workers", "zero"], { cwd: REPO_ROOT, stdout: "pipe", stderr: "pipe" });
    expect(r.exitCode).toBe(2);
    expect(r.stderr.toString()).toContain("--workers");
  }, 30_000);
});
