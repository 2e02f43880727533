// `bun run demo --pd`: what the P/D pool did, read from its processes at the end of the run: how many
// requests each decode worker's sidecar disaggregated or kept local (its /sidecar/metrics), where the
// prompts were computed and read (each worker's vllm:prompt_tokens_by_source_total), and what each
// worker's cache holds (its ground truth, /admin/cache).
import { ms, pct } from "../report/table.ts";
import type { PdRunResult } from "../sim/pd-replay.ts";
import type { ClusterLayout } from "./cluster.ts";
import { samples } from "./epp-metrics.ts";

export type PdWorkerFigures = {
  id: string;
  role: "prefill" | "decode";
  /** prompt tokens by where their KV came from (vLLM's prompt_tokens_by_source) */
  computed: number;
  cacheHit: number;
  transferred: number;
  /** blocks its cache holds (ground truth) */
  blocks: number;
};

export type PdFigures = { disaggregated: number; local: number; sidecarFailures: number; workers: PdWorkerFigures[] } | { failed: string };

const fetchText = async (url: string) => {
  try {
    const res = await fetch(url, { signal: AbortSignal.timeout(10_000) });
    if (!res.ok) throw new Error(`HTTP ${res.status}`);
    return await res.text();
  } catch (e) {
    throw new Error(`${url}: ${e instanceof Error ? e.message : String(e)}`);
  }
};

export async function scrapePdFigures(l: ClusterLayout): Promise<PdFigures> {
  try {
    let disaggregated = 0, local = 0, sidecarFailures = 0;
    const workers: PdWorkerFigures[] = [];
    for (const w of l.workers) {
      if (!w.role) continue;
      const base = `http://${w.ip}:${w.enginePort ?? w.httpPort}`;
      if (w.role === "decode") {
        const own = await fetchText(`http://${w.ip}:${w.httpPort}/sidecar/metrics`);
        for (const s of samples(own, "pd_sidecar_requests_total")) {
          if (s.labels.mode === "disaggregated") disaggregated += s.value;
          if (s.labels.mode === "local") local += s.value;
        }
        for (const s of samples(own, "pd_sidecar_failures_total")) if (s.labels.reason !== "passthrough_unreachable") sidecarFailures += s.value;
      }
      const bySource = samples(await fetchText(`${base}/metrics`), "vllm:prompt_tokens_by_source_total");
      const source = (name: string) => bySource.filter((s) => s.labels.source === name).reduce((a, s) => a + s.value, 0);
      const truthText = await fetchText(`${base}/admin/cache`);
      let truth: { ranks: { blocks: unknown[] }[] };
      try {
        truth = JSON.parse(truthText) as typeof truth;
      } catch (e) {
        throw new Error(`${base}/admin/cache: not JSON (${truthText.length} bytes): ${(e as Error).message}`);
      }
      workers.push({
        id: w.id, role: w.role, computed: source("local_compute"), cacheHit: source("local_cache_hit"), transferred: source("external_kv_transfer"),
        blocks: truth.ranks.reduce((a, r) => a + r.blocks.length, 0),
      });
    }
    return { disaggregated, local, sidecarFailures, workers };
  } catch (e) {
    return { failed: e instanceof Error ? e.message : String(e) };
  }
}

/** The summary's P/D lines: the live pool, then the simulated pool on the same requests. */
export function pdSummaryRows(f: PdFigures, simulated: readonly PdRunResult[]): [string, string][] {
  const sim = simulated.map((r) => `${r.label}: ${pct(r.disaggregated / Math.max(1, r.requests))} disaggregated, prefill hit rate ${pct(r.hitRate)}, TTFT p50 ${ms(r.ttftP50Ms)} ms, p99 ${ms(r.ttftP99Ms)} ms, KV read p50 ${ms(r.transferP50Ms)} ms, decode imbalance ${r.decodeImbalance.toFixed(2)}`);
  const simRow: [string, string] = ["P/D simulated", sim.join("; ") || "not run"];
  if ("failed" in f) return [["P/D pool", `not scraped: ${f.failed}`], simRow];
  const of = (role: "prefill" | "decode") => f.workers.filter((w) => w.role === role);
  const sum = (ws: PdWorkerFigures[], k: "computed" | "cacheHit" | "transferred") => ws.reduce((a, w) => a + w[k], 0);
  const prefills = of("prefill"), decodes = of("decode");
  const worker = (w: PdWorkerFigures) => `${w.id}: computed ${w.computed}, cache hit ${w.cacheHit}, read ${w.transferred} tokens, holds ${w.blocks} blocks`;
  const pHit = sum(prefills, "cacheHit") / Math.max(1, sum(prefills, "cacheHit") + sum(prefills, "computed"));
  return [
    ["P/D requests", `${f.disaggregated} prefilled on a prefill worker, ${f.local} kept on their decode worker, ${f.sidecarFailures} failed in a sidecar (the decode workers' P/D sidecars)`],
    ["P/D prefill hit rate", `${pct(pHit)} of the prefill workers' prompt tokens found in their caches`],
    ["P/D where prompts ran", [...prefills, ...decodes].map(worker).join("; ") + " (vllm:prompt_tokens_by_source_total; blocks: /admin/cache)"],
    simRow,
  ];
}
