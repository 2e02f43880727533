import { loadTrace } from "./src/trace.ts";
import { replayPolicy } from "./src/sim/replay.ts";
import { POLICY_NAMES } from "./src/policies/index.ts";
const [n, cap, workers, ts, scale, lag] = (process.argv[2] ?? "1000,32768,4,1,1,10").split(",").map(Number);
const pols = (process.argv[3] ?? POLICY_NAMES.join(",")).split(",");
const trace = await loadTrace(undefined, n);
for (const p of pols) {
  const t0 = performance.now();
  const r = replayPolicy(trace, p as any, { workers: workers!, capacityBlocks: cap!, blockSize: 16, timeScale: ts!, replicas: 1, replicaAgg: true, eventLagMs: lag!, seed: 1, timing: {}, weights: { prefillLoadScale: scale!, decodeLoadScale: Number(process.env.DS ?? 1), queueWeight: 0, temperature: 0 }, bucketMs: 60000 });
  console.log(p.padEnd(14), "hit", r.hitRate.toFixed(3), "ttft p50/p99", r.ttftP50Ms.toFixed(0), r.ttftP99Ms.toFixed(0), "imb", r.imbalance.toFixed(2), r.instantImbalance.toFixed(2), "picks/s", r.picksPerSec.toFixed(0), "evicted", r.evictedBlocks, "wall", (performance.now() - t0).toFixed(0), "ms");
}
