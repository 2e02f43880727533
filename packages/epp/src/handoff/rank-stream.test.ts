// The joiner's rule over every ordering of the peer's cursor c, the first buffered seq s0 and what the
// worker's replay buffer still holds, against a multiset model of the worker's cache (a batch applied
// twice shows up as an extra copy). Exhaustive over positions for short streams, contents drawn by
// fast-check; plus a worker restarting in the middle.
import { describe, expect, test } from "bun:test";
import fc from "fast-check";
import type { KvEvent, ListenerSignal, ReplayRangeResult } from "@kv-epp/kv-events";
import { encodeBatch } from "@kv-epp/kv-events";
import pino from "pino";
import { joinerStep, type Step } from "./joiner-rule.ts";
import { RankStream, type Cursor, type HandoffOutcome } from "./rank-stream.ts";

type Cache = Map<bigint, number>;

function applyEvents(cache: Cache, events: KvEvent[]): void {
  for (const e of events) {
    if (e.type === "AllBlocksCleared") cache.clear();
    else if (e.type === "BlockStored") for (const h of e.blockHashes) cache.set(h, (cache.get(h) ?? 0) + 1);
    else
      for (const h of e.blockHashes) {
        const n = cache.get(h) ?? 0;
        if (n <= 1) cache.delete(h);
        else cache.set(h, n - 1);
      }
  }
}

const batchOf = (events: KvEvent[]) => ({ ts: 0, events, dataParallelRank: 0 });

/** A stream's batches: each a few stores and removals over a small hash space (so removals hit). */
const streamArb = (max: number) =>
  fc.array(
    fc.array(
      fc.oneof(
        fc.record({ type: fc.constant("BlockStored" as const), blockHashes: fc.array(fc.bigInt({ min: 1n, max: 6n }), { minLength: 1, maxLength: 3 }) }),
        fc.record({ type: fc.constant("BlockRemoved" as const), blockHashes: fc.array(fc.bigInt({ min: 1n, max: 6n }), { minLength: 1, maxLength: 2 }) }),
      ).map((e): KvEvent => (e.type === "BlockStored" ? { ...e, parentBlockHash: null, tokenIds: [], blockSize: 16, loraId: null, medium: "GPU" } : { ...e, medium: "GPU" })),
      { minLength: 1, maxLength: 3 },
    ),
    { minLength: 0, maxLength: max },
  );

function truthAfter(stream: KvEvent[][], upTo: number, from = 0): Cache {
  const c: Cache = new Map();
  for (let i = from; i <= upTo; i++) applyEvents(c, stream[i]!);
  return c;
}

/**
 * A RankStream over a multiset index, with a replay endpoint holding [replayFrom, stream end) (null: none), its
 * replies under `replayEpoch` (null: the replies carry none).
 */
function harness(stream: KvEvent[][], replayFrom: number | null, replayEpoch: string | null = null) {
  const index: Cache = new Map();
  const outcomes: HandoffOutcome[] = [];
  let resets = 0;
  /** `onReset`: runs inside the index's apply of a reset, after it cleared the rank (as the index's own callbacks do). */
  const hooks: { onReset?: () => void } = {};
  const r = new RankStream({
    worker: { workerId: "w", dpRank: 0 },
    index: {
      apply: (s) => (s.kind === "reset" ? (resets++, index.clear(), hooks.onReset?.()) : applyEvents(index, s.batch.events)),
      clear: () => index.clear(),
      blocks: () => index.size,
    },
    replay:
      replayFrom === null
        ? null
        : async (from, to): Promise<ReplayRangeResult> => {
            if (Number(from) < replayFrom) return { kind: "uncovered", reason: "short", got: 0 };
            const batches = [];
            for (let i = Number(from); i < Number(to); i++) batches.push({ seq: BigInt(i), epoch: replayEpoch, payload: Buffer.from(encodeBatch(batchOf(stream[i]!))) });
            return { kind: "covered", batches };
          },
    log: pino({ level: "silent" }),
    onOutcome: (o) => outcomes.push(o),
  });
  /** `resets`: reset signals that reached the index. */
  return { r, index, outcomes, resets: () => resets, hooks };
}

/** Lets a replay answer (the fake one resolves within a few microtasks). */
const settle = async () => {
  for (let i = 0; i < 5; i++) await Promise.resolve();
};
/** `epoch`: the publisher epoch it came under, when its publisher sends one. */
const batch = (stream: KvEvent[][], i: number, epoch?: string): ListenerSignal => ({ kind: "batch", seq: BigInt(i), batch: batchOf(stream[i]!), epoch });
/** `n` batches, batch i storing block i: a view's blocks count its batches. */
const stores = (n: number): KvEvent[][] =>
  Array.from({ length: n }, (_, i) => [{ type: "BlockStored", blockHashes: [BigInt(i)], parentBlockHash: null, tokenIds: [], blockSize: 16, loraId: null, medium: "GPU" }]);
const reconnected: ListenerSignal = { kind: "reset", reason: "reconnected" };
/** A batch on a listener's first connection, made after the view was taken over. */
const newerBatch = (stream: KvEvent[][], i: number, epoch?: string): ListenerSignal => ({ kind: "batch", seq: BigInt(i), batch: batchOf(stream[i]!), epoch, connectedAfterAttach: true });

describe("the joiner's rule", () => {
  test("the step for every (cursor, first seq) pair", () => {
    for (let c = -1n; c < 6n; c++)
      for (let s = 0n; s < 8n; s++) {
        const step = joinerStep({ seq: c }, { kind: "batch", seq: s });
        const newer = joinerStep({ seq: c }, { kind: "batch", seq: s, newerThanView: true });
        expect(newer.kind === "restart").toBe(c >= 0n && s <= c);
        if (newer.kind !== "restart") expect<Step>(newer).toEqual(step);
        if (s === 0n) expect(step.kind).toBe(c < 0n ? "apply" : "restart");
        else if (s <= c) expect(step.kind).toBe("skip");
        else if (s === c + 1n) expect(step.kind).toBe("apply");
        else expect(step).toEqual({ kind: "replay", from: c + 1n, to: s });
      }
    for (const reason of ["restarted", "gap-unrecovered", "overflow"] as const) expect(joinerStep({ seq: 3n }, { kind: "reset", reason }).kind).toBe("reset");
    // A reconnect is held only for a view with an epoch: without one the next batch is a restart anyway.
    expect(joinerStep({ seq: 3n, epoch: "a" }, { kind: "reset", reason: "reconnected" }).kind).toBe("await");
    for (const epoch of [undefined, null]) expect(joinerStep({ seq: 3n, epoch }, { kind: "reset", reason: "reconnected" }).kind).toBe("reset");
  });

  test("every ordering of peer cursor, first buffered seq and replay coverage ends exact, or dropped and known incomplete", async () => {
    await fc.assert(
      fc.asyncProperty(streamArb(6), fc.boolean(), async (stream, replayAnswersFirst) => {
        const n = stream.length;
        // c = -1: no view taken over (a rank the dump did not know); replayFrom = n + 1: no replay endpoint
        for (let c = -1; c < n; c++)
          for (let s0 = 0; s0 <= n; s0++)
            for (let replayFrom = 0; replayFrom <= n + 1; replayFrom++) {
              const h = harness(stream, replayFrom > n ? null : replayFrom);
              const fromPeer = c >= 0;
              if (fromPeer) {
                for (const [k, v] of truthAfter(stream, c)) h.index.set(k, v);
                h.r.adopt({ seq: BigInt(c), baseline: 0n, complete: true, epoch: null });
              }
              for (let i = s0; i < n; i++) {
                h.r.onSignal(batch(stream, i));
                // a replay answers before the next batches arrive, or they queue behind it
                if (i === s0 && replayAnswersFirst) await settle();
              }
              await settle();
              const where = `c=${c} s0=${s0} replayFrom=${replayFrom}`;
              const expectExact = (outcome: HandoffOutcome | null) => {
                expect(h.index, where).toEqual(truthAfter(stream, n - 1));
                expect(h.r.cursor, where).toMatchObject({ seq: BigInt(n - 1), complete: true });
                expect(h.outcomes, where).toEqual(outcome ? [outcome] : []);
              };
              if (s0 === n) {
                // nothing heard since: the view is what was taken over, at its cursor
                expect(h.index, where).toEqual(fromPeer ? truthAfter(stream, c) : new Map());
                expect(h.r.cursor, where).toEqual(fromPeer ? { seq: BigInt(c), baseline: 0n, complete: true, epoch: null } : { seq: null, baseline: null, complete: false, epoch: null });
                expect(h.outcomes, where).toEqual([]);
              } else if (s0 === 0) expectExact(fromPeer ? "reset" : null); // the stream from its start rebuilds the view
              // everything buffered was already in the view (c = n - 1): still pending, nothing applied twice
              else if (s0 <= c + 1) expectExact(c < n - 1 ? "exact" : null);
              else if (replayFrom <= n && replayFrom <= c + 1) expectExact(fromPeer ? "replayed" : null);
              else {
                // The hole reached nobody: what is known is the stream from s0 on, and it says so.
                expect(h.index, where).toEqual(truthAfter(stream, n - 1, s0));
                expect(h.r.cursor, where).toMatchObject({ seq: BigInt(n - 1), baseline: BigInt(s0), complete: false });
                expect(h.outcomes, where).toEqual(fromPeer ? ["dropped"] : []);
              }
            }
      }),
      { numRuns: 40 },
    );
  });

  test("a worker restarting mid-recovery: the rank is reset, and the new stream decides (complete from its seq 0)", async () => {
    await fc.assert(
      // unseen: the listener got nothing of the old stream and reconnected to the new one (reset "reconnected")
      fc.asyncProperty(streamArb(5), streamArb(5), fc.nat(), fc.nat(), fc.boolean(), async (before, after, cRaw, firstAfterRaw, unseen) => {
        fc.pre(before.length > 0 && after.length > 0);
        const c = cRaw % before.length;
        const firstAfter = firstAfterRaw % after.length; // the joiner's listener may miss the new stream's start
        const h = harness(after, null);
        for (const [k, v] of truthAfter(before, c)) h.index.set(k, v);
        h.r.adopt({ seq: BigInt(c), baseline: 0n, complete: true, epoch: null });
        // Buffered: the old stream after c (what the listener got), the restart, the new stream.
        if (!unseen) for (let i = c + 1; i < before.length; i++) h.r.onSignal(batch(before, i));
        h.r.onSignal({ kind: "reset", reason: unseen ? "reconnected" : "restarted" });
        for (let i = firstAfter; i < after.length; i++) h.r.onSignal(batch(after, i));
        await settle();
        expect(h.index).toEqual(truthAfter(after, after.length - 1, firstAfter));
        expect(h.r.cursor.complete).toBe(firstAfter === 0);
        expect(h.outcomes).toEqual([!unseen && c + 1 < before.length ? "exact" : "reset"]);
        expect(h.resets()).toBe(1); // the listener's reset reaches the index once (a reconnect at once: the view has no epoch)
      }),
      { numRuns: 200 },
    );
  });

  test("a stream on a connection newer than the view that does not get past its cursor is a new process's: the view is dropped, the stream rebuilds the rank", async () => {
    await fc.assert(
      // The worker restarted after the dump (or the peer's cursor was already the old process's): the joiner's
      // listener first connected after the handoff, missed the new process's first batches, and its seqs are
      // at or below the peer's cursor. Skipped as "already in the view", they would never reach the index.
      fc.asyncProperty(streamArb(6), streamArb(4), fc.nat(), fc.nat(), fc.boolean(), async (before, after, cRaw, firstRaw, replayable) => {
        fc.pre(before.length > 0 && after.length > 1);
        const c = Math.max(cRaw % before.length, after.length - 1); // every batch of the new stream is <= c
        const first = 1 + (firstRaw % (after.length - 1));
        const h = harness(after, replayable ? 0 : null);
        for (const [k, v] of truthAfter(before, before.length - 1)) h.index.set(k, v);
        h.r.adopt({ seq: BigInt(c), baseline: 0n, complete: true, epoch: null });
        h.r.onSignal(newerBatch(after, first));
        for (let i = first + 1; i < after.length; i++) h.r.onSignal(batch(after, i));
        await settle();
        expect(h.outcomes).toEqual(["reset"]);
        expect(h.index).toEqual(truthAfter(after, after.length - 1, replayable ? 0 : first));
        expect(h.r.cursor).toMatchObject({ seq: BigInt(after.length - 1), complete: replayable });
      }),
      { numRuns: 100 },
    );
    // Past the cursor, the same connection continues the view as any first batch does.
    const removal: KvEvent[] = [{ type: "BlockRemoved", blockHashes: [1n], medium: "GPU" }];
    const stream = [removal, removal, removal];
    const h = harness(stream, null);
    h.r.adopt({ seq: 1n, baseline: 0n, complete: true, epoch: null });
    h.r.onSignal(newerBatch(stream, 2));
    expect(h.outcomes).toEqual(["exact"]);
    expect(h.r.cursor).toEqual({ seq: 2n, baseline: 0n, complete: true, epoch: null });
  });

  test("with epochs on both sides another epoch is a restart whatever the seq, and the same one compares seqs exactly (0 and a newer connection too); an epoch on one side only changes nothing", () => {
    for (let c = 0n; c < 6n; c++)
      for (let s = 0n; s < 8n; s++)
        for (const newerThanView of [false, true]) {
          const first = { kind: "batch" as const, seq: s, newerThanView };
          expect(joinerStep({ seq: c, epoch: "a" }, { ...first, epoch: "b" })).toEqual({ kind: "restart" });
          const same = joinerStep({ seq: c, epoch: "a" }, { ...first, epoch: "a" });
          if (s <= c) expect(same.kind).toBe("skip");
          else if (s === c + 1n) expect(same.kind).toBe("apply");
          else expect(same).toEqual({ kind: "replay", from: c + 1n, to: s });
          expect(joinerStep({ seq: c, epoch: null }, { ...first, epoch: "a" })).toEqual(joinerStep({ seq: c }, first));
          expect(joinerStep({ seq: c, epoch: "a" }, first)).toEqual(joinerStep({ seq: c }, first));
        }
  });

  test("the first batch after a reconnect: under the view's epoch its seq decides as any first batch's; under another, or without epochs on both sides, the view is dropped", () => {
    for (let c = -1n; c < 6n; c++)
      for (let s = 0n; s < 8n; s++)
        for (const newerThanView of [false, true]) {
          const first = { kind: "batch" as const, seq: s, newerThanView };
          const after = { ...first, afterReconnect: true };
          expect(joinerStep({ seq: c, epoch: "a" }, { ...after, epoch: "a" })).toEqual(joinerStep({ seq: c, epoch: "a" }, { ...first, epoch: "a" }));
          expect(joinerStep({ seq: c, epoch: "a" }, { ...after, epoch: "b" })).toEqual({ kind: "restart" });
          for (const [view, epoch] of [[null, "a"], ["a", undefined], [null, undefined]] as const) expect(joinerStep({ seq: c, epoch: view }, { ...after, epoch })).toEqual({ kind: "restart" });
        }
  });

  test("a reconnect reported before any batch keeps the view taken over until a batch decides: under its epoch the stream continues it exactly (replayed across a hole), reaching the index no reset", async () => {
    await fc.assert(
      fc.asyncProperty(streamArb(6), fc.nat(), fc.nat(), async (stream, cRaw, firstRaw) => {
        fc.pre(stream.length > 1);
        const n = stream.length;
        const c = cRaw % (n - 1);
        const first = c + 1 + (firstRaw % (n - 1 - c)); // past the cursor: what the link came back to
        const h = harness(stream, 0, "e1");
        for (const [k, v] of truthAfter(stream, c)) h.index.set(k, v);
        h.r.adopt({ seq: BigInt(c), baseline: 0n, complete: true, epoch: "e1" });
        h.r.onSignal({ kind: "reset", reason: "reconnected" });
        expect(h.r.handoff).toBe("pending");
        for (let i = first; i < n; i++) h.r.onSignal(batch(stream, i, "e1"));
        await settle();
        expect(h.outcomes).toEqual([first === c + 1 ? "exact" : "replayed"]);
        expect(h.resets()).toBe(0);
        expect(h.index).toEqual(truthAfter(stream, n - 1));
        expect(h.r.cursor).toEqual({ seq: BigInt(n - 1), baseline: 0n, complete: true, epoch: "e1" });
      }),
      { numRuns: 100 },
    );
  });

  test("a reconnect with a view taken over without an epoch resets the rank at once: the dumped cursor stops claiming the view complete", () => {
    const stream = stores(3);
    const h = harness(stream, null);
    for (const [k, v] of truthAfter(stream, 1)) h.index.set(k, v);
    h.r.adopt({ seq: 1n, baseline: 0n, complete: true, epoch: null });
    h.r.onSignal({ kind: "reset", reason: "reconnected" });
    expect([h.outcomes, h.resets(), h.index.size]).toEqual([["reset"], 1, 0]);
    expect(h.r.cursor).toEqual({ seq: 1n, baseline: null, complete: false, epoch: null });
    h.r.onSignal(batch(stream, 0)); // a restarted publisher's stream from its start is complete again
    expect(h.r.cursor).toEqual({ seq: 0n, baseline: 0n, complete: true, epoch: null });
    expect([h.outcomes, h.resets()]).toEqual([["reset"], 1]);
  });

  test("what ends a reconnect held for a view at seq 2 under epoch e1: each handoff decided once, the listener's reset reaching the index only when the view goes with a possible restart", async () => {
    const stream = stores(4);
    type H = ReturnType<typeof harness>;
    const signal = (s: ListenerSignal) => (h: H) => h.r.onSignal(s);
    // The index drops the rank's blocks by itself (over capacity) and says so.
    const lost = (h: H) => (h.index.clear(), h.r.viewLost());
    const lostOnReset = (h: H) => void (h.hooks.onReset = () => h.r.viewLost());
    const restartedFrom3 = { index: truthAfter(stream, 3, 3), cursor: (epoch: string) => ({ seq: 3n, baseline: 3n, complete: false, epoch }) };
    const rows: { when: string; steps: ((h: H) => void)[]; outcomes: HandoffOutcome[]; resets: number; index: Cache; cursor: Cursor }[] = [
      // No view left to keep: the held reconnect reaches the index with the next batch, which decides as for a new rank.
      { when: "the view is lost, then batch 3 under e1", steps: [lost, signal(batch(stream, 3, "e1"))], outcomes: ["dropped"], resets: 1, ...restartedFrom3, cursor: restartedFrom3.cursor("e1") },
      { when: "the view is lost while the index takes the held reset, then batch 3 under e2", steps: [lostOnReset, signal(batch(stream, 3, "e2"))], outcomes: ["reset"], resets: 1, ...restartedFrom3, cursor: restartedFrom3.cursor("e2") },
      { when: "a second reconnect, then batch 3 under e1", steps: [signal(reconnected), signal(batch(stream, 3, "e1"))], outcomes: ["exact"], resets: 0, index: truthAfter(stream, 3), cursor: { seq: 3n, baseline: 0n, complete: true, epoch: "e1" } },
      { when: "a second reconnect, then batch 3 under e2", steps: [signal(reconnected), signal(batch(stream, 3, "e2"))], outcomes: ["reset"], resets: 1, ...restartedFrom3, cursor: restartedFrom3.cursor("e2") },
      ...(["overflow", "gap-unrecovered"] as const).map((reason) => ({
        when: `a reset '${reason}', then batch 3 under e1`,
        steps: [signal({ kind: "reset", reason }), signal(batch(stream, 3, "e1"))],
        outcomes: ["reset"] as HandoffOutcome[],
        resets: 1,
        ...restartedFrom3,
        cursor: restartedFrom3.cursor("e1"),
      })),
      { when: "batch 2 under e1 (skipped), then batch 3 under e1", steps: [signal(batch(stream, 2, "e1")), signal(batch(stream, 3, "e1"))], outcomes: ["exact"], resets: 0, index: truthAfter(stream, 3), cursor: { seq: 3n, baseline: 0n, complete: true, epoch: "e1" } },
      // The skip settled the reconnect as the same stream: a later restart drops the view, but not as the listener's reset.
      { when: "batch 2 under e1 (skipped), then batch 3 under e2", steps: [signal(batch(stream, 2, "e1")), signal(batch(stream, 3, "e2"))], outcomes: ["reset"], resets: 0, ...restartedFrom3, cursor: restartedFrom3.cursor("e2") },
    ];
    for (const row of rows) {
      const h = harness(stream, null);
      for (const [k, v] of truthAfter(stream, 2)) h.index.set(k, v);
      h.r.adopt({ seq: 2n, baseline: 0n, complete: true, epoch: "e1" });
      h.r.onSignal(reconnected);
      for (const step of row.steps) step(h);
      await settle();
      const { when } = row;
      expect({ when, outcomes: h.outcomes, resets: h.resets(), cursor: h.r.cursor }).toEqual({ when, outcomes: row.outcomes, resets: row.resets, cursor: row.cursor });
      expect(h.index, when).toEqual(row.index);
    }
  });

  test("under the peer cursor's epoch, buffered batches at or below its cursor (0 and a newer connection's too) are skipped and the stream continues exactly", async () => {
    await fc.assert(
      fc.asyncProperty(streamArb(6), fc.boolean(), async (stream, newer) => {
        const n = stream.length;
        for (let c = 0; c < n - 1; c++)
          for (let s0 = 0; s0 <= c + 1; s0++) {
            const h = harness(stream, null);
            for (const [k, v] of truthAfter(stream, c)) h.index.set(k, v);
            h.r.adopt({ seq: BigInt(c), baseline: 0n, complete: true, epoch: "e1" });
            for (let i = s0; i < n; i++) h.r.onSignal(newer && i === s0 ? newerBatch(stream, i, "e1") : batch(stream, i, "e1"));
            await settle();
            const where = `c=${c} s0=${s0}`;
            expect(h.outcomes, where).toEqual(["exact"]);
            expect(h.index, where).toEqual(truthAfter(stream, n - 1));
            expect(h.r.cursor, where).toEqual({ seq: BigInt(n - 1), baseline: 0n, complete: true, epoch: "e1" });
            expect(h.r.counters.skipped, where).toBe(c + 1 - s0);
          }
      }),
      { numRuns: 40 },
    );
  });

  test("a first batch under another epoch than the peer cursor's is another process's whatever its seq: the view is dropped, the stream decides as for a new rank", async () => {
    await fc.assert(
      // The listener reached the restarted worker before the dump, while the peer's cursor was still the old
      // process's: without epochs a first seq at or below the cursor is skipped as already in the view, and one
      // above it continues or replays into a view of another stream.
      fc.asyncProperty(streamArb(6), streamArb(4), fc.nat(), fc.nat(), fc.boolean(), async (before, after, cRaw, firstRaw, replayable) => {
        fc.pre(before.length > 0 && after.length > 1);
        const c = cRaw % before.length;
        const first = 1 + (firstRaw % (after.length - 1));
        const h = harness(after, replayable ? 0 : null);
        for (const [k, v] of truthAfter(before, c)) h.index.set(k, v);
        h.r.adopt({ seq: BigInt(c), baseline: 0n, complete: true, epoch: "old" });
        for (let i = first; i < after.length; i++) h.r.onSignal(batch(after, i, "new"));
        await settle();
        expect(h.outcomes).toEqual(["reset"]);
        expect(h.index).toEqual(truthAfter(after, after.length - 1, replayable ? 0 : first));
        expect(h.r.cursor).toEqual({ seq: BigInt(after.length - 1), baseline: replayable ? 0n : BigInt(first), complete: replayable, epoch: "new" });
      }),
      { numRuns: 100 },
    );
  });

  test("a hole is filled only by replayed batches of the trigger's epoch (or of none): another epoch's are another process's, and the view is dropped", async () => {
    const stream = [[0], [1], [2], [3], [4]].map((hs) => [{ type: "BlockStored" as const, blockHashes: hs.map(BigInt), parentBlockHash: null, tokenIds: [], blockSize: 16, loraId: null, medium: "GPU" }]);
    for (const [replayEpoch, outcome] of [["e1", "replayed"], [null, "replayed"], ["e2", "dropped"]] as const) {
      const h = harness(stream, 0, replayEpoch);
      for (const [k, v] of truthAfter(stream, 1)) h.index.set(k, v);
      h.r.adopt({ seq: 1n, baseline: 0n, complete: true, epoch: "e1" });
      h.r.onSignal(batch(stream, 4, "e1")); // 2 and 3 missing: replayed
      await settle();
      expect({ replayEpoch, outcomes: h.outcomes }).toEqual({ replayEpoch, outcomes: [outcome] });
      expect(h.index).toEqual(outcome === "replayed" ? truthAfter(stream, 4) : truthAfter(stream, 4, 4));
    }
  });

  test("an epoch on one side only decides as without epochs: a batch at or below the cursor is skipped, unless a newer connection's, which drops the view", () => {
    const removal: KvEvent[] = [{ type: "BlockRemoved", blockHashes: [1n], medium: "GPU" }];
    const stream = [removal, removal, removal];
    for (const [peer, live] of [[null, "e1"], ["e1", undefined]] as const) {
      const h = harness(stream, null);
      h.r.adopt({ seq: 2n, baseline: 0n, complete: true, epoch: peer });
      h.r.onSignal(batch(stream, 1, live));
      expect([h.r.counters.skipped, h.outcomes.length]).toEqual([1, 0]);
      h.r.onSignal(newerBatch(stream, 2, live));
      expect(h.outcomes).toEqual(["reset"]);
    }
  });

  test("AllBlocksCleared makes an incomplete view complete from there", () => {
    const h = harness([], null);
    h.r.onSignal({ kind: "batch", seq: 7n, batch: batchOf([{ type: "BlockRemoved", blockHashes: [1n], medium: "GPU" }]) });
    expect(h.r.cursor).toEqual({ seq: 7n, baseline: 7n, complete: false, epoch: null });
    h.r.onSignal({ kind: "batch", seq: 8n, batch: batchOf([{ type: "AllBlocksCleared" }]) });
    expect(h.r.cursor).toEqual({ seq: 8n, baseline: 8n, complete: true, epoch: null });
  });

  test("blocks the index drops by itself (over capacity) leave the view incomplete; a view not yet handed off counts as dropped", () => {
    const stream = [[{ type: "BlockStored" as const, blockHashes: [1n], parentBlockHash: null, tokenIds: [], blockSize: 16, loraId: null, medium: "GPU" as const }]];
    const taken = harness(stream, null);
    taken.r.adopt({ seq: 4n, baseline: 0n, complete: true, epoch: null });
    taken.r.viewLost();
    expect(taken.outcomes).toEqual(["dropped"]);
    expect(taken.r.cursor.complete).toBe(false);
    taken.r.onSignal(batch(stream, 0)); // a new stream from seq 0 is complete again
    expect(taken.r.cursor).toEqual({ seq: 0n, baseline: 0n, complete: true, epoch: null });
    const live = harness(stream, null);
    live.r.onSignal(batch(stream, 0));
    live.r.viewLost();
    expect(live.r.cursor.complete).toBe(false);
    expect(live.outcomes).toEqual([]);
  });

  test("a view the index drops while applying a batch stays incomplete, even if the batch clears the cache", () => {
    let dropNext = false;
    const r: RankStream = new RankStream({
      worker: { workerId: "w", dpRank: 0 },
      // Over capacity on this batch: the index drops the rank's blocks and says so from inside apply.
      index: { apply: () => void (dropNext && r.viewLost()), clear: () => {}, blocks: () => 0 },
      replay: null,
      log: pino({ level: "silent" }),
      onOutcome: () => {},
    });
    r.onSignal({ kind: "batch", seq: 0n, batch: batchOf([{ type: "BlockRemoved", blockHashes: [1n], medium: "GPU" }]) });
    expect(r.cursor).toEqual({ seq: 0n, baseline: 0n, complete: true, epoch: null });
    dropNext = true;
    r.onSignal({ kind: "batch", seq: 1n, batch: batchOf([{ type: "AllBlocksCleared" }]) });
    expect(r.cursor.complete).toBe(false);
    dropNext = false;
    r.onSignal({ kind: "batch", seq: 2n, batch: batchOf([{ type: "BlockRemoved", blockHashes: [1n], medium: "GPU" }]) });
    expect(r.cursor).toEqual({ seq: 2n, baseline: 2n, complete: false, epoch: null });
  });
});
