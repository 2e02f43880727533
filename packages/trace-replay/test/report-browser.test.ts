// The browser check itself: it must see a series that drew nothing, and a page that logs an error.
import { afterAll, describe, expect, test } from "bun:test";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { renderReport } from "../src/report/html.ts";
import type { ReportData } from "../src/report/data.ts";
import { chromiumPath, noteMissingBrowser, openReport, reportProblems } from "./report-browser.ts";

const dir = mkdtempSync(join(tmpdir(), "report-browser-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
noteMissingBrowser("report-browser.test.ts");

const data: ReportData = {
  title: "t",
  subtitle: "s",
  facts: [],
  table: { columns: ["a"], rows: [["1"]] },
  timeAxis: "s",
  hitRate: [
    { name: "drawn", points: [[0, 0.1], [5, 0.3], [10, 0.2]] },
    { name: "one value", points: [[0, null], [5, 0.4], [10, null]] },
    { name: "empty", points: [] },
  ],
  ttftAxis: "ms",
  ttftCdf: [{ name: "drawn", points: [[10, 0], [20, 0.5], [40, 1]] }],
  workerLoad: [{ name: "run", workers: [{ name: "w0", points: [[0, 1], [5, 3]] }] }],
};

describe.skipIf(!chromiumPath)("a report in headless chromium", () => {
  test("a legend series without points is reported as drawing nothing; the others drew, one of a single value too", async () => {
    const path = join(dir, "r.html");
    writeFileSync(path, renderReport(data));
    const seen = await openReport(path);
    expect(seen.charts.map((c) => c.id)).toEqual(["chart-hit", "chart-ttft", "chart-load-0"]);
    expect(reportProblems(seen)).toEqual(['chart-hit: series "empty" drew nothing']);
  }, 60_000);

  test("the comparison chart draws each run's bars in both panels; a run without figures draws nothing there", async () => {
    const runs = [
      { name: "round-robin, simulated", hitRate: 0.066, ttftP50Ms: 4400, ttftP99Ms: 19700 },
      { name: "kv-epp, simulated", hitRate: 0, ttftP50Ms: 2900, ttftP99Ms: 8300 },
      { name: "kv-epp, live run", hitRate: 0.143, ttftP50Ms: 4700, ttftP99Ms: 14800 },
      { name: "no figures", hitRate: Number.NaN, ttftP50Ms: Number.NaN, ttftP99Ms: Number.NaN },
    ];
    const path = join(dir, "compare.html");
    writeFileSync(path, renderReport({ ...data, hitRate: [data.hitRate[0]!], comparison: { title: "compared", note: "n", runs } }));
    const seen = await openReport(path);
    expect(seen.charts.map((c) => c.id)).toEqual(["chart-compare", "chart-hit", "chart-ttft", "chart-load-0"]);
    const compare = seen.charts[0]!;
    expect(compare.series.map((x) => x.name)).toEqual(runs.map((r) => r.name));
    // Both panels of each run with figures, a 0% hit rate included (a sliver, labelled 0.0%).
    for (const x of compare.series.slice(0, 3)) expect([x.name, x.perGrid.length, x.perGrid.every((n) => n > 0)]).toEqual([x.name, 2, true]);
    expect(compare.series[3]!.pixels).toBe(0);
    expect(reportProblems(seen)).toEqual(['chart-compare: series "no figures" drew nothing']);
    // The PNG source: the comparison alone.
    const main = join(dir, "compare-main.html");
    writeFileSync(main, renderReport({ ...data, comparison: { title: "compared", note: "n", runs: runs.slice(0, 3) } }, { only: "main" }));
    const alone = await openReport(main);
    expect(alone.charts.map((c) => [c.id, c.series.length])).toEqual([["chart-compare", 3]]);
    expect(reportProblems(alone)).toEqual([]);
  }, 60_000);

  test("a page that logs an error, or has no chart, is a problem", async () => {
    const path = join(dir, "bad.html");
    writeFileSync(path, `<!doctype html><html><body><script>console.error("broken chart")</script></body></html>`);
    expect(reportProblems(await openReport(path))).toEqual(["console: broken chart", "no chart on the page"]);
  }, 60_000);
});
