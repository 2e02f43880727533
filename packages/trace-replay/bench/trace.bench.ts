// `bun run bench:trace [TRACE] [--flags]`: routing quality of each policy on a replayed trace.
// A discrete-event simulation in virtual time (mock-worker's cache and step scheduler, no sleeping, no
// sockets) is the right tool here: a whole trace replays in seconds, identically from a seed, and every
// policy sees exactly the same arrivals. See ../README.md for what is measured and how.
import { mkdirSync, writeFileSync } from "node:fs";
import { resolve } from "node:path";
import { benchUsage, ConfigError, parseBenchArgs } from "../src/bench/options.ts";
import { bucketMsFor, planRuns, replayOptions } from "../src/bench/plan.ts";
import { BOUND_NOTES, IMBALANCE_NOTE, TABLE_COLUMNS, aggNote, benchReportData, boundRows, checkTargets, tableRows } from "../src/bench/report.ts";
import { runAll } from "../src/bench/runner.ts";
import { cacheBounds } from "../src/sim/bounds.ts";
import { pngText, writeReport } from "../src/report/write.ts";
import { formatTable } from "../src/report/table.ts";
import { loadBenchTrace } from "../src/bench/trace-source.ts";
import { PD_COLUMNS, pdRows, runPdBench } from "../src/bench/pd.ts";

if (process.argv.includes("--help")) {
  console.log(benchUsage());
  process.exit(0);
}
let o;
try {
  o = parseBenchArgs(process.argv.slice(2));
} catch (e) {
  if (!(e instanceof ConfigError)) throw e;
  console.error(e.message);
  process.exit(2);
}

const limit = o.requests > 0 ? o.requests : undefined;
const trace = await loadBenchTrace(o.tracePath, limit);
const bucketMs = bucketMsFor(trace, o.timeScale);
if (o.pd) {
  const { prefillWorkers: p, decodeWorkers: d, thresholdTokens, transferMsPerBlock } = o.pd;
  console.log(
    `trace-replay P/D: ${trace.length} requests from ${o.tracePath}\n` +
      `  ${p} prefill + ${d} decode workers x ${o.capacityBlocks} blocks of ${o.blockSize} tokens, time scale ${o.timeScale}x, ` +
      `disaggregated from ${thresholdTokens} uncached tokens, KV read ${transferMsPerBlock} ms/block`,
  );
  const started = performance.now();
  const results = runPdBench(trace, o, bucketMs, (r) => console.log(`  ${r.label} done`));
  console.log(`\n${formatTable(PD_COLUMNS, pdRows(results))}\n`);
  console.log("  prefill hit rate = cached tokens where the prompt was computed (the prefill worker, or the decode worker for a request kept local) / prompt tokens");
  console.log("  TTFT = arrival to the decode worker's first token: the prefill leg, the KV read, the decode worker's last prompt token");
  console.log(`  imbalance = max / mean over the role's workers of the in-flight integral (1 = even); ${((performance.now() - started) / 1000).toFixed(1)} s wall`);
  const outDir = resolve(o.outDir);
  mkdirSync(outDir, { recursive: true });
  writeFileSync(resolve(outDir, "trace-bench-pd.json"), JSON.stringify({ options: o, figures: results }, null, 2));
  process.exit(0);
}
const runs = planRuns(o);
console.log(
  `trace-replay: ${trace.length} requests from ${o.tracePath}\n` +
    `  ${o.workers} workers x ${o.capacityBlocks} blocks of ${o.blockSize} tokens, time scale ${o.timeScale}x, ` +
    `KV event lag ${o.eventLagMs} ms, ${runs.length} replays`,
);
const started = performance.now();
const results = await runAll(
  runs.map((run) => ({ tracePath: o.tracePath, limit, policy: run.policy, opts: replayOptions(o, run, bucketMs) })),
  { jobs: o.jobs, onDone: (r, done) => console.log(`  [${done}/${runs.length}] ${r.label} done`) },
);
const bounds = cacheBounds(trace, { ...o, timing: replayOptions(o, runs[0]!, bucketMs).timing });
const targets = checkTargets(results, bounds);

console.log(`\n${formatTable(TABLE_COLUMNS, [...tableRows(results, bounds), ...boundRows(bounds)])}\n`);
for (const [name, text] of BOUND_NOTES) console.log(`  ${name}: ${text(o, bounds)}`);
console.log(`  / pooled LRU, / hit bound = hit rate over the pooled LRU's and the pooled optimum's; p50 / oracle = TTFT p50 over ttft-oracle's (greedy: lowest simulated TTFT per request, a reference, not a bound); p50 / bound = over the TTFT p50 bound`);
console.log(`  ${IMBALANCE_NOTE}`);
console.log(`  TTFT = arrival to the end of the engine step that computes the prompt's last token (mock-worker's step scheduler), in virtual ms; picks/s = wall-clock rate of the pick function alone`);
if (results.some((r) => r.agg)) console.log(`  replica-agg (simulated with the EPP's AggOutbox/PeerLoads): ${aggNote(o, results)}`);
for (const t of targets) console.log(`  target ${t.ok ? "met   " : "MISSED"} ${t.name}: ${t.text}`);
console.log(`  ${((performance.now() - started) / 1000).toFixed(1)} s wall`);

const outDir = resolve(o.outDir);
mkdirSync(outDir, { recursive: true });
const report = writeReport(outDir, "trace-bench", benchReportData(o, results, bounds, targets), o.png);
const figures = results.map(({ ttftMs: _t, series: _s, ...figs }) => figs);
writeFileSync(resolve(outDir, "trace-bench.json"), JSON.stringify({ options: o, bounds, figures, targets }, null, 2));
console.log(`\nreport: ${report.html}`);
if (report.png) console.log(pngText(report.png));
