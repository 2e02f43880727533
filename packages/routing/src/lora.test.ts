import { describe, expect, test } from "bun:test";
import { computeBlockHashes, KvIndex, requestBlockExtras } from "@kv-epp/index-wasm";
import { applyStored } from "@kv-epp/index-wasm/helpers";
import { workerKey } from "@kv-epp/protocol";
import { SCORE_SHAPE } from "./cost.ts";
import { explanation } from "./explain.ts";
import { LatencyModel } from "./latency.ts";
import { ActiveLoad } from "./load.ts";
import { loraAffinity, type LoraAdapters } from "./lora.ts";
import { Picker, type PickerOptions } from "./picker.ts";
import type { Candidate, WorkerSignals } from "./ports.ts";

const BLOCK = 4;
const TOKENS = Uint32Array.from({ length: 6 * BLOCK }, (_, i) => i + 1);
const adapters = (running: string[], waiting: string[], maxLora: number): LoraAdapters => ({ running: new Set(running), waiting: new Set(waiting), maxLora });

// Each rank's adapters as its engine reports them, for a request naming adapter "sql" (max_lora 1 or 2).
const RANKS: Record<string, LoraAdapters | undefined> = {
  running: adapters(["sql"], [], 1), // has it: 1
  room: adapters(["chat"], [], 2), // one slot free: 0.8
  queued: adapters(["chat"], ["sql"], 1), // already waiting to load it: 0.6
  full: adapters(["chat"], ["code"], 2), // no slot, not waiting: 0
  silent: undefined, // exports no vllm:lora_requests_info
};

const candidate = (id: string, i: number): Candidate => ({ workerId: id, dpRank: 0, key: workerKey({ workerId: id, dpRank: 0 }), endpoint: `10.0.0.${i + 1}:8000`, rankHeader: undefined });

const OPTIONS: Record<string, PickerOptions> = {
  score: { prefillLoadScale: 16, decodeLoadScale: 1, queueWeight: 0, temperature: 0, shape: SCORE_SHAPE, queueThreshold: 0, cost: "weights" },
  blocks: { prefillLoadScale: 16, decodeLoadScale: 1, queueWeight: 0, temperature: 0, shape: { kind: "blocks" }, queueThreshold: 0, cost: "weights" },
  latency: { prefillLoadScale: 16, decodeLoadScale: 1, queueWeight: 0, temperature: 0, shape: SCORE_SHAPE, queueThreshold: 0, cost: "latency" },
};

/** A pool of the named ranks, nothing cached, no load; the model "sql" names an adapter, "base" does not. */
function pick(ids: string[], options: PickerOptions, model = "sql", signals: (id: string) => WorkerSignals | undefined = (id) => ({ waiting: 0, lora: RANKS[id] })) {
  const index = KvIndex.create({ blockSize: BLOCK });
  const picker = new Picker({
    indexers: { lookup: () => ({ key: "base", blockSize: BLOCK, index }), adapterOf: (m) => (m === "sql" ? "sql" : null) },
    candidates: () => ids.map(candidate),
    load: new ActiveLoad(),
    signals: (c) => signals(c.workerId),
    options,
    latency: new LatencyModel(),
    random: () => 0,
  });
  const d = picker.pick({ model, tokens: TOKENS });
  if (d.kind !== "picked") throw new Error(d.kind);
  return { chosen: d.chosen.candidate.workerId, costs: d.scored.map((s) => s.cost), affinities: d.scored.map((s) => s.loraAffinity), explained: explanation(d) };
}

describe("LoRA affinity", () => {
  test("llm-d's tiers: running, room to load (running and waiting counted), queued, full", () => {
    expect(["running", "room", "queued", "full"].map((id) => loraAffinity(RANKS[id]!, "sql"))).toEqual([1, 0.8, 0.6, 0]);
    // Room counts the waiting adapters too: one running and one waiting fill max_lora 2.
    expect(loraAffinity(adapters(["chat"], ["code"], 3), "sql")).toBe(0.8);
    // max_lora not reported (0): no room.
    expect(loraAffinity(adapters([], [], 0), "sql")).toBe(0);
  });

  for (const [cost, options] of Object.entries(OPTIONS)) {
    test(`${cost}: a request naming an adapter goes where it runs, then where it can load, then where it waits, before a full rank`, () => {
      const o = { ...options, loraWeight: 1 };
      // Best first: a tie would go to the last (random() = 0), so each pick here is the charge's doing.
      expect(pick(["running", "room", "queued", "full"], o).chosen).toBe("running");
      expect(pick(["room", "queued", "full"], o).chosen).toBe("room");
      expect(pick(["queued", "full"], o).chosen).toBe("queued");
      expect(pick(["running", "room", "queued", "full"], o).affinities).toEqual([1, 0.8, 0.6, 0]);
    });

    test(`${cost}: no charge without an adapter, where no rank exports adapters, or at weight 0`, () => {
      const ids = ["full", "queued", "room", "running", "silent"];
      const o = { ...options, loraWeight: 1 };
      const none = pick(ids, { ...options, loraWeight: 0 });
      // The base model's request: the costs the pick makes with no LoRA term at all, every rank alike.
      const base = pick(ids, o, "base");
      expect(base.costs).toEqual(none.costs);
      expect(new Set(base.costs).size).toBe(1);
      expect(base.affinities).toEqual([undefined, undefined, undefined, undefined, undefined]);
      // No rank exports the metric: the adapter's request is costed and explained as if it named none.
      const silent = pick(ids, o, "sql", () => ({ waiting: 0 }));
      expect(silent.costs).toEqual(none.costs);
      expect(silent.affinities).toEqual(none.affinities);
      expect(silent.explained).toBe(none.explained);
    });

    test(`${cost}: a rank that reports no adapters (a failed scrape, a fresh engine) fits as badly as a full one beside ranks that report`, () => {
      const o = { ...options, loraWeight: 1 };
      const some = pick(["full", "queued", "room", "running", "silent"], o);
      expect(some.costs[4]).toBe(some.costs[0]!);
      expect(some.affinities[4]).toBe(0);
      // The silent rank is last, where a tie would go: it loses to a rank that only queues the adapter.
      const pair = pick(["queued", "silent"], o);
      expect(pair.chosen).toBe("queued");
      expect(pair.explained).toMatch(/; runner_up: worker=silent .* lora=0 cost=/);
      // Unscraped altogether (no signals) likewise.
      expect(pick(["queued", "silent"], o, "sql", (id) => (id === "silent" ? undefined : { waiting: 0, lora: RANKS[id] })).chosen).toBe("queued");
    });
  }

  test("the charge's size: score units under the score shape, the request's prefill under the blocks shape and the latency cost", () => {
    const ids = ["full", "running"];
    const charge = (o: PickerOptions) => {
      const c = pick(ids, { ...o, loraWeight: 2 }).costs;
      return c[0]! - c[1]!;
    };
    expect(charge(OPTIONS.score!)).toBeCloseTo(2);
    // 6 blocks to prefill at 16 a block, twice.
    expect(charge(OPTIONS.blocks!)).toBeCloseTo(2 * 16 * 6);
    // 24 tokens at the latency line's prior 0.1 ms a token, twice.
    expect(charge(OPTIONS.latency!)).toBeCloseTo(2 * 0.1 * 24);
  });

  // A settled pick is made on a known prefix charged as `promptTokens`, which may fall short of the prompt;
  // under these costs the LoRA charge grows with the prompt, so it must not decide another pick on the whole one.
  for (const cost of ["blocks", "latency"] as const) {
    test(`${cost}: a prefix settles only where the whole prompt is picked the same, whatever the fits and an underestimated length`, () => {
      const whole = Uint32Array.from({ length: 24 * BLOCK }, (_, i) => i + 1);
      const prefix = whole.subarray(0, 2 * BLOCK);
      const run = (fits: Record<string, LoraAdapters>) => {
        const index = KvIndex.create({ blockSize: BLOCK });
        // "holder" holds the prefix, in the adapter's identity; "other" nothing.
        const hashes = computeBlockHashes(prefix, BLOCK, requestBlockExtras(2, BLOCK, { loraName: "sql" }));
        applyStored(index, { workerId: "holder", dpRank: 0 }, null, [...hashes].map((h, i) => ({ blockHash: BigInt(i + 1), tokensHash: h })));
        const picker = new Picker({
          indexers: { lookup: () => ({ key: "base", blockSize: BLOCK, index }), adapterOf: (m) => (m === "sql" ? "sql" : null) },
          candidates: () => ["holder", "other"].map(candidate),
          load: new ActiveLoad(),
          signals: (c) => ({ waiting: 0, lora: fits[c.workerId] }),
          options: { ...OPTIONS[cost]!, shape: { kind: "blocks" }, loraWeight: 0.25 },
          latency: new LatencyModel(),
          random: () => 0,
        });
        const chosen = (req: { tokens: Uint32Array; promptTokens?: number }) => {
          const d = picker.pick({ model: "sql", ...req });
          return d.kind === "picked" ? d.chosen.candidate.workerId : d.kind;
        };
        // The prompt's length estimated at a sixth of its 24 blocks.
        const req = { model: "sql", tokens: prefix, promptTokens: 4 * BLOCK };
        return { settles: picker.settles(req), onPrefix: chosen(req), onWhole: chosen({ tokens: whole }) };
      };
      // The holder cannot take the adapter, the other runs it: the prefix's pick is the holder, the whole prompt's
      // the other (its charge, a share of the whole prefill, outgrows the cached prefix). The prefix does not settle.
      expect(run({ holder: RANKS.full!, other: RANKS.running! })).toEqual({ settles: false, onPrefix: "holder", onWhole: "other" });
      // The holder fits best: a longer prompt only widens its lead, and the prefix settles.
      expect(run({ holder: RANKS.running!, other: RANKS.full! })).toEqual({ settles: true, onPrefix: "holder", onWhole: "holder" });
    });
  }
});
