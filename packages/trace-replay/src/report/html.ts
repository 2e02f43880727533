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
 * `only: "main"` renders just the hit-rate chart at a fixed size (the PNG source); otherwise the whole
 * report: facts, table, hit rate over time, TTFT distribution, per-worker load over time.
 */
export function renderReport(data: ReportData, opts: { only?: "main" } = {}): string {
  const main = opts.only === "main";
  const body = main
    ? `<div id="chart-hit" class="chart" style="width:1200px;height:560px"></div>`
    : `<h1>${esc(data.title)}</h1><p>${esc(data.subtitle)}</p>
<dl>${data.facts.map(([k, v]) => `<dt>${esc(k)}</dt><dd>${esc(v)}</dd>`).join("")}</dl>
<table><thead><tr>${data.table.columns.map((c) => `<th>${esc(c)}</th>`).join("")}</tr></thead>
<tbody>${data.table.rows.map((r) => `<tr>${r.map((c) => `<td>${esc(c)}</td>`).join("")}</tr>`).join("\n")}</tbody></table>
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
chart("chart-hit", {
  title: ${main ? `{ text: ${embed(data.title + ": prefix-cache hit rate")}, left: "center", top: 4, textStyle: { fontSize: 14 } }` : "undefined"},
  legend: { top: ${main ? 28 : 0}, type: "scroll" },
  grid: { top: ${main ? 72 : 48}, left: 64, right: 32, bottom: 56 },
  xAxis: { type: "value", name: data.timeAxis, nameLocation: "middle", nameGap: 28, max: "dataMax" },
  yAxis: { type: "value", name: "cached / prompt tokens", min: 0, axisLabel: { formatter: (v) => Math.round(v * 100) + "%" } },
  series: data.hitRate.map((s, i) => ({ name: s.name, type: "line", showSymbol: false, connectNulls: true, data: s.points, markLine: i === 0 ? markLine : undefined })),
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
