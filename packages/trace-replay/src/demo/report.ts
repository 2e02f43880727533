// The demo's summary table and HTML report.
import { isAbsolute, relative } from "node:path";
import { cdfPoints, type ReportData } from "../report/data.ts";
import { ms, pct } from "../report/table.ts";
import { percentile } from "../sim/recorder.ts";
import { histogramQuantile, mergeHistograms, shareAbove, type EppScrape, type Histogram } from "./epp-metrics.ts";
import type { DemoOptions } from "./options.ts";
import { selectCheckText, type SelectCheck } from "./select-check.ts";
import type { DemoStats } from "./stats.ts";
import { routedLabel, type RoutedFigures } from "./compare.ts";

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
  const over = shareAbove(s.pick, SLOW_PICK_SECONDS);
  const waits = [
    s.waits?.pool && s.waits.pool.count > 0 ? `waiting for a pool member p99 ${quantileText(s.waits.pool, 0.99)} ms` : "",
    s.waits?.loop && s.waits.loop.count > 0 ? `event-loop lag p99 ${quantileText(s.waits.loop, 0.99)} ms` : "",
  ].filter((x) => x !== "");
  return `${name}: p50 ${quantileText(s.pick, 0.5)} ms, p99 ${quantileText(s.pick, 0.99)} ms (${s.pick.count} picks` +
    `${over === undefined ? "" : `, ${(over * 100).toFixed(1)}% over ${SLOW_PICK_SECONDS * 1000} ms`}${waits.length > 0 ? `; ${waits.join(", ")}` : ""})`;
}

/** A pick slower than this is counted apart in the summary (a bucket bound of the EPP's pick histogram). */
const SLOW_PICK_SECONDS = 0.02;

/** Quantile q in ms; past the highest finite bucket only a bound is known. */
function quantileText(h: Histogram, q: number): string {
  const top = h.buckets.filter((b) => b.le !== Infinity).at(-1);
  return top && q * h.count > top.count ? `> ${ms(top.le * 1000)}` : ms(histogramQuantile(h, q) * 1000);
}

/**
 * One replica's fresh tokens per pick (tokenized for it, not found in the segment cache), with reply warming as
 * it ran, and as it would have been without: the tokens its picks found cached only because the previous turn's
 * reply had been warmed would have been fresh too. Both from the same picks, counted in the EPP's pool.
 */
export function freshTokensText(name: string, s: EppScrape): string {
  if ("failed" in s) return `${name}: not scraped`;
  const t = s.tokenization;
  if (!t || t.fresh.count + t.fallbacks + t.decided === 0) return `${name}: no pick tokenized in the pool`;
  const n = t.fresh.count;
  const settled = t.decided > 0 ? `; ${t.decided} routed once their known prefix settled the pick` : "";
  const over = `${settled}${t.fallbacks > 0 ? `; ${t.fallbacks} more routed on their known prefix, over the tokenization budget` : ""}`;
  if (n === 0) return `${name}: no pick tokenized in full${over}`;
  const q = (x: number) => Math.round(histogramQuantile(t.fresh, x));
  return `${name}: mean ${Math.round(t.fresh.sum / n)} with reply warming, ${Math.round((t.fresh.sum + t.warmedTokens) / n)} without ` +
    `(p50 ~${q(0.5)}, p99 ~${q(0.99)} with; ${n} picks tokenized in full${over})`;
}

/** What the EPPs predicted next to what the workers reported, both as a mean over requests. */
export function predictedHitText(s: DemoStats): string {
  const p = s.predictedHit();
  return (
    `EPP predicted ${pct(p.mean)} (dynamo_epp_overlap_ratio: chosen worker's cached blocks / request blocks, mean of ${p.picks} picks; ` +
    `a pick routed on a known prefix its worker holds whole counts only that prefix); ` +
    `workers reported ${pct(s.requestHitMean)} (cached / prompt tokens, mean of ${s.ttftMs.length} requests)`
  );
}

const signed = (x: number) => `${x >= 0 ? "+" : ""}${x.toFixed(1)}`;
const scraped = (s: DemoStats) =>
  [...s.eppScrapes].sort(([x], [y]) => x.localeCompare(y)).flatMap(([n, e]) => ("failed" in e ? [] : [[n, e] as const]));
const total = (m: Map<string, number>) => [...m.values()].reduce((a, b) => a + b, 0);

/**
 * Each replica's live routing quality (its /metrics) beside what the load generator saw of the same
 * requests: routed there, and how many of those had no prompt_tokens_details in their usage (a worker's
 * null before it ever reported details is not scored), so scored is routed minus at most that.
 */
export function routingQualityText(s: DemoStats): string {
  const parts = scraped(s).map(([name, e]) => {
    const q = e.quality;
    const scoredN = q.error.count;
    const ttfts = [...q.ttft.values()].reduce((a, h) => a + h.count, 0);
    const mean = scoredN > 0 ? `${signed(q.error.sum / scoredN)} tokens` : "-";
    const u = s.usageByEpp.get(name);
    return (
      `${name}: ${s.picksByEpp.get(name) ?? 0} routed, ${scoredN} scored (${u?.withoutDetails ?? 0} reported no cached-token details), ` +
      `mean error ${mean}, ${total(q.mispredictions)} mispredicted, ${ttfts} TTFTs observed, ${q.releasedWithoutResponseBody} released without a response body`
    );
  });
  return `${parts.join("; ") || "not scraped"} (error: predicted - reported cached tokens, dynamo_epp_cached_tokens_prediction_error; mispredicted: off by more than one block, ` +
    `or for a pick on a known prefix its worker held whole, which predicts at least, over by more than one)`;
}

/** Cached tokens the replicas predicted for the responses they scored, next to what the workers reported for them. */
export function predictedCachedText(s: DemoStats): string {
  let scoredN = 0;
  let errorSum = 0;
  let reported = 0;
  for (const [name, e] of scraped(s)) {
    scoredN += e.quality.error.count;
    errorSum += e.quality.error.sum;
    // A response not scored reported none cached: the reported sum over the scored ones is the replica's whole sum.
    reported += s.usageByEpp.get(name)?.cachedTokens ?? 0;
  }
  if (scoredN === 0) return "no response scored";
  return (
    `EPPs predicted ${Math.round(reported + errorSum)} cached tokens, workers reported ${reported}, over the ${scoredN} responses the EPPs scored ` +
    `(${signed(errorSum / scoredN)} tokens per response; a pick on a known prefix its worker held whole predicts only that prefix)`
  );
}

/** Per worker, over every replica: mispredictions of the scored responses, TTFT the EPPs observed beside the client's. */
export function perWorkerQualityText(s: DemoStats): { mispredictions: string; ttft: string } {
  const live = scraped(s);
  const sum = (w: string, pick: (e: (typeof live)[number][1]) => Map<string, number>) => live.reduce((a, [, e]) => a + (pick(e).get(w) ?? 0), 0);
  const mispredictions = s.workerIds.map((w) => `${w}: ${sum(w, (e) => e.quality.mispredictions)} of ${sum(w, (e) => e.quality.predictions)}`).join(", ");
  const ttft = s.workerIds
    .map((w) => {
      const h = eppTtft(s, w);
      const client = s.usageByWorker.get(w)?.ttftMs ?? [];
      const epp = h && h.count > 0 ? `EPP p50 ${ms(histogramQuantile(h, 0.5) * 1000)} ms (${h.count})` : "EPP -";
      return `${w}: ${epp}, client p50 ${ms(percentile(client, 0.5))} ms`;
    })
    .join("; ");
  return { mispredictions, ttft };
}

/** The TTFT the replicas observed for one worker (all workers without `worker`), their histograms summed. */
export function eppTtft(s: DemoStats, worker?: string): Histogram | undefined {
  return mergeHistograms(scraped(s).flatMap(([, e]) => [...e.quality.ttft].filter(([w]) => worker === undefined || w === worker).map(([, h]) => h)));
}

/** The simulated runs' figure beside the live one, e.g. "simulated on the same 449 requests: round-robin 6.6%, ...". */
function simulatedText(simulated: readonly RoutedFigures[], requests: number, figure: (f: RoutedFigures) => string): string {
  if (simulated.length === 0) return "";
  return `; simulated on the same ${requests} requests: ${simulated.map((f) => `${f.name} ${figure(f)}`).join(", ")}`;
}

/**
 * The summary, the three figures that matter first: what the workers found cached, what the client
 * waited for its first token (each beside the same requests routed round-robin and GAIE-style,
 * simulated), and what routing cost per request.
 */
/** How the chat turns that continue an earlier one carried its reply. */
function repliesText(s: DemoStats): string {
  const r = s.replies;
  return `${r.resent} next turns resent the reply the client received, ${r.stoodIn} went out before it came (the trace's text in its place)`;
}

export function summaryRows(s: DemoStats, recovery: RecoveryReport | undefined, check?: SelectCheck, simulated: readonly RoutedFigures[] = []): [string, string][] {
  const perWorker = s.workerIds.map((w) => `${w}: ${s.picksByWorker.get(w) ?? 0}`).join(", ");
  const perEpp = [...s.picksByEpp].map(([e, n]) => `${e}: ${n}`).join(", ");
  const quality = perWorkerQualityText(s);
  const ttft = (p50: number, p99: number) => `p50 ${ms(p50)} ms, p99 ${ms(p99)} ms`;
  return [
    [
      "prefix-cache hit rate",
      `${pct(s.hitRate)} live (${s.cachedTokens} of ${s.promptTokens} prompt tokens cached, per the workers' usage)${simulatedText(simulated, s.sent, (f) => pct(f.hitRate))}`,
    ],
    [
      "TTFT",
      `${ttft(s.ttftP(0.5), s.ttftP(0.99))} live (client: request sent to the gateway -> first streamed token; includes routing and the tokenization of each chat on this machine)` +
        simulatedText(simulated, s.sent, (f) => ttft(f.ttftP50Ms, f.ttftP99Ms)),
    ],
    ["pick latency", `p50 ${ms(s.pickP(0.5))} ms, p99 ${ms(s.pickP(0.99))} ms (gateway process: ext_proc request headers written -> routing answer, body shipped both ways; the gateway runs at --stand-in-nice, so this includes its own waits for a CPU)`],
    ["requests", `${s.done} done (${s.outcomes.ok} ok, ${s.outcomes["routing-error"]} routing errors, ${s.outcomes["worker-error"]} worker errors), ${s.rerouted} rerouted`],
    ["routing failures", [...s.routingErrors].map(([why, n]) => `${n}x ${why}`).join("; ") || "none"],
    ["hit rate per request", predictedHitText(s)],
    ["tokenization check", selectCheckText(check)],
    ["routing quality (EPPs)", routingQualityText(s)],
    ["predicted vs reported", predictedCachedText(s)],
    ["mispredicted per worker", quality.mispredictions],
    ["EPP pick (own metric)", `${[...s.eppScrapes].sort(([x], [y]) => x.localeCompare(y)).map(([n, h]) => eppPickText(n, h)).join("; ") || "not scraped"} (dynamo_epp_pick_duration_seconds: complete body -> decision, inside the EPP: parse, tokenize, pick; its waits: dynamo_epp_tokenizer_pool_wait_seconds and dynamo_epp_event_loop_lag_seconds)`],
    ["EPP fresh tokens/pick", `${scraped(s).map(([n, e]) => freshTokensText(n, e)).join("; ") || "not scraped"} (dynamo_epp_tokenizer_fresh_tokens; without warming adds dynamo_epp_tokenizer_warmed_tokens_total, what the picks found cached only because a reply was warmed; the gateway spreads a conversation's turns over the replicas, and a replica warms only the replies it saw; ${repliesText(s)})`],
    ["send lag", `p50 ${ms(s.sendLagP(0.5))} ms, p99 ${ms(s.sendLagP(0.99))} ms (trace arrival instant at the load generator -> ext_proc request headers written by the gateway; ${s.lateBodies} bodies built late)`],
    ["TTFT per worker", `${quality.ttft} (EPP: its decision -> first response body chunk through ext_proc, dynamo_epp_observed_ttft_seconds)`],
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

/** `extraRows`: lines after the summary's own (a P/D run's, demo/pd-figures.ts). */
export function demoReportData(o: DemoOptions, s: DemoStats, recovery: RecoveryReport | undefined, check?: SelectCheck, compared: readonly RoutedFigures[] = [], extraRows: [string, string][] = []): ReportData {
  const simulated = compared.filter((f) => f.source === "simulated");
  return {
    title: "kv-epp demo",
    subtitle:
      `A replay of the trace as OpenAI requests sent to a gateway process, which asks one of two EPP replicas (static mode) through ext_proc ` +
      (o.pd
        ? `which pair of a P/D pool's ${o.workers} mock workers serves each (a decode worker, behind its P/D sidecar, and when disaggregated the prefill worker) and proxies it there; `
        : `which of ${o.workers} mock workers serves each and proxies it there; `) +
      `one replica is replaced midway and recovers its index from the other.`,
    facts: [
      ["trace", `${s.sent} requests from ${shownPath(o.tracePath)} (at most ${o.durationS} s of it), replayed at ${o.timeScale}x, arrivals ${o.arrivals}`],
      [
        "requests",
        o.prompt === "chat"
          ? "/v1/chat/completions with text messages built from the trace's blocks, tokenized by the EPPs and the workers with the Qwen3 tokenizer"
          : "/v1/completions with the prompt as token ids (one PRNG stream per trace block)",
      ],
      [
        "workers",
        `${o.workers} x ${o.capacityBlocks} blocks of ${o.blockSize} tokens, timing speed ${o.speed}` +
          (o.pd ? `; a P/D pool: ${Math.floor(o.workers / 2)} prefill workers, ${o.workers - Math.floor(o.workers / 2)} decode workers each behind a P/D sidecar` : ""),
      ],
      [
        "ext_proc",
        `request and response body mode ${o.bodyMode === "full-duplex" ? "FULL_DUPLEX_STREAMED" : "BUFFERED (the client gets each response whole)"} (gateway and EPPs); the response passes through the EPP`,
      ],
    ],
    table: { columns: ["summary", ""], rows: [...summaryRows(s, recovery, check, simulated), ...extraRows] },
    ...(compared.length > 0
      ? {
          comparison: {
            title: `The same ${s.sent} requests, routed ${o.pd ? "on a P/D pool" : "three ways"}`,
            note: o.pd
              ? `"simulated": bench:trace --pd's simulation of this run's trace slice on the same P/D pool (virtual time, the same arrivals at ${o.timeScale}x; ` +
                `llm-d's rule as one router, kv-epp as two replicas sharing load; TTFT includes the prefill leg and the KV read). "live run": this run's processes, ` +
                `the prefix-cache hit rate as the sidecars report it (the prefill worker's cached tokens).`
              : `"simulated": bench:trace's simulation of this run's trace slice (virtual time: the mock engine's step scheduler and prefix cache, ` +
                `${o.workers} workers of ${o.capacityBlocks} blocks, the same arrivals at ${o.timeScale}x; round-robin and GAIE's approximate prefix scorer as one router, ` +
                `kv-epp as two replicas sharing load). "live run": this run's processes, where the TTFT also holds the gateway, ` +
                `the EPP's and the worker's tokenization of every chat on this machine, and one replica replaced midway.`,
            runs: compared.map((f) => ({ name: routedLabel(f), hitRate: f.hitRate, ttftP50Ms: f.ttftP50Ms, ttftP99Ms: f.ttftP99Ms })),
          },
        }
      : {}),
    timeAxis: "seconds since start",
    marks: s.marks,
    ttftAxis: "TTFT (ms, client: request sent -> first token)",
    hitRate: [
      { name: "workers: cached / prompt tokens", points: s.hitSeries() },
      { name: "workers: mean per request", points: s.requestHitSeries() },
      { name: "EPP predicted: mean per pick", points: s.predictedSeries() },
    ],
    ttftCdf: [
      { name: "every request", points: cdfPoints(s.ttftMs) },
      { name: "EPPs observed: decision -> first response chunk", points: histogramCdf(eppTtft(s)) },
    ],
    workerLoad: [
      {
        name: "in flight per worker (client's view)",
        workers: s.workerIds.map((w) => ({ name: w, points: s.loadSamples.map((x) => [x.t, x.byWorker.get(w) ?? 0]) })),
      },
    ],
  };
}

/** A histogram (seconds) as CDF points in ms at its finite bounds. */
function histogramCdf(h: Histogram | undefined): [number, number][] {
  if (!h || h.count === 0) return [];
  return h.buckets.filter((b) => b.le !== Infinity).map((b) => [b.le * 1000, Math.round((b.count / h.count) * 1000) / 1000]);
}
