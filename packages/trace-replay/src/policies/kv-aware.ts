// Ours: the EPP's decision (epp picker/decide.ts) over the exact KV index (fed by the workers' KV
// events) and the load of its routing decisions. `kv-aware` uses the weighted cost (the EPP's
// --cost weights), `kv-latency` the lowest predicted TTFT of the EPP's LatencyModel (--cost latency),
// calibrated as in the EPP from each response's TTFT and cached tokens once it ends.
import { findMatches } from "@kv-epp/index-wasm/helpers";
import { AwayWorkers, decide, FollowerWeight, LatencyModel, overlapOf, prefillBlocksOf, prefixKeys, ttftInput, type CostModel, type TtftInput } from "../upstream.ts";
import { withRouterLoad, type LeaseShape } from "./router-load.ts";
import type { PolicyName, PolicySpec } from "./types.ts";

function kvPolicy(name: PolicyName, model: CostModel, knows: string): PolicySpec {
  return {
    name,
    knows,
    usesRouterLoad: true,
    usesIndex: true,
    create(ctx) {
      const follower = ctx.latencyFollowerWeight;
      const latency = new LatencyModel(undefined, new FollowerWeight(follower.base, follower.max, ctx.regret), ctx.awayWeight);
      const awayWorkers = new AwayWorkers();
      /** What the chosen worker's TTFT was predicted from, per request in flight: the calibration sample. */
      const inputAtPick = new Map<number, TtftInput>();
      // In-flight prefixes, as the EPP's Picker reads them: the picked request's keys go with its lease.
      const pending = ctx.pending;
      const pendingOverlaps = new Map<string, number>();
      let picked: { id: number; lease: LeaseShape } | undefined;
      const router = withRouterLoad(ctx, (req) => {
        const { scores } = findMatches(ctx.index, req.localHashes);
        const keys = pending ? prefixKeys(ctx.modelKey, req.localHashes) : undefined;
        if (keys) pending!.overlapsInto(keys, pendingOverlaps);
        const candidates = ctx.workerKeys.map((key, i) => ({
          index: i,
          key,
          endpoint: key,
          overlap: scores.get(key) ?? 0,
          pendingOverlap: pendingOverlaps.get(key) ?? 0,
          activeBlocks: ctx.load.of(key).blocks,
          activeRequests: ctx.load.of(key).requests,
          prefillBlocks: ctx.load.of(key).prefillBlocks,
          prefillRequests: ctx.load.of(key).prefillRequests,
          // As if scraped at this instant (the EPP scrapes vLLM's num_requests_waiting every second).
          waiting: ctx.workers[i]!.waitingCount,
        }));
        // Only the latency cost reads the replica set (as in the EPP's Picker).
        let cost: ((c: (typeof candidates)[number]) => number) | undefined;
        if (model === "latency") {
          const away = awayWorkers.of(candidates, ctx.replicas?.());
          cost = (c) => latency.costMs(ttftInput(c, req.promptTokens, ctx.blockSize), away(c.key));
        }
        const d = decide({
          requestBlocks: req.requestBlocks,
          candidates,
          weights: ctx.weights,
          queueThreshold: ctx.queueThreshold,
          random: ctx.random,
          latency: cost,
        });
        if (d.kind === "none") throw new Error(`no worker to route to (${d.reason})`);
        const chosen = d.chosen.candidate;
        inputAtPick.set(req.id, ttftInput(chosen, req.promptTokens, ctx.blockSize));
        // The lease the EPP takes: the blocks the chosen worker still prefills, the prefix keys.
        picked = { id: req.id, lease: { prefillBlocks: prefillBlocksOf(req.requestBlocks, overlapOf(chosen)), prefix: keys } };
        return chosen.index;
      }, (req) => (picked?.id === req.id ? picked.lease : undefined));
      return {
        ...router,
        finished(req, worker, seen) {
          router.finished?.(req, worker, seen);
          const at = inputAtPick.get(req.id);
          inputAtPick.delete(req.id);
          latency.observe({ ttftMs: seen.ttftMs, uncachedTokens: req.promptTokens - seen.cachedTokens, aheadTokens: at?.aheadTokens ?? 0, waiting: at?.waiting ?? 0 });
        },
      };
    },
  };
}

export const kvAware = kvPolicy("kv-aware", "weights", "KV index from the workers' events + load of routing decisions (the EPP's decide(), --cost weights)");
export const kvLatency = kvPolicy("kv-latency", "latency", "KV index + the EPP's LatencyModel calibrated from observed TTFTs: lowest predicted TTFT (--cost latency)");
