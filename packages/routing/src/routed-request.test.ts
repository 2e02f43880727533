import { describe, expect, spyOn, test } from "bun:test";
import { computeBlockHashes, KvIndex } from "@kv-epp/index-wasm";
import { applyStored } from "@kv-epp/index-wasm/helpers";
import { workerKey, type WorkerRef } from "@kv-epp/protocol";
import { LatencyModel } from "./latency.ts";
import { ActiveLoad } from "./load.ts";
import type { PendingView } from "./pending.ts";
import { SCORE_SHAPE } from "./cost.ts";
import type { ReplicaSet } from "./home.ts";
import { Picker, type PickerOptions, type PickRequest } from "./picker.ts";
import { NO_METRICS, type Candidate } from "./ports.ts";
import { RoutingQuality } from "./quality.ts";
import { RoutedRequest, type RoutingContext } from "./routed-request.ts";
import { UsageScan } from "./usage-scan.ts";

const BLOCK = 4;
const A: WorkerRef = { workerId: "a", dpRank: 0 };
const B: WorkerRef = { workerId: "b", dpRank: 0 };
const candidate = (w: WorkerRef, endpoint: string): Candidate => ({ ...w, key: workerKey(w), endpoint, rankHeader: undefined });
const CANDIDATES = [candidate(A, "10.0.0.1:8000"), candidate(B, "10.0.0.2:8000")];
const TOKENS = Uint32Array.from({ length: 4 * BLOCK }, (_, i) => i + 1);

/** Rank A holds the prompt's first two blocks; a clock whose timers the test fires. */
function context(o: { quality?: RoutingQuality; pending?: PendingView; temperature?: number; candidates?: Candidate[] } = {}) {
  const candidates = o.candidates ?? CANDIDATES;
  const index = KvIndex.create({ blockSize: BLOCK });
  const hashes = computeBlockHashes(TOKENS.subarray(0, 2 * BLOCK), BLOCK);
  applyStored(index, A, null, [...hashes].map((h, i) => ({ blockHash: BigInt(i + 1), tokensHash: h })));
  const load = new ActiveLoad();
  const latency = new LatencyModel();
  const timers: (() => void)[] = [];
  const cancelled: (() => void)[] = [];
  let now = 0;
  const picker = new Picker({
    indexers: { lookup: () => ({ key: "m", blockSize: BLOCK, index }) },
    candidates: () => candidates,
    load,
    signals: () => undefined,
    options: { prefillLoadScale: 16, decodeLoadScale: 1, queueWeight: 0, temperature: o.temperature ?? 0, shape: { kind: "blocks" }, queueThreshold: 0, cost: "weights" },
    latency,
    pending: o.pending,
    random: () => 0,
  });
  const ctx: RoutingContext = {
    picker, load, latency, metrics: NO_METRICS, quality: o.quality, candidates: () => candidates,
    clock: { now: () => now, after: (_ms, fn) => (timers.push(fn), () => void cancelled.push(fn)) },
  };
  const route = (req: { tokens: Uint32Array; promptTokens?: number; newTurnTokens?: number } = { tokens: TOKENS }) => {
    const r = RoutedRequest.route(ctx, req);
    if (r.kind !== "routed") throw new Error(r.reason);
    return r.request;
  };
  return { load, latency, timers, cancelled, route, picker, tick: (ms: number) => (now += ms) };
}

describe("a routed request's life", () => {
  test("routing takes a lease on the pick: its blocks, and the blocks it still prefills until its first byte", () => {
    const { load, route } = context();
    const r = route();
    expect(r.candidate.key).toBe(workerKey(A));
    expect(load.of(workerKey(A))).toEqual({ requests: 1, blocks: 4, prefillBlocks: 2, prefillRequests: 1 });
    r.responseBody(new Uint8Array([1]));
    expect(load.of(workerKey(A))).toMatchObject({ requests: 1, prefillBlocks: 0 });
    r.end();
    r.end();
    expect(load.of(workerKey(A)).requests).toBe(0);
    expect(load.inflight).toBe(0);
  });

  test("routed on a known prefix (past the tokenization budget): the prefix is matched, the whole prompt is charged", () => {
    const { load, route } = context();
    // The prefix's first two blocks are A's; the prompt is estimated at 10 blocks.
    const r = route({ tokens: TOKENS.subarray(0, 3 * BLOCK), promptTokens: 10 * BLOCK + 1 });
    expect(r.candidate.key).toBe(workerKey(A));
    expect(r.decision).toMatchObject({ requestBlocks: 10, promptTokens: 10 * BLOCK + 1, chosen: { overlap: 2 } });
    expect(load.of(workerKey(A))).toEqual({ requests: 1, blocks: 10, prefillBlocks: 8, prefillRequests: 1 });
    // An estimate below the prefix never shrinks the request.
    expect(route({ tokens: TOKENS, promptTokens: 1 }).decision).toMatchObject({ requestBlocks: 4, promptTokens: 4 * BLOCK });
  });

  test("a known prefix settles the match once one of its full blocks is held nowhere, in the index or in flight", () => {
    const { picker } = context();
    const settles = (tokens: Uint32Array, cacheSalt?: string) => picker.settles({ model: "m", cacheSalt, tokens, promptTokens: 100 * BLOCK });
    // A holds the first two blocks: a third full block is held by no one.
    expect(settles(TOKENS)).toBe(true);
    expect(settles(TOKENS.subarray(0, 3 * BLOCK))).toBe(true);
    // A partial block counts for nothing; no full block, nothing settled.
    expect(settles(TOKENS.subarray(0, BLOCK - 1))).toBe(false);
    // In another identity (a cache salt) the blocks are other blocks: nothing held.
    expect(settles(TOKENS.subarray(0, 2 * BLOCK), "tenant")).toBe(true);
    // A request in flight on B with the whole prompt keeps it open (B, loaded, is not chosen: it may still win).
    const inFlight = context({ pending: { overlapsInto: (_keys, out) => {
      out.clear();
      out.set(workerKey(B), 4);
    } } });
    inFlight.load.acquire(workerKey(B), 400);
    expect(inFlight.picker.settles({ model: "m", tokens: TOKENS, promptTokens: 100 * BLOCK })).toBe(false);
  });

  test("a prefix every full block of which is held settles only when the one candidate holding it all is chosen outright", () => {
    const prefix = TOKENS.subarray(0, 2 * BLOCK);
    const req = { model: "m", tokens: prefix, promptTokens: 100 * BLOCK };
    // A alone holds the prefix and is the cheaper: more tokens can only lengthen A's overlap. Its overlap is a lower bound.
    const alone = context();
    expect(alone.picker.settles(req)).toBe(true);
    const d = alone.picker.pick(req);
    expect(d.kind === "picked" && d.chosen).toMatchObject({ overlap: 2, openEnded: true });
    expect(d.kind === "picked" && d.scored.find((s) => s.candidate.key === workerKey(B))).toMatchObject({ overlap: 0, openEnded: false });
    // A known prefix without a full block tells nothing of what a candidate holds.
    const blockless = alone.picker.pick({ model: "m", tokens: TOKENS.subarray(0, BLOCK - 1), promptTokens: 100 * BLOCK });
    expect(blockless.kind === "picked" && blockless.scored.some((s) => s.openEnded)).toBe(false);
    // The whole prompt known: nothing is open-ended.
    const whole = alone.picker.pick({ model: "m", tokens: TOKENS });
    expect(whole.kind === "picked" && whole.chosen.openEnded).toBe(false);
    // A loaded until B is chosen: A's overlap may still grow past B's cost.
    const loaded = context();
    loaded.load.acquire(workerKey(A), 200);
    expect(loaded.picker.pick(req)).toMatchObject({ chosen: { candidate: { key: workerKey(B) } } });
    expect(loaded.picker.settles(req)).toBe(false);
    // B holds the prefix too (in flight): either may pull ahead.
    const both = context({ pending: { overlapsInto: (_keys, out) => {
      out.clear();
      out.set(workerKey(B), 2);
    } } });
    expect(both.picker.settles(req)).toBe(false);
    // A choice sampled at a temperature may change with any cost.
    expect(context({ temperature: 0.5 }).picker.settles(req)).toBe(false);
  });

  // Terms of the costs that move with the prompt's length: a prefix charged at an underestimated length settles
  // only where the whole prompt is picked the same. A holds the 4-block known prefix; the prompt is estimated at
  // 5 blocks and is 40.
  const lengthCase = (options: Partial<PickerOptions>, replicas?: ReplicaSet, loadA = 0) => {
    const whole = Uint32Array.from({ length: 40 * BLOCK }, (_, i) => i + 1);
    const prefix = whole.subarray(0, 4 * BLOCK);
    const index = KvIndex.create({ blockSize: BLOCK });
    applyStored(index, A, null, [...computeBlockHashes(prefix, BLOCK)].map((h, i) => ({ blockHash: BigInt(i + 1), tokensHash: h })));
    const load = new ActiveLoad();
    if (loadA > 0) load.acquire(workerKey(A), loadA);
    const picker = new Picker({
      indexers: { lookup: () => ({ key: "m", blockSize: BLOCK, index }) },
      candidates: () => CANDIDATES,
      load,
      signals: () => undefined,
      options: { prefillLoadScale: 16, decodeLoadScale: 1, queueWeight: 0, temperature: 0, queueThreshold: 0, ...options },
      latency: new LatencyModel(),
      replicas: () => replicas,
      random: () => 0,
    });
    const chosen = (req: PickRequest) => {
      const d = picker.pick(req);
      return d.kind === "picked" ? d.chosen.candidate.workerId : d.kind;
    };
    const req = { model: "m", tokens: prefix, promptTokens: 5 * BLOCK };
    return { settles: picker.settles(req), onPrefix: chosen(req), onWhole: chosen({ model: "m", tokens: whole }) };
  };

  test("score shape: a prefix settles only if its holder's lead survives the prefix share of a longer prompt (taken at the cap)", () => {
    const score = { cost: "weights", shape: SCORE_SHAPE } as const;
    // A is the busier: its 4/5 share outweighs B's load lead on the estimate, its 4/40 share does not on the whole prompt.
    expect(lengthCase(score, undefined, 100)).toEqual({ settles: false, onPrefix: "a", onWhole: "b" });
    // Loads equal: A's lead is its share alone, which stays above 0 at the cap.
    expect(lengthCase(score)).toEqual({ settles: true, onPrefix: "a", onWhole: "a" });
  });

  test("latency cost: a prefix settles only if its holder is home or the others are away too (the away charge grows with the prompt)", () => {
    const latency = { cost: "latency", shape: { kind: "blocks" } } as const;
    // Two replicas deal the ranks out by key: a to r1, b to r2. Seen from r2, the holder A is away and B home.
    expect(lengthCase(latency, { self: "r2", peers: ["r1"] })).toEqual({ settles: false, onPrefix: "a", onWhole: "b" });
    expect(lengthCase(latency, { self: "r1", peers: ["r2"] })).toEqual({ settles: true, onPrefix: "a", onWhole: "a" });
  });

  test("a pick on a prefix its worker holds whole counts as prefill only the chat's new turn, when its length is known", () => {
    const prefix = TOKENS.subarray(0, 2 * BLOCK);
    const charged = (req: { tokens: Uint32Array; promptTokens: number; newTurnTokens?: number }) => {
      const { load, route } = context();
      route(req);
      return load.of(workerKey(A));
    };
    // A holds the whole known prefix (2 blocks) of a 100-block prompt whose last turn is ~5 blocks.
    expect(charged({ tokens: prefix, promptTokens: 100 * BLOCK, newTurnTokens: 5 * BLOCK - 1 })).toMatchObject({ blocks: 100, prefillBlocks: 5 });
    // Without the turn's length: everything past the known prefix.
    expect(charged({ tokens: prefix, promptTokens: 100 * BLOCK })).toMatchObject({ blocks: 100, prefillBlocks: 98 });
    // A worker whose overlap ends inside the known prefix prefills everything past it, whatever the turn.
    expect(charged({ tokens: TOKENS, promptTokens: 100 * BLOCK, newTurnTokens: 5 * BLOCK })).toMatchObject({ blocks: 100, prefillBlocks: 98 });
    // A turn of no tokens still computes its last block.
    expect(charged({ tokens: prefix, promptTokens: 100 * BLOCK, newTurnTokens: 0 })).toMatchObject({ prefillBlocks: 1 });
    // Both hold the known prefix (a fallback on a short one): nothing says A holds the rest, all of it counts.
    const { load, route } = context({ pending: { overlapsInto: (_keys, out) => {
      out.clear();
      out.set(workerKey(B), 2);
    } } });
    const r = route({ tokens: prefix, promptTokens: 100 * BLOCK, newTurnTokens: 5 * BLOCK });
    expect(load.of(r.candidate.key)).toMatchObject({ blocks: 100, prefillBlocks: 98 });
  });

  test("a response that shows no byte stops counting as prefill at its deadline", () => {
    const { load, timers, route } = context();
    route();
    expect(timers).toHaveLength(1);
    timers[0]!();
    expect(load.of(workerKey(A))).toMatchObject({ requests: 1, prefillBlocks: 0, prefillRequests: 0 });
  });

  test("an answered request leaves no timer behind: its first byte, or its end before one, cancels its deadline", () => {
    const { timers, cancelled, route } = context();
    route().responseBody(new Uint8Array([1]));
    route().end();
    expect(timers).toHaveLength(2);
    expect(cancelled).toEqual(timers);
  });

  test("served by another endpoint: the load moves to the rank there, its prefill as far as it got; an unknown endpoint leaves it", () => {
    const { load, route } = context();
    const r = route();
    expect(r.servedBy("10.9.9.9:8000")).toBe("unknown_endpoint");
    expect(load.of(workerKey(A)).requests).toBe(1);
    expect(r.servedBy("10.0.0.2:8000")).toBe("moved");
    expect(load.of(workerKey(A)).requests).toBe(0);
    // B holds none of the prompt (A held two blocks): all four are its prefill.
    expect(load.of(workerKey(B))).toEqual({ requests: 1, blocks: 4, prefillBlocks: 4, prefillRequests: 1 });
    expect(r.servedBy("10.0.0.2:8000")).toBeUndefined();
    r.end();
    expect(load.inflight).toBe(0);
  });

  test("the endpoints: the pick first, then the next-best distinct ones", () => {
    const { route } = context();
    const r = route();
    expect(r.endpoints(0)).toEqual(["10.0.0.1:8000"]);
    expect(r.endpoints(3)).toEqual(["10.0.0.1:8000", "10.0.0.2:8000"]);
  });

  test("data-parallel ranks: the fallbacks are endpoints whose rank takes the pick's rank header, and a fallback's load lands on that rank", () => {
    // Rank A (a:0) behind 10.0.0.1 as its server's rank 0; server 10.0.0.2 fronts global ranks 2 and 3 as its 1 and 0
    // (listed in that order); 10.0.0.3 serves one rank, no header; 10.0.0.4's only rank is its server's rank 1.
    const rankOf = (workerId: string, dpRank: number, endpoint: string, rankHeader: number | undefined): Candidate =>
      ({ workerId, dpRank, key: workerKey({ workerId, dpRank }), endpoint, rankHeader });
    const b3 = rankOf("b", 3, "10.0.0.2:8000", 1);
    const b2 = rankOf("b", 2, "10.0.0.2:8000", 0);
    const candidates = [
      rankOf("a", 0, "10.0.0.1:8000", 0), b3, b2, rankOf("c", 0, "10.0.0.3:8000", undefined), rankOf("d", 1, "10.0.0.4:8000", 1),
    ];
    const { load, route } = context({ candidates });
    const r = route();
    expect(r.candidate.key).toBe(workerKey(A));
    // The one x-data-parallel-rank the gateway sends (0) names a rank at the fallback too.
    expect(r.endpoints(4)).toEqual(["10.0.0.1:8000", "10.0.0.2:8000"]);
    expect(r.servedBy("10.0.0.2:8000")).toBe("moved");
    expect(load.of(b2.key).requests).toBe(1);
    expect(load.of(b3.key).requests).toBe(0);
  });

  test("its end calibrates the latency model once: from what the runner reports, or from the watched response", () => {
    const reported = context();
    reported.route().end({ ttftMs: 30, cachedTokens: 8 });
    expect(reported.latency.params().samples).toBe(1);

    const watched = context({ quality: new RoutingQuality(NO_METRICS) });
    const r = watched.route();
    r.responseHeaders("text/event-stream", true);
    watched.tick(12);
    r.responseBody(new TextEncoder().encode('data: {"choices":[],"usage":{"prompt_tokens":16,"prompt_tokens_details":{"cached_tokens":8}}}\n\n'));
    r.end();
    r.end();
    expect(watched.latency.params().samples).toBe(1);
  });

  test("its response's usage is read once, with or without a quality watch", () => {
    const usage = '{"usage":{"prompt_tokens":64,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":32}}}';
    const add = spyOn(UsageScan.prototype, "add");
    try {
      for (const quality of [undefined, new RoutingQuality(NO_METRICS)]) {
        add.mockClear();
        const r = context({ quality }).route();
        r.responseHeaders("application/json", true);
        r.responseBody(new TextEncoder().encode(usage));
        expect(r.usage()).toEqual({ promptTokens: 64, completionTokens: 5, cachedTokens: 32 });
        expect(add).toHaveBeenCalledTimes(1);
        r.end();
      }
    } finally {
      add.mockRestore();
    }
  });
});
