// A self-contained HTML report: the charting library (echarts, from the npm registry) and the data are
// inlined, so the file opens anywhere with no network.
import { readFileSync } from "node:fs";
import type { ReportData } from "./data.ts";

let echartsSource: string | undefined;
function echarts(): string {
  echartsSource ??= readFileSync(Bun.resolveSync("echarts/dist/echarts.min.js", import.meta.dir), "utf8");
  return echartsSource;
}

const esc = (s: string) => s.replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c]!);
// Inside <script>, only "</" can end the element early.
const embed = (v: unknown) => JSON.stringify(v).replace(/<\//g, "<\\/");

/**
 * `only: "main"` renders just the main chart at a fixed size (the PNG source): the comparison when the
 * report has one, else the hit rate over time. Otherwise the whole report: facts, table, comparison,
 * hit rate over time, TTFT distribution, per-worker load over time.
 */
export function renderReport(data: ReportData, opts: { only?: "main" } = {}): string {
  const main = opts.only === "main";
  const mainId = data.comparison ? "chart-compare" : "chart-hit";
  const body = main
    ? `<div id="${mainId}" class="chart" style="width:1200px;height:560px"></div>`
    : `<h1>${esc(data.title)}</h1><p>${esc(data.subtitle)}</p>
<dl>${data.facts.map(([k, v]) => `<dt>${esc(k)}</dt><dd>${esc(v)}</dd>`).join("")}</dl>
<table><thead><tr>${data.table.columns.map((c) => `<th>${esc(c)}</th>`).join("")}</tr></thead>
<tbody>${data.table.rows.map((r) => `<tr>${r.map((c) => `<td>${esc(c)}</td>`).join("")}</tr>`).join("\n")}</tbody></table>
${data.comparison ? `<h2>${esc(data.comparison.title)}</h2><p>${esc(data.comparison.note)}</p><div id="chart-compare" class="chart"></div>` : ""}
${data.limits ? `<h2>Distance to the limits (1 = at the limit)</h2><div id="chart-limits" class="chart"></div>` : ""}
<h2>Prefix-cache hit rate over time</h2><div id="chart-hit" class="chart"></div>
<h2>TTFT distribution</h2><div id="chart-ttft" class="chart"></div>
<h2>In-flight requests per worker over time</h2>
${data.workerLoad.map((_, i) => `<div id="chart-load-${i}" class="chart small"></div>`).join("\n")}`;
  return `<!doctype html>
<html><head><meta charset="utf-8"><title>${esc(data.title)}</title>
<style>
body{font:14px system-ui,sans-serif;margin:24px;color:#222}
table{border-collapse:collapse;margin:12px 0}td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}
td:first-child,th:first-child{text-align:left}dl{display:grid;grid-template-columns:max-content auto;gap:2px 12px}
dt{font-weight:600}dd{margin:0}.chart{width:100%;max-width:1200px;height:460px}.chart.small{height:300px}
</style></head><body>
${body}
<script id="report-data" type="application/json">${embed(data)}</script>
<script>${echarts()}</script>
<script>
const data = JSON.parse(document.getElementById("report-data").textContent);
const base = { animation: false, tooltip: { trigger: "axis" }, legend: { top: 0, type: "scroll" }, grid: { top: 48, left: 64, right: 32, bottom: 48 } };
// Marked moments as vertical lines on the first series of a time chart.
const markLine = { symbol: "none", label: { formatter: (p) => p.name }, lineStyle: { type: "dashed", color: "#c00" }, data: (data.marks || []).map((m) => ({ name: m.label, xAxis: m.x })) };
function chart(id, option) {
  const el = document.getElementById(id);
  if (el) echarts.init(el).setOption(Object.assign({}, base, option));
}
// One bar per run in each panel: hit rate on the left, TTFT p50 and p99 on the right. A run is one
// legend entry (its two series share the name and the colour); a zero still shows as a sliver.
if (data.comparison) {
  const runs = data.comparison.runs;
  const palette = ["#9e9e9e", "#e6a23c", "#5470c6", "#2e7d32", "#ab47bc", "#26a69a"];
  const secs = (v) => (v >= 1000 ? (v / 1000).toFixed(1) + " s" : Math.round(v) + " ms");
  chart("chart-compare", {
    title: [
      ${main ? `{ text: ${embed(data.comparison?.title ?? "")}, left: "center", top: 4, textStyle: { fontSize: 15 } },` : ""}
      { text: "prefix-cache hit rate (higher is better)", left: "22%", textAlign: "center", top: ${main ? 58 : 28}, textStyle: { fontSize: 13 } },
      { text: "TTFT (lower is better)", left: "70%", textAlign: "center", top: ${main ? 58 : 28}, textStyle: { fontSize: 13 } },
    ],
    tooltip: { trigger: "item" },
    legend: { top: ${main ? 30 : 0}, type: "scroll" },
    grid: [
      { top: ${main ? 96 : 64}, left: 64, width: "34%", bottom: 40 },
      { top: ${main ? 96 : 64}, right: 32, width: "48%", bottom: 40 },
    ],
    xAxis: [
      { type: "category", gridIndex: 0, data: ["cached / prompt tokens"] },
      { type: "category", gridIndex: 1, data: ["p50", "p99"] },
    ],
    yAxis: [
      { type: "value", gridIndex: 0, min: 0, axisLabel: { formatter: (v) => Math.round(v * 100) + "%" } },
      { type: "value", gridIndex: 1, min: 0, axisLabel: { formatter: secs } },
    ],
    series: runs.flatMap((r, i) => {
      const color = palette[i % palette.length];
      const bar = { name: r.name, type: "bar", barMinHeight: 2, itemStyle: { color }, label: { show: true, position: "top" } };
      return [
        Object.assign({}, bar, { xAxisIndex: 0, yAxisIndex: 0, data: [r.hitRate], label: Object.assign({}, bar.label, { formatter: (p) => (p.value * 100).toFixed(1) + "%" }) }),
        Object.assign({}, bar, { xAxisIndex: 1, yAxisIndex: 1, data: [r.ttftP50Ms, r.ttftP99Ms], label: Object.assign({}, bar.label, { formatter: (p) => secs(p.value) }) }),
      ];
    }),
  });
}
chart("chart-hit", {
  title: ${main ? `{ text: ${embed(data.title + ": prefix-cache hit rate")}, left: "center", top: 4, textStyle: { fontSize: 14 } }` : "undefined"},
  legend: { top: ${main ? 28 : 0}, type: "scroll" },
  grid: { top: ${main ? 72 : 48}, left: 64, right: 32, bottom: 56 },
  xAxis: { type: "value", name: data.timeAxis, nameLocation: "middle", nameGap: 28, max: "dataMax" },
  yAxis: { type: "value", name: "cached / prompt tokens", min: 0, axisLabel: { formatter: (v) => Math.round(v * 100) + "%" } },
  // A series with one value (the EPPs' predictions come from a few scrapes on a busy run) is a line of no
  // length: its point is drawn as a symbol instead.
  series: data.hitRate.map((s, i) => ({ name: s.name, type: "line", showSymbol: s.points.filter((p) => p[1] !== null).length < 2, connectNulls: true, data: s.points, markLine: i === 0 ? markLine : undefined })),
});
if (data.limits) chart("chart-limits", {
  tooltip: { trigger: "axis", axisPointer: { type: "shadow" } },
  grid: { top: 48, left: 64, right: 32, bottom: 96 },
  xAxis: { type: "category", data: data.limits.map((l) => l.name), axisLabel: { rotate: 30 } },
  yAxis: { type: "value", min: 0 },
  series: [
    { name: "hit rate / pooled LRU (reference; higher is better)", type: "bar", data: data.limits.map((l) => l.hitVsPooled), markLine: { symbol: "none", data: [{ yAxis: 1 }] } },
    { name: "hit rate / pooled optimum (bound)", type: "bar", data: data.limits.map((l) => l.hitVsBound) },
    { name: "TTFT p50 / greedy TTFT oracle's (reference; lower is better)", type: "bar", data: data.limits.map((l) => l.ttftVsOracle) },
    { name: "TTFT p50 / TTFT p50 bound", type: "bar", data: data.limits.map((l) => l.ttftVsBound) },
  ],
});
chart("chart-ttft", {
  xAxis: { type: "log", name: data.ttftAxis, nameLocation: "middle", nameGap: 28 },
  yAxis: { type: "value", name: "fraction of requests", min: 0, max: 1 },
  series: data.ttftCdf.map((s) => ({ name: s.name, type: "line", showSymbol: false, step: "end", data: s.points })),
});
data.workerLoad.forEach((run, i) => chart("chart-load-" + i, {
  title: { text: run.name, left: "center", bottom: 0, textStyle: { fontSize: 13 } },
  xAxis: { type: "value", name: data.timeAxis },
  yAxis: { type: "value", name: "in flight", min: 0 },
  series: run.workers.map((w, j) => ({ name: w.name, type: "line", showSymbol: false, data: w.points, markLine: j === 0 ? markLine : undefined })),
}));
</script></body></html>
`;
}
