// The joiner's rule (README "Exact recovery handoff"): what to do with the first signal a worker rank's
// listener delivers after this replica took over a view of that rank, given where that view stands in
// the rank's stream. Pure, so every ordering of cursor, baseline and buffer can be checked on its own.
import type { ResetReason } from "@kv-epp/kv-events";

/**
 * Where the view stands. `seq`: the view equals the worker's cache after batch `seq` (a peer's complete
 * cursor); `-1n` is the empty view of a publisher that has sent nothing yet (what a rank the dump did not
 * know starts from: exact if the stream turns out to begin at 0, or can be replayed from 0). `epoch`: the
 * publisher epoch `seq` belongs to, when known.
 */
export type ViewAt = { seq: bigint; epoch?: string | null };

/**
 * `newerThanView`: the batch came on a connection that came up after the view was taken over, so its
 * publisher sent nothing the view could already hold (the listener's `connectedAfterAttach`). `epoch`: the
 * publisher epoch the batch came under, when its publisher sends one. `afterReconnect`: the listener reported
 * `reconnected` just before it (a new connection, and no batch of its own to tell whether the publisher
 * restarted meanwhile). A reset's `reason` is the listener's.
 */
export type FirstSignal =
  | { kind: "batch"; seq: bigint; epoch?: string; newerThanView?: boolean; afterReconnect?: boolean }
  | { kind: "reset"; reason: ResetReason };

export type Step =
  /** Already in the view (seq <= cursor): drop the signal, keep waiting for the next one. */
  | { kind: "skip" }
  /** The next batch after the view: apply it and everything after it (exact, nothing applied twice). */
  | { kind: "apply" }
  /**
   * Another process's stream than the view's (a publisher that started, or restarted, after the view's batch):
   * its epoch is not the view's, or without epochs it starts over at 0, comes first after a reconnect, or came on
   * a connection newer than the view and does not go past it. The view is
   * dropped and the stream decides as for a rank nobody knew (from 0 it rebuilds the cache exactly).
   */
  | { kind: "restart" }
  /** A hole: batches [from, to) reached nobody here; replay them, then apply this one (else drop the view). */
  | { kind: "replay"; from: bigint; to: bigint }
  /** The listener reset the rank (restart seen, gap it could not repair, overflow): the view goes with it. */
  | { kind: "reset" }
  /**
   * The listener reconnected with nothing to compare across it: the publisher may or may not have restarted.
   * A view with an epoch stays until the next batch, which decides as one after a reconnect (`afterReconnect`).
   */
  | { kind: "await" };

export function joinerStep(view: ViewAt, first: FirstSignal): Step {
  // Held only for a view with an epoch: without one the next batch is a restart whatever it says, and
  // holding would only keep a view (and a cursor claiming it complete) the index is about to lose.
  if (first.kind === "reset") return first.reason === "reconnected" && view.epoch != null ? { kind: "await" } : { kind: "reset" };
  const s = first.seq;
  // Epochs on both sides say which process each seq is of: another epoch is a restart whatever the seqs,
  // and under the same one the seqs compare exactly (a batch at or below the view's is in it, even a 0),
  // after a reconnect too: the same process, which a gap in its seqs replays as any hole.
  const epochs = first.epoch !== undefined && view.epoch != null;
  if (epochs && first.epoch !== view.epoch) return { kind: "restart" };
  // Without them, the first batch after a reconnect may be a restarted process's at any seq.
  if (first.afterReconnect && !epochs) return { kind: "restart" };
  // Without them, checked first: a batch 0 after a view at c >= 0 is a new stream (vLLM has no incarnation id to say so).
  if (s === 0n && !epochs) return view.seq < 0n ? { kind: "apply" } : { kind: "restart" };
  // Already in the view, unless nothing on its connection can be: then the seq went backwards, as a live
  // stream's does when its publisher restarts (vLLM's seq starts at 0 in every process, with no process id).
  if (s <= view.seq) return first.newerThanView && !epochs ? { kind: "restart" } : { kind: "skip" };
  if (s === view.seq + 1n) return { kind: "apply" };
  return { kind: "replay", from: view.seq + 1n, to: s };
}
