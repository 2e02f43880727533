// The simulation's kv-aware policy and the EPP's Picker, given the same index, load and scraped queues,
// choose the same worker: bench:trace measures the decision that ships. In-flight prefixes and the home
// share's bias included.
import { workerKey, type WorkerRef } from "@kv-epp/protocol";
import { describe, expect, test } from "bun:test";
import fc from "fast-check";
import { computeBlockHashes, KvIndex } from "@kv-epp/index-wasm";
import { applyStored } from "@kv-epp/index-wasm/helpers";
import { seededRandom } from "@kv-epp/testkit";
import { ActiveLoad, DEFAULT_PENDING, DEFAULT_TIMING, PendingPrefixes, prefixKeys, type CostShape } from "../upstream.ts";
import { EvictionRegret, FollowerWeight, LatencyModel, Picker, type Candidate } from "@kv-epp/routing";
import { EventQueue } from "../sim/event-queue.ts";
import type { SimRequest } from "../sim/request.ts";
import { SimWorker } from "../sim/worker.ts";
import { kvAware, kvLatency } from "./kv-aware.ts";

const BLOCK = 4;
const PROMPTS = 5;
const PROMPT_BLOCKS = 12;
const MODEL_KEY = "m:t";

/** PROMPTS distinct prompts of PROMPT_BLOCKS blocks; prompt p's token t is unique to (p, t). */
const prompts = Array.from({ length: PROMPTS }, (_, p) => Uint32Array.from({ length: PROMPT_BLOCKS * BLOCK }, (_, t) => p * 10_000 + t + 1));

const state = fc.record({
  workers: fc.integer({ min: 1, max: 6 }),
  // Per worker: how many leading blocks of each prompt it holds.
  held: fc.array(fc.array(fc.integer({ min: 0, max: PROMPT_BLOCKS }), { minLength: PROMPTS, maxLength: PROMPTS }), { minLength: 6, maxLength: 6 }),
  // Per worker: leading blocks of each prompt that requests in flight there will have computed (mostly none).
  pending: fc.array(fc.array(fc.oneof(fc.constant(0), fc.integer({ min: 0, max: PROMPT_BLOCKS })), { minLength: PROMPTS, maxLength: PROMPTS }), { minLength: 6, maxLength: 6 }),
  inflightPrefix: fc.boolean(),
  // Per worker: in-flight requests' blocks, and requests waiting at the worker.
  load: fc.array(fc.array(fc.integer({ min: 1, max: 40 }), { maxLength: 4 }), { minLength: 6, maxLength: 6 }),
  waiting: fc.array(fc.integer({ min: 0, max: 3 }), { minLength: 6, maxLength: 6 }),
  weights: fc.record({
    prefillLoadScale: fc.integer({ min: 0, max: 32 }),
    decodeLoadScale: fc.integer({ min: 0, max: 2 }),
    queueWeight: fc.integer({ min: 0, max: 50 }),
    temperature: fc.constantFrom(0, 0.3),
    shape: fc.constantFrom<CostShape>(
      { kind: "blocks" },
      { kind: "score", prefix: 3, load: 2, loadBy: "requests", prefixCapBlocks: 8 },
      { kind: "score", prefix: 1, load: 4, loadBy: "blocks", prefixCapBlocks: 0 },
    ),
  }),
  queueThreshold: fc.integer({ min: 0, max: 2 }),
  cost: fc.constantFrom("weights" as const, "latency" as const),
  followerWeight: fc.constantFrom({ base: 0, max: 0 }, { base: 1, max: 1 }, { base: 1, max: 6 }, { base: 3, max: 9 }),
  /** blocks a rank stored again after evicting them: moves the adaptive follower weight */
  regretted: fc.integer({ min: 0, max: 600 }),
  // The replica-agg peers this replica ("m") follows, and the bias away from their home shares.
  peers: fc.uniqueArray(fc.constantFrom("a", "q", "z"), { maxLength: 2 }),
  awayWeight: fc.constantFrom(0, 0.5, 2),
  request: fc.integer({ min: 0, max: PROMPTS - 1 }),
  requestBlocks: fc.integer({ min: 1, max: PROMPT_BLOCKS }),
  seed: fc.integer(),
});

describe("one decision for the EPP and the simulation", () => {
  test("for the same index, load, in-flight prefixes, queues and replica set, the kv-aware policies and the EPP's Picker choose the same worker, under either cost and either shape", () => {
    // One index for every run (a WASM instance each would pile up memory): emptied at the start of each.
    const index = KvIndex.create({ blockSize: BLOCK });
    fc.assert(
      fc.property(state, (s) => {
        for (let i = 0; i < 6; i++) index.removeWorker({ workerId: `worker-${i}`, dpRank: 0 });
        const refs: WorkerRef[] = Array.from({ length: s.workers }, (_, i) => ({ workerId: `worker-${i}`, dpRank: 0 }));
        const keys = refs.map(workerKey);
        refs.forEach((ref, w) =>
          s.held[w]!.forEach((n, p) => {
            if (n === 0) return;
            const hashes = computeBlockHashes(prompts[p]!.subarray(0, n * BLOCK), BLOCK);
            // Block hashes are the worker's own; any values distinct per (prompt, block) will do.
            const blocks = [...hashes].map((h, b) => ({ blockHash: BigInt(p * 1000 + b + 1), tokensHash: h }));
            applyStored(index, ref, null, blocks);
          }),
        );
        const load = new ActiveLoad(s.inflightPrefix ? new PendingPrefixes(DEFAULT_PENDING) : undefined);
        refs.forEach((_, w) => s.load[w]!.forEach((blocks) => load.acquire(keys[w]!, blocks)));
        refs.forEach((_, w) =>
          s.pending[w]!.forEach((n, p) => {
            if (n > 0) load.acquire(keys[w]!, n, n, prefixKeys(MODEL_KEY, computeBlockHashes(prompts[p]!.subarray(0, n * BLOCK), BLOCK)));
          }),
        );
        // Simulated workers with one running slot: s.waiting[w] + 1 submitted requests leave that many waiting.
        const queue = new EventQueue();
        const workers = refs.map((_, w) => {
          const sw = new SimWorker(w, { blockSize: BLOCK, capacityBlocks: 64, timing: { ...DEFAULT_TIMING, maxNumSeqs: 1 } }, queue, {
            onFirstToken: () => {},
            onFinished: () => {},
          });
          for (let k = 0; k <= s.waiting[w]!; k++) sw.submit(filler(k), 0);
          return sw;
        });

        const tokens = prompts[s.request]!.subarray(0, s.requestBlocks * BLOCK);
        const req: SimRequest = {
          id: 1,
          arrivalMs: 0,
          promptTokens: tokens.length,
          outputTokens: 1,
          requestBlocks: s.requestBlocks,
          tokens,
          localHashes: computeBlockHashes(tokens, BLOCK),
        };
        const regret = new EvictionRegret();
        for (let k = 0; k < s.regretted; k++) {
          regret.removed(refs[0]!, [BigInt(k + 1)]);
          regret.stored(refs[0]!, [BigInt(k + 1)]);
        }
        const replicas = () => ({ self: "m", peers: s.peers });
        const sim = (s.cost === "latency" ? kvLatency : kvAware).create({
          workers,
          workerKeys: keys,
          random: seededRandom(s.seed),
          ownLoad: load,
          pending: load.pending,
          load,
          index,
          modelKey: MODEL_KEY,
          weights: s.weights,
          latencyFollowerWeight: s.followerWeight,
          awayWeight: s.awayWeight,
          replicas,
          regret,
          queueThreshold: s.queueThreshold,
          blockSize: BLOCK,
          capacityBlocks: 64,
        });
        const candidates: Candidate[] = refs.map((r, w) => ({ key: keys[w]!, workerId: r.workerId, dpRank: 0, endpoint: keys[w]!, rankHeader: undefined }));
        const picker = new Picker({
          indexers: { lookup: () => ({ key: MODEL_KEY, blockSize: BLOCK, index }) },
          candidates: () => candidates,
          load,
          signals: (endpoint: string) => ({ running: 1, waiting: workers[keys.indexOf(endpoint)]!.waitingCount, kvUsage: 0, at: 0 }),
          options: { ...s.weights, queueThreshold: s.queueThreshold, cost: s.cost },
          replicas,
          random: seededRandom(s.seed),
          latency: new LatencyModel(undefined, new FollowerWeight(s.followerWeight.base, s.followerWeight.max, regret), s.awayWeight),
          pending: load.pending,
        });
        const epp = picker.pick({ tokens });
        if (epp.kind !== "picked") throw new Error(epp.reason);
        expect(keys[sim.pick(req)]).toBe(epp.chosen.candidate.key);
      }),
      { numRuns: 200 },
    );
  });
});

function filler(k: number): SimRequest {
  const tokens = Uint32Array.from({ length: BLOCK }, (_, t) => 900_000 + k * BLOCK + t);
  return { id: 1000 + k, arrivalMs: 0, promptTokens: tokens.length, outputTokens: 1000, requestBlocks: 1, tokens, localHashes: computeBlockHashes(tokens, BLOCK) };
}
