// Ours: the EPP's routing itself (@kv-epp/routing's Picker and RoutedRequest) over the exact KV index
// fed by the workers' KV events and the load of its routing decisions, in virtual time. `kv-aware` uses
// the weighted cost (the EPP's --cost weights), `kv-latency` the lowest predicted TTFT (--cost latency),
// calibrated as in the EPP from each response's TTFT and cached tokens once it ends.
import { latencyModel, NO_METRICS, Picker, RoutedRequest, type CostModel, type RoutingContext } from "@kv-epp/routing";
import type { PolicyName, PolicySpec } from "./types.ts";

function kvPolicy(name: PolicyName, cost: CostModel, knows: string): PolicySpec {
  return {
    name,
    knows,
    usesRouterLoad: true,
    usesIndex: true,
    create(ctx) {
      const latency = latencyModel(ctx.latency, ctx.regret);
      const model = { key: ctx.modelKey, blockSize: ctx.blockSize, index: ctx.index };
      const workerOf = new Map(ctx.candidates.map((c, i) => [c.key, i]));
      const picker = new Picker({
        indexers: { lookup: () => model },
        candidates: () => ctx.candidates,
        load: ctx.load,
        // As if scraped at this instant (the EPP scrapes vLLM's num_requests_waiting every second). No LoRA
        // adapters: a simulated worker holds any mix at once, so it has no fit to report (no LoRA charge).
        signals: (c) => ({ waiting: ctx.workers[workerOf.get(c.endpoint)!]!.waitingCount }),
        options: { ...ctx.weights, queueThreshold: ctx.queueThreshold, cost, pdThresholdTokens: ctx.pdThresholdTokens },
        latency,
        pending: ctx.pending,
        replicas: ctx.replicas,
        random: ctx.random,
      });
      const routing: RoutingContext = { picker, load: ctx.ownLoad, latency, metrics: NO_METRICS, clock: ctx.clock, candidates: () => ctx.candidates };
      const inFlight = new Map<number, RoutedRequest>();
      let last = { worker: -1, overlap: 0, prefill: undefined as number | undefined };
      return {
        pick(req) {
          const r = RoutedRequest.route(routing, { tokens: req.tokens!, hashes: req.localHashes });
          if (r.kind === "no_endpoint") throw new Error(`no worker to route to (${r.reason})`);
          inFlight.set(req.id, r.request);
          const prefill = r.request.prefillCandidate;
          last = { worker: workerOf.get(r.request.candidate.key)!, overlap: r.request.decision.chosen.overlap, prefill: prefill && workerOf.get(prefill.key) };
          return last.worker;
        },
        matchedBlocks: (worker) => (worker === last.worker ? last.overlap : 0),
        prefillWorker: () => last.prefill,
        firstToken(req) {
          inFlight.get(req.id)?.firstByte();
        },
        finished(req, _worker, seen) {
          inFlight.get(req.id)?.end(seen);
          inFlight.delete(req.id);
        },
      };
    },
  };
}

export const kvAware = kvPolicy("kv-aware", "weights", "KV index from the workers' events + load of routing decisions (the EPP's Picker, --cost weights)");
export const kvLatency = kvPolicy("kv-latency", "latency", "KV index + the EPP's LatencyModel calibrated from observed TTFTs: lowest predicted TTFT (--cost latency)");
