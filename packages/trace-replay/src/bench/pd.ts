// `bun run bench:trace --pd P,D`: the P/D pool's rows, llm-d's rule with one router against the EPP's
// with one and with N replicas sharing their load over replica-agg, on the same arrivals.
import { PD_POLICIES, replayPd, type PdPolicy, type PdRunResult } from "../sim/pd-replay.ts";
import type { TraceRecord } from "../trace.ts";
import { ms, pct } from "../report/table.ts";
import type { BenchOptions } from "./options.ts";
import { replayOptions } from "./plan.ts";

export const PD_COLUMNS = ["P/D run", "disaggregated", "prefill hit rate", "TTFT p50 ms", "TTFT p99 ms", "KV read p50 ms", "decode imbalance", "prefill imbalance"];

/** llm-d's rule as deployed (one router: its P/D guide keeps one EPP replica), then the EPP's with 1 and N replicas. */
export function pdRuns(o: BenchOptions): { policy: PdPolicy; replicas: number }[] {
  const runs: { policy: PdPolicy; replicas: number }[] = PD_POLICIES.map((policy) => ({ policy, replicas: 1 }));
  for (const replicas of o.replicas) runs.push({ policy: "kv-epp", replicas });
  return runs;
}

/** `speed`: the engine's time scale (the demo's workers' --speed); the benchmark's 1 when absent. */
export function runPdBench(trace: readonly TraceRecord[], o: BenchOptions, bucketMs: number, onDone: (r: PdRunResult) => void, speed?: number): PdRunResult[] {
  const pd = o.pd!;
  return pdRuns(o).map(({ policy, replicas }) => {
    const { workers: _w, ...base } = replayOptions(o, { policy: "kv-latency", replicas, replicaAgg: true }, bucketMs);
    const timing = speed === undefined ? base.timing : { ...base.timing, speed };
    // The KV read is an engine-side time too: it scales with the engine.
    const r = replayPd(trace, policy, { ...base, timing, ...pd, transferMsPerBlock: pd.transferMsPerBlock * (speed ?? 1) });
    onDone(r);
    return r;
  });
}

export function pdRows(results: readonly PdRunResult[]): string[][] {
  return results.map((r) => [
    r.label, pct(r.disaggregated / Math.max(1, r.requests)), pct(r.hitRate), ms(r.ttftP50Ms), ms(r.ttftP99Ms), ms(r.transferP50Ms),
    r.decodeImbalance.toFixed(2), r.prefillImbalance.toFixed(2),
  ]);
}
