// `bun run demo`: the whole thing on one machine. Mock workers, two EPP replicas (static mode) and a
// gateway as processes on 127.0.6.x with the standard ports; this process is the client, replaying the
// trace as OpenAI requests to the gateway, which routes each through a replica's ext_proc to a worker
// and passes the response back through the same ext_proc stream; midway one replica is drained and
// killed, and a new one recovers its index from the survivor. Ctrl-C stops every
// child.
import { mkdirSync } from "node:fs";
import { resolve } from "node:path";
import { ConfigError } from "@kv-epp/options";
import { Children, runAsStandIn } from "./demo/children.ts";
import { liveFigures, pdRouted, simulatePdSlice, simulateSlice } from "./demo/compare.ts";
import { pdSummaryRows, scrapePdFigures } from "./demo/pd-figures.ts";
import {
  EPP_PORTS, eppMetricsUrl, eppReady, eppRecovery, gatewayHealthy, gatewayUrl, layout, qwen3TokenizerDir, setGatewayReplicas, startEppReplica,
  startGateway, startWorker, waitUntil, workerHealthy,
} from "./demo/cluster.ts";
import { scrapeEppMetrics } from "./demo/epp-metrics.ts";
import { replay } from "./demo/loadgen.ts";
import { demoUsage, parseDemoArgs, type DemoOptions } from "./demo/options.ts";
import { startProgress, statusLine } from "./demo/progress.ts";
import { demoReportData, demoSucceeded, recoveryText, summaryRows, type RecoveryReport } from "./demo/report.ts";
import { selectCheck } from "./demo/select-check.ts";
import { DemoStats } from "./demo/stats.ts";
import { pngText, writeReport } from "./report/write.ts";
import { loadTrace, type TraceRecord } from "./trace.ts";

const REPO_ROOT = resolve(import.meta.dir, "../../..");

/** The trace's first records, up to --duration s of it (and --requests): a prefix, as the simulation loads it. */
function pickRecords(all: TraceRecord[], o: DemoOptions): TraceRecord[] {
  const first = all[0]?.timestamp ?? 0;
  const end = all.findIndex((r) => r.timestamp - first > o.durationS * 1000);
  const within = end < 0 ? all : all.slice(0, end);
  return o.requests > 0 ? within.slice(0, o.requests) : within;
}

async function main(o: DemoOptions): Promise<number> {
  const records = pickRecords(await loadTrace(o.tracePath, o.requests > 0 ? o.requests : undefined), o);
  const runDir = resolve(REPO_ROOT, o.outDir, `demo-${new Date().toISOString().replace(/[:.]/g, "-")}`);
  mkdirSync(runDir, { recursive: true });
  const l = layout({ ...o, tokenizerDir: o.prompt === "chat" ? qwen3TokenizerDir() : undefined });
  const children = new Children(REPO_ROOT);
  const abort = new AbortController();
  let stopping: Promise<void> | undefined;
  const stopEverything = () => (stopping ??= children.stopAll());
  for (const sig of ["SIGINT", "SIGTERM"] as const) {
    process.on(sig, () => {
      console.log(`\n${sig}: stopping ${children.names.length} child processes`);
      abort.abort();
      void stopEverything().then(() => process.exit(130));
    });
  }

  try {
    const arrivals = o.arrivals === "recorded" ? "each ~3 s step's requests at one instant, as recorded" : "spread over each recorded step";
    console.log(`demo: ${records.length} requests (${o.durationS} s of trace at ${o.timeScale}x, ${arrivals}), logs in ${runDir}`);
    l.workers.forEach((_, i) => startWorker(children, l, i, runDir));
    await Promise.all(l.workers.map((w) => waitUntil(`${w.id} at ${w.ip}:${w.httpPort}`, () => workerHealthy(w.ip, w.httpPort))));
    console.log(`  ${l.workers.length} mock workers up: ${l.workers.map((w) => `${w.ip}:${w.httpPort}`).join(" ")}`);
    const [a, b, c] = l.epps as [(typeof l.epps)[0], (typeof l.epps)[0], (typeof l.epps)[0]];
    startEppReplica(children, l, a.name, [b.ip], runDir);
    startEppReplica(children, l, b.name, [a.ip], runDir);
    await Promise.all([a, b].map((e) => waitUntil(`${e.name} readiness`, () => eppReady(e.ip))));
    console.log(`  EPP replicas ready: ${a.name} ${a.ip}, ${b.name} ${b.ip} (ext_proc :${EPP_PORTS.grpc} ${o.bodyMode}, peers of each other)`);
    startGateway(children, l, [a.name, b.name], runDir);
    await waitUntil(`gateway at ${gatewayUrl(l)}`, () => gatewayHealthy(l));
    console.log(`  gateway up: ${gatewayUrl(l)} (its own process), requests: ${o.prompt === "chat" ? "/v1/chat/completions, text tokenized with Qwen3" : "/v1/completions, token ids"}`);
    let replicas = [a.name, b.name];
    const workerByEndpoint = new Map(l.workers.map((w) => [`${w.ip}:${w.httpPort}`, w.id]));
    const stats = new DemoStats(l.workers.map((w) => w.id));
    // A replica's own pick histogram, read when it stops taking traffic (SIGKILL loses it otherwise).
    const scrapeEpp = async (e: { name: string; ip: string }) => stats.eppScraped(e.name, await scrapeEppMetrics(eppMetricsUrl(e.ip)));
    // The replicas' predicted overlap over time (the final scrapes give the summary's figures).
    const eppSampler = setInterval(() => {
      for (const name of replicas) void scrapeEpp(l.epps.find((e) => e.name === name)!);
    }, 5000);
    const progress = startProgress(() => statusLine(stats, records.length));
    const sampler = setInterval(() => stats.sampleLoad(), 1000);
    let recovery: RecoveryReport | undefined;
    let midway: Promise<void> | undefined;
    // --kill-at 0: no replica is replaced.
    const killAt = o.killAt > 0 ? Math.max(1, Math.floor(records.length * o.killAt)) : undefined;

    const replaceReplica = async () => {
      progress.log(`  midway (${killAt} requests sent): draining ${a.name}, then killing it (SIGKILL) and starting ${c.name} with peers ${a.ip}, ${b.ip}`);
      replicas = replicas.filter((r) => r !== a.name);
      await setGatewayReplicas(l, replicas);
      // Read now for when its picks were made (the chart), and again once drained for all it scored.
      await scrapeEpp(a);
      // Its responses pass through its ext_proc streams: taken out of the gateway first, it is killed once
      // they have ended (as a rolling update drains), so none fails and its scrape holds all it routed.
      const drainStart = performance.now();
      const drained = await waitUntil(`${a.name} drained`, async () => {
        const m = await scrapeEppMetrics(eppMetricsUrl(a.ip));
        return !("failed" in m) && m.inflight === 0;
      }, 60_000).then(() => true, () => false);
      progress.log(`  ${a.name} ${drained ? "drained" : "still had requests in flight"} after ${((performance.now() - drainStart) / 1000).toFixed(1)} s`);
      await scrapeEpp(a);
      await children.stop(a.name, { signal: "SIGKILL" });
      stats.mark(`${a.name} killed`);
      const started = performance.now();
      startEppReplica(children, l, c.name, [a.ip, b.ip], runDir);
      try {
        await waitUntil(`${c.name} readiness`, () => eppReady(c.ip), 60_000);
        const readyMs = Math.round(performance.now() - started);
        replicas = [...replicas, c.name];
        await setGatewayReplicas(l, replicas);
        stats.mark(`${c.name} ready`);
        // How its recovery ended, from the replica itself (its log, read through a pipe, can come after its readiness).
        const outcome = await eppRecovery(c.ip).catch((e: unknown) => String(e));
        recovery = typeof outcome !== "string" && outcome.kind === "recovered"
          ? { replica: c.name, peer: outcome.peer, events: outcome.events, bytes: outcome.bytes, ms: outcome.ms, readyMs }
          : { replica: c.name, failed: `ready after ${readyMs} ms without a recovery from a peer (${typeof outcome === "string" ? outcome : outcome.kind + ("reason" in outcome ? `: ${outcome.reason}` : "")}; see ${c.name}.log)` };
      } catch (e) {
        recovery = { replica: c.name, failed: String(e) };
      }
      progress.log(`  recovery: ${recoveryText(recovery)}`);
    };

    await replay(records, {
      model: l.model,
      timeScale: o.timeScale,
      arrivals: o.arrivals,
      gateway: gatewayUrl(l),
      prompt: o.prompt,
      workerOf: (endpoint) => workerByEndpoint.get(endpoint) ?? endpoint,
      stats,
      signal: abort.signal,
      onSent: (sent) => {
        // Caught here: the replay goes on while the replacement runs, and its failure is the run's result.
        if (sent === killAt) midway = replaceReplica().catch((e: unknown) => void (recovery = { replica: c.name, failed: String(e) }));
      },
    });
    // Interrupted: the signal handler stops the children and exits 130; no summary for a partial run.
    if (abort.signal.aborted) return 130;
    await midway;
    const live = l.epps.filter((e) => children.names.includes(e.name));
    await Promise.all(live.map(scrapeEpp));
    const check = stats.lastServed && live[0] ? await selectCheck(live[0], stats.lastServed.body, stats.lastServed.worker) : undefined;
    const pdFigures = o.pd ? await scrapePdFigures(l) : undefined;
    clearInterval(sampler);
    clearInterval(eppSampler);
    progress.stop();

    // After the live run, so that it does not share the CPU with it.
    console.log(
      o.pd
        ? `\nsimulating the same ${records.length} requests on the P/D pool routed by llm-d's rule (one router) and by kv-epp (two replicas) (bench:trace --pd)`
        : `\nsimulating the same ${records.length} requests routed round-robin, by GAIE's approximate prefix scorer and by kv-epp (bench:trace's simulation)`,
    );
    const simStart = performance.now();
    const pdSimulated = o.pd ? simulatePdSlice(records, o) : [];
    const simulated = o.pd ? pdSimulated.map(pdRouted) : await simulateSlice(records, o);
    console.log(`  done in ${((performance.now() - simStart) / 1000).toFixed(1)} s`);
    const compared = [...simulated, liveFigures(stats)];
    const pdRows = pdFigures ? pdSummaryRows(pdFigures, pdSimulated) : [];

    console.log("\nsummary");
    for (const [k, v] of [...summaryRows(stats, recovery, check, simulated), ...pdRows]) console.log(`  ${k.padEnd(22)} ${v}`);
    const report = writeReport(runDir, "demo-report", demoReportData(o, stats, recovery, check, compared, pdRows), o.png);
    console.log(`\nreport: ${report.html}`);
    if (report.png) console.log(pngText(report.png));
    return demoSucceeded(stats, killAt !== undefined, recovery) ? 0 : 1;
  } finally {
    await stopEverything();
  }
}

if (process.argv.includes("--help")) {
  console.log(demoUsage());
  process.exit(0);
}
let options: DemoOptions;
try {
  options = parseDemoArgs(process.argv.slice(2));
} catch (e) {
  if (!(e instanceof ConfigError)) throw e;
  console.error(`demo: ${e.message}`);
  process.exit(2);
}
// The client runs at --stand-in-nice too, in a session of its own (children.ts, runAsStandIn); if the process
// that ran it is killed outright, it stops as on SIGTERM.
const standIn = await runAsStandIn(options.standInNice, () => process.kill(process.pid, "SIGTERM"));
if (standIn !== undefined) process.exit(standIn);
main(options).then(
  (code) => process.exit(code),
  (e: unknown) => {
    console.error(`demo failed: ${e instanceof Error ? e.message : String(e)}`);
    process.exit(1);
  },
);
