// The benchmark's results as a table, target checks and an HTML report.
import { POLICIES } from "../policies/index.ts";
import { cdfPoints, type Points, type ReportData } from "../report/data.ts";
import { ms, pct, rate } from "../report/table.ts";
import type { RunResult } from "../sim/replay.ts";
import type { BenchOptions } from "./options.ts";

export const TABLE_COLUMNS = ["policy", "hit rate", "x RR", "TTFT p50 ms", "TTFT p99 ms", "imbalance", "imb@arrival", "picks/s", "evicted blocks"];

export function tableRows(results: RunResult[]): string[][] {
  const rr = results.find((r) => r.label === "round-robin");
  return results.map((r) => [
    r.label,
    pct(r.hitRate),
    rr && rr.hitRate > 0 ? `${(r.hitRate / rr.hitRate).toFixed(2)}x` : "-",
    ms(r.ttftP50Ms),
    ms(r.ttftP99Ms),
    r.imbalance.toFixed(2),
    r.instantImbalance.toFixed(2),
    rate(r.picksPerSec),
    String(r.evictedBlocks),
  ]);
}

export type TargetCheck = { name: string; value: number; ok: boolean; text: string };

/** Issue 9's targets: KV-aware within 5% of the oracle's hit rate, >= 2x round-robin's, imbalance <= 1.3. */
export function checkTargets(results: RunResult[]): TargetCheck[] {
  const by = (label: string) => results.find((r) => r.label === label);
  const kv = by("kv-aware");
  const oracle = by("oracle");
  const rr = by("round-robin");
  const out: TargetCheck[] = [];
  if (kv && oracle && oracle.hitRate > 0) {
    const v = kv.hitRate / oracle.hitRate;
    out.push({ name: "kv-aware hit rate / oracle's", value: v, ok: v >= 0.95, text: `${v.toFixed(3)} (target >= 0.95)` });
  }
  if (kv && rr && rr.hitRate > 0) {
    const v = kv.hitRate / rr.hitRate;
    out.push({ name: "kv-aware hit rate / round-robin's", value: v, ok: v >= 2, text: `${v.toFixed(2)}x (target >= 2x)` });
  }
  if (kv) out.push({ name: "kv-aware load imbalance", value: kv.imbalance, ok: kv.imbalance <= 1.3, text: `${kv.imbalance.toFixed(3)} (target <= 1.3)` });
  return out;
}

export const IMBALANCE_NOTE =
  "imbalance = max over workers of the time-integral of in-flight requests (running + waiting, virtual time) divided by the mean over workers of that integral; imb@arrival = mean over arrivals of max/mean in-flight at that instant";

/** How the simulated replica-agg delivered load, and what it lost, per run that used it. */
export function aggNote(o: BenchOptions, results: RunResult[] = []): string {
  const a = o.agg;
  const base = `lag ${a.lagMs} ms, snapshot every ${a.heartbeatMs} ms, timeout ${a.timeoutMs} ms, loss ${a.loss}`;
  const runs = results.filter((r) => r.agg).map((r) => `${r.label}: ${r.agg!.messages} messages, ${r.agg!.lost} lost, ${r.agg!.gaps} gaps, ${r.agg!.timeouts} timeouts`);
  return [base, ...runs].join("; ");
}

export function benchReportData(o: BenchOptions, results: RunResult[], targets: TargetCheck[]): ReportData {
  const minutes = (bucket: number, bucketMs: number) => Math.round(((bucket + 0.5) * bucketMs) / 600) / 100;
  return {
    title: "Trace replay: routing quality",
    subtitle:
      "Discrete-event simulation in virtual time of mock-worker's prefix cache and timing model, replaying the trace under each routing policy.",
    facts: [
      ["trace", `${o.tracePath} (${results[0]?.requests ?? 0} requests)`],
      ["workers", `${o.workers} x ${o.capacityBlocks} blocks of ${o.blockSize} tokens, max ${o.maxRunning} running each`],
      ["time scale", `${o.timeScale}x faster than recorded`],
      ["arrivals", o.arrivals === "spread" ? "spread evenly within each timestamp step" : "at the recorded (quantised) timestamps"],
      ["KV event lag", `${o.eventLagMs} ms (virtual)`],
      ["replica-agg (simulated)", aggNote(o, results)],
      ["cost weights", `prefill-load-scale ${o.prefillLoadScale}, decode-load-scale ${o.decodeLoadScale}`],
      ["seed", String(o.seed)],
      ["imbalance", IMBALANCE_NOTE],
      ...results
        .filter((r, i, all) => all.findIndex((x) => x.policy === r.policy) === i)
        .map((r): [string, string] => [r.policy, POLICIES[r.policy].knows]),
      ...targets.map((t): [string, string] => [`target: ${t.name}`, `${t.ok ? "met" : "MISSED"}: ${t.text}`]),
    ],
    table: { columns: TABLE_COLUMNS, rows: tableRows(results) },
    timeAxis: "virtual minutes",
    ttftAxis: "TTFT (ms, simulated: queueing + prefill)",
    hitRate: results.map((r) => ({
      name: r.label,
      // Buckets with no admission (the tail, after the last arrival) are left out, not drawn as gaps.
      points: r.series.hitRate.flatMap((h, b): Points => (h === null ? [] : [[minutes(b, r.series.bucketMs), h]])),
    })),
    ttftCdf: results.map((r) => ({ name: r.label, points: cdfPoints(r.ttftMs) })),
    workerLoad: results.map((r) => ({
      name: r.label,
      workers: r.series.workerLoad.map((series, w) => ({
        name: `worker-${w}`,
        points: series.map((v, b) => [minutes(b, r.series.bucketMs), v]),
      })),
    })),
  };
}
