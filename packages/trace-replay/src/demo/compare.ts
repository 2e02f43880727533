// What KV-aware routing bought, on the demo's own requests: the same trace slice replayed in
// bench:trace's simulation (virtual time, no processes) under what people run today, round-robin and
// GAIE's approximate prefix scorer, and under the EPP's own decision, beside the live run's figures.
// The simulation is built through bench:trace's own options, so its defaults (event lag, in-flight
// prefixes, replica-agg, cost) are the benchmark's; only the cluster's shape comes from the demo.
import { parseBenchArgs } from "../bench/options.ts";
import { bucketMsFor, replayOptions, type RunSpec } from "../bench/plan.ts";
import { runAll } from "../bench/runner.ts";
import { runPdBench } from "../bench/pd.ts";
import type { PdRunResult } from "../sim/pd-replay.ts";
import { DEFAULT_POLICY } from "../policies/index.ts";
import type { TraceRecord } from "../trace.ts";
import type { DemoOptions } from "./options.ts";
import type { DemoStats } from "./stats.ts";

/** One way of routing the slice and what it gave. */
export type RoutedFigures = {
  name: string;
  /** measured in this run's processes, or replayed in the simulation */
  source: "live" | "simulated";
  hitRate: number;
  ttftP50Ms: number;
  ttftP99Ms: number;
};

/**
 * The simulated runs, today's routing first. approx-prefix runs as one router: GAIE's default HA mode
 * is active-passive (one leader routes everything); the EPP's policy runs as the demo's two replicas,
 * sharing their load over replica-agg.
 */
const SIMULATED: (RunSpec & { name: string })[] = [
  { name: "round-robin", policy: "round-robin", replicas: 1, replicaAgg: true },
  { name: "approx-prefix (GAIE-style)", policy: "approx-prefix", replicas: 1, replicaAgg: true },
  { name: "kv-epp", policy: DEFAULT_POLICY, replicas: 2, replicaAgg: true },
];

/**
 * The slice (the trace's first `records.length` records, as the demo takes them) replayed under each
 * simulated policy, side by side on bench:trace's worker threads, with the demo's workers, caches,
 * block size, engine speed and arrivals.
 */
export async function simulateSlice(records: readonly TraceRecord[], o: DemoOptions): Promise<RoutedFigures[]> {
  const bench = parseBenchArgs([
    "--workers", String(o.workers),
    "--capacity-blocks", String(o.capacityBlocks),
    "--block-size", String(o.blockSize),
    "--time-scale", String(o.timeScale),
    "--arrivals", o.arrivals,
    "--png", "off",
  ]);
  const bucketMs = bucketMsFor(records, o.timeScale);
  const tasks = SIMULATED.map((run) => {
    const opts = replayOptions(bench, run, bucketMs);
    // The mock workers' engine runs at the demo's --speed; the simulated one at the same.
    return { tracePath: o.tracePath, limit: records.length, policy: run.policy, opts: { ...opts, timing: { ...opts.timing, speed: o.speed } } };
  });
  const results = await runAll(tasks);
  return results.map((r, i) => {
    if (r.requests !== records.length) throw new Error(`the simulation replayed ${r.requests} requests, the demo sent ${records.length}`);
    return { name: SIMULATED[i]!.name, source: "simulated", hitRate: r.hitRate, ttftP50Ms: r.ttftP50Ms, ttftP99Ms: r.ttftP99Ms };
  });
}

/**
 * A P/D demo's slice in bench:trace's P/D simulation (`--pd`): llm-d's rule with one router, the EPP's
 * with the demo's two replicas over replica-agg, on the demo's prefill and decode workers.
 */
export function simulatePdSlice(records: readonly TraceRecord[], o: DemoOptions): PdRunResult[] {
  const prefills = Math.floor(o.workers / 2);
  const bench = parseBenchArgs([
    "--capacity-blocks", String(o.capacityBlocks),
    "--block-size", String(o.blockSize),
    "--time-scale", String(o.timeScale),
    "--arrivals", o.arrivals,
    "--pd", `${prefills},${o.workers - prefills}`,
    "--replicas", "2",
    "--png", "off",
  ]);
  const results = runPdBench(records, bench, bucketMsFor(records, o.timeScale), () => {}, o.speed).filter((r) => r.policy === "llm-d" || r.replicas === 2);
  for (const r of results) if (r.requests !== records.length) throw new Error(`the simulation replayed ${r.requests} requests, the demo sent ${records.length}`);
  return results;
}

/** A P/D simulated run as the comparison table and chart name it. */
export const pdRouted = (r: PdRunResult): RoutedFigures => ({ name: r.label, source: "simulated", hitRate: r.hitRate, ttftP50Ms: r.ttftP50Ms, ttftP99Ms: r.ttftP99Ms });

export function liveFigures(s: DemoStats): RoutedFigures {
  return { name: "kv-epp", source: "live", hitRate: s.hitRate, ttftP50Ms: s.ttftP(0.5), ttftP99Ms: s.ttftP(0.99) };
}

/** How a run is named in the table and the chart's legend. */
export const routedLabel = (f: RoutedFigures) => `${f.name}, ${f.source === "live" ? "live run" : "simulated"}`;
