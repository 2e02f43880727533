// The demo's summary table and HTML report.
import { isAbsolute, relative } from "node:path";
import { cdfPoints, type ReportData } from "../report/data.ts";
import { ms, pct } from "../report/table.ts";
import { histogramQuantile, type EppScrape } from "./epp-metrics.ts";
import type { DemoOptions } from "./options.ts";
import { selectCheckText, type SelectCheck } from "./select-check.ts";
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
export function eppPickText(name: string, s: EppScrape): string {
  if ("failed" in s) return `${name}: not scraped (${s.failed})`;
  // Past the highest finite bucket only a bound is known.
  const top = s.pick.buckets.filter((b) => b.le !== Infinity).at(-1);
  const q = (x: number) => (top && x * s.pick.count > top.count ? `> ${ms(top.le * 1000)}` : ms(histogramQuantile(s.pick, x) * 1000));
  return `${name}: p50 ${q(0.5)} ms, p99 ${q(0.99)} ms (${s.pick.count} picks)`;
}

/** What the EPPs predicted next to what the workers reported, both as a mean over requests. */
export function predictedHitText(s: DemoStats): string {
  const p = s.predictedHit();
  return (
    `EPP predicted ${pct(p.mean)} (dynamo_epp_overlap_ratio: chosen worker's cached blocks / request blocks, mean of ${p.picks} picks); ` +
    `workers reported ${pct(s.requestHitMean)} (cached / prompt tokens, mean of ${s.ttftMs.length} requests)`
  );
}

export function summaryRows(s: DemoStats, recovery: RecoveryReport | undefined, check?: SelectCheck): [string, string][] {
  const perWorker = s.workerIds.map((w) => `${w}: ${s.picksByWorker.get(w) ?? 0}`).join(", ");
  const perEpp = [...s.picksByEpp].map(([e, n]) => `${e}: ${n}`).join(", ");
  return [
    ["requests", `${s.done} done (${s.outcomes.ok} ok, ${s.outcomes["routing-error"]} routing errors, ${s.outcomes["worker-error"]} worker errors), ${s.rerouted} rerouted`],
    ["routing failures", [...s.routingErrors].map(([why, n]) => `${n}x ${why}`).join("; ") || "none"],
    ["prefix-cache hit rate", `${pct(s.hitRate)} (${s.cachedTokens} of ${s.promptTokens} prompt tokens cached, per the workers' usage)`],
    ["hit rate per request", predictedHitText(s)],
    ["tokenization check", selectCheckText(check)],
    ["TTFT", `p50 ${ms(s.ttftP(0.5))} ms, p99 ${ms(s.ttftP(0.99))} ms (client: request sent to the gateway -> first streamed token; includes routing; mock timing model)`],
    ["pick latency", `p50 ${ms(s.pickP(0.5))} ms, p99 ${ms(s.pickP(0.99))} ms (gateway process: ext_proc request headers written -> routing answer, body shipped both ways)`],
    ["EPP pick (own metric)", `${[...s.eppScrapes].sort(([x], [y]) => x.localeCompare(y)).map(([n, h]) => eppPickText(n, h)).join("; ") || "not scraped"} (dynamo_epp_pick_duration_seconds: complete body -> decision, inside the EPP: parse, tokenize, pick)`],
    ["send lag", `p50 ${ms(s.sendLagP(0.5))} ms, p99 ${ms(s.sendLagP(0.99))} ms (trace arrival instant at the load generator -> ext_proc request headers written by the gateway; ${s.lateBodies} bodies built late)`],
    ["picks per worker", perWorker],
    ["picks per EPP replica", perEpp],
    ["recovery", recoveryText(recovery)],
  ];
}

/** A path inside the working directory as relative (the report does not show where the checkout lives). */
const shownPath = (p: string) => {
  const r = relative(process.cwd(), p);
  return r.startsWith("..") || isAbsolute(r) ? p : r;
};

export function demoReportData(o: DemoOptions, s: DemoStats, recovery: RecoveryReport | undefined, check?: SelectCheck): ReportData {
  return {
    title: "kv-epp demo",
    subtitle:
      `A replay of the trace as OpenAI requests sent to a gateway process, which asks one of two EPP replicas (static mode) through ext_proc ` +
      `which of ${o.workers} mock workers serves each and proxies it there; one replica is replaced midway and recovers its index from the other.`,
    facts: [
      ["trace", `${s.sent} requests from ${shownPath(o.tracePath)} (at most ${o.durationS} s of it), replayed at ${o.timeScale}x, arrivals ${o.arrivals}`],
      [
        "requests",
        o.prompt === "chat"
          ? "/v1/chat/completions with text messages built from the trace's blocks, tokenized by the EPPs and the workers with the Qwen3 tokenizer"
          : "/v1/completions with the prompt as token ids (one PRNG stream per trace block)",
      ],
      ["workers", `${o.workers} x ${o.capacityBlocks} blocks of ${o.blockSize} tokens, timing speed ${o.speed}`],
      ["ext_proc", `request body mode ${o.bodyMode} (gateway and EPPs)`],
    ],
    table: { columns: ["summary", ""], rows: summaryRows(s, recovery, check) },
    timeAxis: "seconds since start",
    marks: s.marks,
    ttftAxis: "TTFT (ms, client: request sent -> first token)",
    hitRate: [
      { name: "workers: cached / prompt tokens", points: s.hitSeries() },
      { name: "workers: mean per request", points: s.requestHitSeries() },
      { name: "EPP predicted: mean per pick", points: s.predictedSeries() },
    ],
    ttftCdf: [{ name: "every request", points: cdfPoints(s.ttftMs) }],
    workerLoad: [
      {
        name: "in flight per worker (client's view)",
        workers: s.workerIds.map((w) => ({ name: w, points: s.loadSamples.map((x) => [x.t, x.byWorker.get(w) ?? 0]) })),
      },
    ],
  };
}
