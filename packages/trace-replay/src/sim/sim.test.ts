import { describe, expect, test } from "bun:test";
import { DEFAULT_TIMING } from "@kv-epp/mock-worker";
import type { TraceRecord } from "../trace.ts";
import { EventQueue } from "./event-queue.ts";
import { Recorder, percentile } from "./recorder.ts";
import { cacheBounds } from "./bounds.ts";
import { adapterOf } from "./lora-mix.ts";
import { burstArrivals, replayPolicy, type ReplayOptions } from "./replay.ts";

const OPTS: ReplayOptions = {
  workers: 4,
  // Holds a few conversations per worker, not all of them.
  capacityBlocks: 1500,
  blockSize: 16,
  timeScale: 1,
  replicas: 1,
  replicaAgg: true,
  eventLagMs: 10,
  seed: 1,
  timing: DEFAULT_TIMING,
  weights: { prefillLoadScale: 1, decodeLoadScale: 1, queueWeight: 0, temperature: 0 },
  bucketMs: 10_000,
};

/**
 * Conversations whose turns grow their own prefix (ids unique per conversation, a shared first block),
 * a new turn every 5 s: the shape of the Mooncake trace, small enough for a unit test.
 */
function conversations(n: number, turns: number): TraceRecord[] {
  const out: TraceRecord[] = [];
  let nextId = 1;
  const convs = Array.from({ length: n }, () => [0] as number[]);
  for (let t = 0; t < turns; t++) {
    convs.forEach((ids, c) => {
      ids.push(nextId++, nextId++);
      out.push({ timestamp: t * 5000 + c * 50, inputLength: ids.length * 512 - 100, outputLength: 20, hashIds: [...ids] });
    });
  }
  return out.sort((a, b) => a.timestamp - b.timestamp);
}

describe("LoRA mix", () => {
  test("a conversation keeps the adapter of its first turn; about half the conversations run on the base model", () => {
    const turns = conversations(200, 2);
    const first = new Map<number, string>();
    for (const r of turns) {
      const name = adapterOf(r, 4)?.name ?? "base";
      const known = first.get(r.hashIds[1]!);
      if (known === undefined) first.set(r.hashIds[1]!, name);
      else expect(name).toBe(known);
    }
    const names = [...first.values()];
    const base = names.filter((n) => n === "base").length;
    expect(base).toBeGreaterThan(60);
    expect(base).toBeLessThan(140);
    expect(new Set(names).size).toBe(5);
    expect(adapterOf(turns[0]!, 0)).toBeNull();
  });
});

describe("event queue", () => {
  test("runs events in time order, equal times in scheduling order, up to the bound", () => {
    const q = new EventQueue();
    const seen: string[] = [];
    q.schedule(30, () => seen.push("c"));
    q.schedule(10, () => seen.push("a1"));
    q.schedule(10, (now) => {
      seen.push("a2");
      q.schedule(now + 5, () => seen.push("b"));
    });
    q.schedule(40, () => seen.push("d"));
    q.runUntil(30);
    expect(seen).toEqual(["a1", "a2", "b", "c"]);
    expect(q.now).toBe(30);
    expect(q.size).toBe(1);
  });
});

describe("recorder", () => {
  test("imbalance is max/mean of the in-flight time integrals", () => {
    const r = new Recorder(2, 1000);
    r.inflightChange(0, 0, +2); // worker 0: 2 in flight for 1000 ms
    r.inflightChange(1, 0, +1); // worker 1: 1 in flight for 1000 ms
    r.finish(1000);
    // integrals 2000 and 1000: max / mean = 2000 / 1500
    expect(r.imbalance()).toBeCloseTo(4 / 3, 9);
    expect(r.series().workerLoad).toEqual([[2], [1]]);
  });

  test("percentile is nearest-rank", () => {
    expect(percentile([5, 1, 4, 2, 3], 0.5)).toBe(3);
    expect(percentile([5, 1, 4, 2, 3], 0.99)).toBe(5);
  });
});

describe("trace replay", () => {
  // 13 conversations over 4 workers: round-robin sends each turn of a conversation to another worker.
  const trace = conversations(13, 6);

  test("KV-aware routing keeps conversations on the worker holding their prefix; round-robin does not", () => {
    const kv = replayPolicy(trace, "kv-aware", OPTS);
    const rr = replayPolicy(trace, "round-robin", OPTS);
    expect(kv.requests).toBe(trace.length);
    expect(kv.hitRate).toBeGreaterThan(0.5);
    expect(kv.hitRate).toBeGreaterThan(rr.hitRate * 1.5);
    expect(kv.ttftP50Ms).toBeLessThan(rr.ttftP50Ms);
  });

  test("exact-index (the caches read directly) and KV-aware agree when the index has every event", () => {
    const kv = replayPolicy(trace, "kv-aware", { ...OPTS, eventLagMs: 0 });
    const exact = replayPolicy(trace, "exact-index", OPTS);
    expect(kv.hitRate).toBeCloseTo(exact.hitRate, 2);
  });

  test("in the LoRA mix every request is scored in its adapter's identity: KV-aware still keeps conversations on their prefix and agrees with the caches read directly", () => {
    const lora = { ...OPTS, loraAdapters: 3 };
    // Conversations on different adapters share no block, not even the first one every record has.
    const byAdapter = new Set(trace.map((r) => adapterOf(r, 3)?.name ?? "base"));
    expect(byAdapter.size).toBeGreaterThan(2);
    expect(cacheBounds(trace, lora).unbounded).toBeLessThan(cacheBounds(trace, OPTS).unbounded);
    const kv = replayPolicy(trace, "kv-aware", { ...lora, eventLagMs: 0 });
    const exact = replayPolicy(trace, "exact-index", lora);
    expect(kv.hitRate).toBeGreaterThan(0.5);
    expect(kv.hitRate).toBeCloseTo(exact.hitRate, 2);
   }, 60_000);

  test("a worker's cache reset mid-run costs hits; the index not told of it (silent) routes on stale blocks", () => {
    const base = replayPolicy(trace, "kv-aware", OPTS);
    const announced = replayPolicy(trace, "kv-aware", { ...OPTS, reset: { atMs: 15_000, worker: 0, silent: false } });
    const silent = replayPolicy(trace, "kv-aware", { ...OPTS, reset: { atMs: 15_000, worker: 0, silent: true } });
    expect(announced.hitRate).toBeLessThan(base.hitRate);
    expect(silent.hitRate).toBeLessThan(base.hitRate);
    expect(silent.cachedTokens).not.toBe(announced.cachedTokens);
  });

  test("bursts: every record of a 30 s window of trace time arrives at the window's start (scaled); other modes keep their times", () => {
    const recs = [0, 10_000, 29_999, 30_000, 65_000].map((timestamp) => ({ timestamp, inputLength: 16, outputLength: 1, hashIds: [1] }));
    expect(burstArrivals(recs, { ...OPTS, arrivals: "bursts" })).toEqual([0, 0, 0, 30_000, 60_000]);
    expect(burstArrivals(recs, { ...OPTS, timeScale: 10, arrivals: "bursts" })).toEqual([0, 0, 0, 3_000, 6_000]);
    expect(burstArrivals(recs, { ...OPTS, arrivals: "recorded" })).toEqual([0, 10_000, 29_999, 30_000, 65_000]);
  });

  test("a replay is deterministic for a seed", () => {
    const a = replayPolicy(trace, "random", OPTS);
    const b = replayPolicy(trace, "random", OPTS);
    expect(a.cachedTokens).toBe(b.cachedTokens);
    expect(a.ttftMs).toEqual(b.ttftMs);
  });

  test("with a cache too small for the conversations, blocks are evicted", () => {
    const r = replayPolicy(trace, "round-robin", { ...OPTS, capacityBlocks: 400 });
    expect(r.evictedBlocks).toBeGreaterThan(0);
  });

  test("replicas without replica-agg each know only their own load", () => {
    const agg = replayPolicy(trace, "least-loaded", { ...OPTS, replicas: 2, replicaAgg: true });
    const solo = replayPolicy(trace, "least-loaded", { ...OPTS, replicas: 2, replicaAgg: false });
    expect(agg.label).toBe("least-loaded x2 agg");
    expect(solo.label).toBe("least-loaded x2 no-agg");
    // Two replicas alternating requests, each balancing only its own: both may pick the same idle worker.
    expect(agg.instantImbalance).toBeLessThanOrEqual(solo.instantImbalance);
  });

  test("replica-agg is simulated with the EPP's protocol: lost messages show as gaps, silence as timeouts", () => {
    const lossy = replayPolicy(trace, "least-loaded", { ...OPTS, replicas: 2, replicaAgg: true, agg: { lagMs: 1, heartbeatMs: 200, timeoutMs: 600, loss: 0.3 } });
    const a = lossy.agg!;
    expect(a.messages).toBeGreaterThan(0);
    expect(a.lost).toBeGreaterThan(0);
    expect(a.gaps).toBeGreaterThan(0);
    const deaf = replayPolicy(trace, "least-loaded", { ...OPTS, replicas: 2, replicaAgg: true, agg: { lagMs: 1, heartbeatMs: 200, timeoutMs: 600, loss: 1 } });
    expect(deaf.agg!.gaps).toBe(0);
    expect(deaf.agg!.lost).toBe(deaf.agg!.messages);
    // Nothing ever arrives, so each replica routes on its own load alone, exactly as without replica-agg.
    const solo = replayPolicy(trace, "least-loaded", { ...OPTS, replicas: 2, replicaAgg: false });
    expect(deaf.instantImbalance).toBe(solo.instantImbalance);
  });
});
