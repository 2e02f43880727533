// One worker rank's stream as this replica follows it: where its view stands (the cursor /dump carries),
// and the handoff from a view taken over (a peer's dump, or nothing) to the live stream, by the joiner's
// rule. Every signal of the rank's listener passes through here on its way to the index.
import type { StreamCursor, WorkerRef } from "@kv-epp/protocol";
import { decodeBatch, type KvEventBatch, type ListenerSignal, type ReplayRangeResult } from "@kv-epp/kv-events";
import type { Logger } from "pino";
import { joinerStep } from "./joiner-rule.ts";

/**
 * What became of a view taken over from a peer: `exact` (the stream continued right after its cursor),
 * `replayed` (a hole filled from the worker's replay endpoint), `dropped` (a hole nobody could fill: the
 * rank's blocks dropped), `reset` (the listener reset the rank, or the stream started over at 0, before
 * the handoff was decided), `unknown` (the peer had no complete view: its blocks were not kept),
 * `overlap` (a peer whose dump has no cursors: its blocks kept and every buffered event applied on top).
 */
export type HandoffOutcome = "exact" | "replayed" | "dropped" | "reset" | "unknown" | "overlap";
export const HANDOFF_OUTCOMES: readonly HandoffOutcome[] = ["exact", "replayed", "dropped", "reset", "unknown", "overlap"];

export type Cursor = { seq: bigint | null; baseline: bigint | null; complete: boolean; epoch: string | null };

/** The rank's view in the index: apply a listener signal, drop the rank's blocks, count them. */
export type RankIndex = { apply(signal: ListenerSignal): void; clear(): void; blocks(): number };

export type RankStreamDeps = {
  worker: WorkerRef;
  index: RankIndex;
  /** Asks the worker's replay endpoint for [from, to); null when the rank has none. */
  replay: ((from: bigint, to: bigint) => Promise<ReplayRangeResult>) | null;
  log: Logger;
  /** Once per view taken over from a peer, when its handoff is decided. */
  onOutcome: (outcome: HandoffOutcome, droppedBlocks: number) => void;
};

type Phase =
  /**
   * Until the first signal decides: the view equals the cache after batch `at` (-1: the empty view before 0),
   * of the publisher epoch `epoch` when a peer's cursor said so. `reconnect`: the listener's reset "reconnected",
   * held until the next batch says whether the publisher restarted (then it reaches the index).
   */
  | { kind: "waiting"; at: bigint; fromPeer: boolean; epoch?: string | null; reconnect?: ListenerSignal }
  /** A hole is being replayed; signals meanwhile wait their turn. */
  | { kind: "replaying"; queue: ListenerSignal[] }
  | { kind: "live" };

export type RankCounters = { replays: number; replayedBatches: number; replayFailures: number; skipped: number; droppedBlocks: number; resets: number };

export class RankStream {
  private phase: Phase = { kind: "waiting", at: -1n, fromPeer: false };
  private cursorState: Cursor = NO_CURSOR;
  private closed = false;
  /** The handoff of a view taken over from a peer: undecided ("pending"), its outcome, or none taken over. */
  handoff: HandoffOutcome | "pending" | null = null;
  readonly counters: RankCounters = { replays: 0, replayedBatches: 0, replayFailures: 0, skipped: 0, droppedBlocks: 0, resets: 0 };

  constructor(private readonly deps: RankStreamDeps) {}

  get cursor(): Readonly<Cursor> {
    return this.cursorState;
  }

  /** The cursor as /dump carries it, read in the same step as the rank's blocks. */
  streamCursor(): StreamCursor {
    const c = this.cursorState;
    return { workerId: this.deps.worker.workerId, dpRank: this.deps.worker.dpRank, seq: c.seq, baseline: c.baseline, complete: c.complete, epoch: c.epoch };
  }

  /**
   * The index now holds a peer's view of this rank at `peer.seq` (complete or not: this view is as complete
   * as the peer's); the next signals decide the rest.
   */
  adopt(peer: { seq: bigint; baseline: bigint | null; complete: boolean; epoch: string | null }): void {
    this.phase = { kind: "waiting", at: peer.seq, fromPeer: true, epoch: peer.epoch };
    this.cursorState = { seq: peer.seq, baseline: peer.baseline, complete: peer.complete, epoch: peer.epoch };
    this.handoff = "pending";
  }

  /** The peer had blocks of this rank but no position in its stream: they are not kept, the live stream decides. */
  unknownToPeer(): void {
    const dropped = this.deps.index.blocks();
    this.deps.index.clear();
    this.phase = { kind: "waiting", at: -1n, fromPeer: false };
    this.cursorState = NO_CURSOR;
    this.decide("unknown", dropped);
  }

  /**
   * The index dropped this rank's blocks by itself (over capacity, a replaced index): the view is empty
   * while the worker's cache is not. A view taken over and not yet handed off counts as dropped; the stream
   * then goes on as for a rank nobody knew.
   */
  viewLost(): void {
    const p = this.phase;
    this.cursorState = { ...this.cursorState, baseline: null, complete: false };
    if (p.kind === "waiting" && p.fromPeer) {
      // A reconnect held for the view stays held: with no view left to keep, the next batch hands it to the index.
      this.phase = { kind: "waiting", at: -1n, fromPeer: false, reconnect: p.reconnect };
      this.cursorState = NO_CURSOR;
      this.decide("dropped", 0);
    }
  }

  /** A peer without cursors: its blocks stay and every buffered event goes on top (as before cursors). */
  overlap(): void {
    this.phase = { kind: "live" };
    this.cursorState = NO_CURSOR;
    this.decide("overlap", 0);
  }

  /** The rank left: a replay still running is ignored when it ends. */
  close(): void {
    this.closed = true;
  }

  onSignal(s: ListenerSignal): void {
    const p = this.phase;
    if (p.kind === "replaying") return void p.queue.push(s);
    if (p.kind === "live") return this.live(s);
    const step = joinerStep(
      { seq: p.at, epoch: p.epoch },
      s.kind === "batch" ? { kind: "batch", seq: s.seq, epoch: s.epoch, newerThanView: s.connectedAfterAttach, afterReconnect: p.reconnect !== undefined } : s,
    );
    switch (step.kind) {
      case "await":
        this.phase = { ...p, reconnect: s };
        return;
      case "skip":
        this.counters.skipped++;
        this.phase = { ...p, reconnect: undefined };
        return;
      case "apply":
        if (p.at < 0n) this.cursorState = { seq: null, baseline: 0n, complete: true, epoch: null };
        if (p.fromPeer) this.decide("exact", 0);
        this.phase = { kind: "live" };
        return this.live(s);
      case "restart": {
        // Another process's stream: whatever the view held goes, and the stream decides as for a new rank
        // (complete from its seq 0, or replayed from 0). Decided before anything reaches the index: a view the
        // index drops while taking the reset (viewLost from inside apply) is then no longer one taken over, and
        // its handoff is not counted a second time.
        const dropped = this.deps.index.blocks();
        if (p.fromPeer) this.decide("reset", dropped);
        this.phase = { kind: "waiting", at: -1n, fromPeer: false };
        // A reconnect held for this batch was a restart after all: the index takes (and counts) it as the listener's reset.
        if (p.reconnect) this.live(p.reconnect);
        this.deps.index.clear();
        this.cursorState = NO_CURSOR;
        return this.onSignal(s);
      }
      case "reset":
        if (p.fromPeer) this.decide("reset", this.deps.index.blocks());
        this.phase = { kind: "live" };
        return this.live(s);
      case "replay":
        return this.replay(step.from, step.to, p.fromPeer, s);
    }
  }

  private live(s: ListenerSignal): void {
    const c = this.cursorState;
    if (s.kind === "reset") {
      this.counters.resets++;
      this.deps.index.apply(s);
      this.cursorState = { ...c, baseline: null, complete: false };
      // A restarted (or possibly restarted) publisher's stream may still be complete from its start: look
      // again, as for a new rank.
      if (s.reason === "restarted" || s.reason === "reconnected") this.phase = { kind: "waiting", at: -1n, fromPeer: false };
      return;
    }
    this.deps.index.apply(s);
    // The index dropped the view while applying this batch (viewLost, called from inside apply): not whole,
    // whatever the batch held; the stream goes on from the next batch.
    const epoch = s.epoch ?? null;
    if (this.cursorState !== c) {
      this.cursorState = { seq: s.seq, baseline: null, complete: false, epoch };
      return;
    }
    let complete = c.complete && (c.seq === null || s.seq === c.seq + 1n);
    let baseline = c.baseline;
    // After AllBlocksCleared the worker's cache is empty: from here the view is exact whatever came before.
    if (clears(s.batch)) {
      complete = true;
      baseline = s.seq;
    }
    this.cursorState = { seq: s.seq, baseline: complete ? baseline : (baseline ?? s.seq), complete, epoch };
  }

  private replay(from: bigint, to: bigint, fromPeer: boolean, trigger: ListenerSignal): void {
    const queue = [trigger];
    this.phase = { kind: "replaying", queue };
    const replay = this.deps.replay;
    if (replay !== null) this.counters.replays++;
    const done = (r: ReplayRangeResult) => {
      if (this.closed) return;
      let batches: { seq: bigint; batch: KvEventBatch }[] | null = null;
      // The hole is of the stream its trigger came on, so the replayed batches are of its epoch: one under another
      // epoch is another process's (the worker restarted between the two), which fills nothing of this one.
      const epoch = trigger.kind === "batch" ? trigger.epoch : undefined;
      const otherEpoch = r.kind === "covered" && epoch !== undefined && r.batches.some((b) => b.epoch !== null && b.epoch !== epoch);
      if (r.kind === "covered" && !otherEpoch) {
        try {
          batches = r.batches.map((b) => ({ seq: b.seq, batch: decodeBatch(b.payload) }));
        } catch {
          batches = null;
        }
      }
      if (batches !== null) {
        this.counters.replayedBatches += batches.length;
        if (!fromPeer) this.cursorState = { seq: null, baseline: 0n, complete: true, epoch: null };
        else this.decide("replayed", 0);
        this.phase = { kind: "live" };
        for (const b of batches) this.live({ kind: "batch", seq: b.seq, batch: b.batch, epoch });
      } else {
        this.counters.replayFailures++;
        const dropped = this.deps.index.blocks();
        if (dropped > 0) this.deps.index.clear();
        this.cursorState = { seq: null, baseline: to, complete: false, epoch: null };
        const why = r.kind === "uncovered" ? r.reason : otherEpoch ? "another epoch" : "malformed";
        const got = r.kind === "uncovered" ? r.got : r.batches.length;
        // Expected when a replica starts after its workers without a replay endpoint: not worth a warning then.
        this.deps.log[fromPeer || replay !== null ? "warn" : "info"](
          { worker: this.deps.worker.workerId, rank: this.deps.worker.dpRank, cursor: (from - 1n).toString(), firstSeq: to.toString(), missing: Number(to - from), replayed: got, reason: replay ? why : "no replay endpoint", droppedBlocks: dropped },
          fromPeer ? "hole after the recovered cursor not replayable: the rank's recovered blocks are dropped" : "stream did not start at 0 and could not be replayed from 0: the rank's view is incomplete",
        );
        if (fromPeer) this.decide("dropped", dropped);
        this.phase = { kind: "live" };
      }
      for (const s of queue) this.onSignal(s);
    };
    if (replay === null) return done({ kind: "uncovered", reason: "short", got: 0 });
    void replay(from, to).then(done, () => done({ kind: "uncovered", reason: "timeout", got: 0 }));
  }

  private decide(outcome: HandoffOutcome, droppedBlocks: number): void {
    this.handoff = outcome;
    this.counters.droppedBlocks += droppedBlocks;
    this.deps.onOutcome(outcome, droppedBlocks);
  }
}

/** No position in the rank's stream: nothing applied, no view known complete. */
export const NO_CURSOR: Cursor = { seq: null, baseline: null, complete: false, epoch: null };

function clears(batch: KvEventBatch): boolean {
  for (const e of batch.events) if (e.type === "AllBlocksCleared") return true;
  return false;
}
