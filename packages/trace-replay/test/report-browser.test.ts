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
    { name: "empty", points: [] },
  ],
  ttftAxis: "ms",
  ttftCdf: [{ name: "drawn", points: [[10, 0], [20, 0.5], [40, 1]] }],
  workerLoad: [{ name: "run", workers: [{ name: "w0", points: [[0, 1], [5, 3]] }] }],
};

describe.skipIf(!chromiumPath)("a report in headless chromium", () => {
  test("a legend series without points is reported as drawing nothing; the others drew", async () => {
    const path = join(dir, "r.html");
    writeFileSync(path, renderReport(data));
    const seen = await openReport(path);
    expect(seen.charts.map((c) => c.id)).toEqual(["chart-hit", "chart-ttft", "chart-load-0"]);
    expect(reportProblems(seen)).toEqual(['chart-hit: series "empty" drew nothing']);
  }, 60_000);

  test("a page that logs an error, or has no chart, is a problem", async () => {
    const path = join(dir, "bad.html");
    writeFileSync(path, `<!doctype html><html><body><script>console.error("broken chart")</script></body></html>`);
    expect(reportProblems(await openReport(path))).toEqual(["console: broken chart", "no chart on the page"]);
  }, 60_000);
});
