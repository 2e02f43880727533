// The demo's summary table and HTML report.
import { cdfPoints, type ReportData } from "../report/data.ts";
import { ms, pct } from "../report/table.ts";
import { histogramQuantile, type PickScrape } from "./epp-metrics.ts";
import type { DemoOptions } from "./options.ts";
import type { DemoStats } from "./stats.ts";

export type RecoveryReport = { replica: string; peer: string; events: number; bytes: number; ms: number; readyMs: number } | { replica: string; failed: string };

export function recoveryText(r: RecoveryReport | undefined): string {
  if (!r) return "no replica was replaced";
  if ("failed" in r) return `${r.replica}: ${r.failed}`;
  return `${r.replica} recovered ${r.events} events (${(r.bytes / 1024).toFixed(0)} KiB) from ${r.peer} in ${r.ms} ms; ready ${(r.readyMs / 1000).toFixed(1)} s after start`;
}

/** Requests were served, and the replica replaced midway (when one was) recovered from a peer. */
export function demoSucceeded(s: Pick<DemoStats, "outcomes">, replaced: boolean, recovery: RecoveryReport | undefined): boolean {
  if (s.outcomes.ok === 0) return false;
  return !replaced || (recovery !== undefined && !("failed" in recovery));
}

/** One replica's own pick figures: p50/p99 interpolated in its histogram's buckets. */
export function eppPickText(name: string, h: PickScrape): string {
  if ("failed" in h) return `${name}: not scraped (${h.failed})`;
  const q = (x: number) => ms(histogramQuantile(h, x) * 1000);
  return `${name}: p50 ${q(0.5)} ms, p99 ${q(0.99)} ms (${h.count} picks)`;
}

export function summaryRows(s: DemoStats, recovery: RecoveryReport | undefined): [string, string][] {
  const perWorker = s.workerIds.map((w) => `${w}: ${s.picksByWorker.get(w) ?? 0}`).join(", ");
  const perEpp = [...s.picksByEpp].map(([e, n]) => `${e}: ${n}`).join(", ");
  return [
    ["requests", `${s.done} done (${s.outcomes.ok} ok, ${s.outcomes["routing-error"]} routing errors, ${s.outcomes["worker-error"]} worker errors), ${s.rerouted} rerouted`],
    ["routing failures", [...s.routingErrors].map(([why, n]) => `${n}x ${why}`).join("; ") || "none"],
    ["prefix-cache hit rate", `${pct(s.hitRate)} (${s.cachedTokens} of ${s.promptTokens} prompt tokens cached, per the workers' usage)`],
    ["TTFT", `p50 ${ms(s.ttftP(0.5))} ms, p99 ${ms(s.ttftP(0.99))} ms (wall clock, mock timing model)`],
    ["pick latency", `p50 ${ms(s.pickP(0.5))} ms, p99 ${ms(s.pickP(0.99))} ms (load generator: ext_proc request headers written -> routing answer)`],
    ["EPP pick (own metric)", `${[...s.eppPicks].sort(([x], [y]) => x.localeCompare(y)).map(([n, h]) => eppPickText(n, h)).join("; ") || "not scraped"} (dynamo_epp_pick_duration_seconds: complete body -> decision)`],
    ["send lag", `p50 ${ms(s.sendLagP(0.5))} ms, p99 ${ms(s.sendLagP(0.99))} ms (trace arrival instant -> request headers written; ${s.lateBodies} bodies built late)`],
    ["picks per worker", perWorker],
    ["picks per EPP replica", perEpp],
    ["recovery", recoveryText(recovery)],
  ];
}

export function demoReportData(o: DemoOptions, s: DemoStats, recovery: RecoveryReport | undefined): ReportData {
  return {
    title: "kv-epp demo",
    subtitle: `${o.workers} mock workers, two EPP replicas (static mode) routing a replay of the trace through ext_proc; one replica replaced midway.`,
    facts: [
      ["trace", `${s.sent} requests from ${o.tracePath} (at most ${o.durationS} s of it), replayed at ${o.timeScale}x, arrivals ${o.arrivals}`],
      ["workers", `${o.workers} x ${o.capacityBlocks} blocks of ${o.blockSize} tokens, timing speed ${o.speed}`],
      ["ext_proc", `request body mode ${o.bodyMode} (client and EPPs)`],
    ],
    table: { columns: ["summary", ""], rows: summaryRows(s, recovery) },
    timeAxis: "seconds since start",
    marks: s.marks,
    ttftAxis: "TTFT (ms, measured at the load generator)",
    hitRate: [{ name: "kv-aware (EPP)", points: s.hitSeries() }],
    ttftCdf: [{ name: "kv-aware (EPP)", points: cdfPoints(s.ttftMs) }],
    workerLoad: [
      {
        name: "in flight per worker (load generator's view)",
        workers: s.workerIds.map((w) => ({ name: w, points: s.loadSamples.map((x) => [x.t, x.byWorker.get(w) ?? 0]) })),
      },
    ],
  };
}
