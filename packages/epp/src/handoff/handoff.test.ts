// The handoff's seam with the dump: a peer cursor's publisher epoch reaches the rank it is taken over for,
// and a rank's own epoch leaves in its dumped cursor. The rule itself is rank-stream.test.ts's.
import { expect, test } from "bun:test";
import type { StreamCursor, WorkerRef } from "@kv-epp/protocol";
import type { ListenerSignal } from "@kv-epp/kv-events";
import type { DumpTarget } from "@kv-epp/recovery";
import pino from "pino";
import { Registry } from "prom-client";
import { StreamHandoff } from "./handoff.ts";

const KEY = "m:t";
const W: WorkerRef = { workerId: "w", dpRank: 0 };

/** A handoff over one rank that holds `blocks` blocks, recovered from a peer whose cursor is `peer`. */
function recovered(peer: StreamCursor) {
  let blocks = 3;
  const handoff = new StreamHandoff({
    liveKey: KEY,
    index: {
      // The index reads each rank's blocks while its dump is pulled: that is when the rank's cursor is taken.
      models: ({ onSnapshot }) => [{ key: KEY, blockSize: 16, events: (function* () { onSnapshot(KEY, W); })() }],
      workers: () => (blocks > 0 ? [W] : []),
      rank: () => ({ apply: (s) => void (s.kind === "reset" ? (blocks = 0) : blocks++), clear: () => void (blocks = 0), blocks: () => blocks }),
    },
    replayEndpoint: () => undefined,
    known: () => true,
    registry: new Registry(),
    log: pino({ level: "silent" }),
  });
  const inner: DumpTarget = { begin: () => ({ accepts: () => true, model: () => {}, events: () => {}, extras: () => {}, stagedBytes: () => 0, commit: () => {}, abort: () => {} }) };
  const staging = handoff.target(inner).begin();
  staging.extras(KEY, { cursors: [peer] });
  staging.commit();
  const dumped = (): StreamCursor[] => {
    const m = [...handoff.source().models()][0]!;
    for (const _ of m.events);
    return [...m.cursors!()];
  };
  return { handoff, blocks: () => blocks, dumped };
}

const batch = (seq: bigint, epoch: string): ListenerSignal => ({ kind: "batch", seq, batch: { ts: 0, events: [], dataParallelRank: 0 }, epoch });

test("a first live batch under another epoch than the recovered cursor's drops the view taken over, whatever its seq", () => {
  const r = recovered({ ...W, seq: 9n, baseline: 0n, complete: true, epoch: "old" });
  r.handoff.signal(W, batch(10n, "new"));
  expect(r.handoff.get(W)!.handoff).toBe("reset");
  // The peer's 3 blocks went; what is left is the new stream's batch, not known complete (no replay from 0).
  expect(r.blocks()).toBe(1);
  expect(r.dumped()).toEqual([{ ...W, seq: 10n, baseline: 10n, complete: false, epoch: "new" }]);
});

test("under the recovered cursor's epoch a batch at or below it is in the view; the rank's dumped cursor carries the epoch of the batch it applied last", () => {
  const r = recovered({ ...W, seq: 9n, baseline: 0n, complete: true, epoch: "e1" });
  expect(r.dumped()).toEqual([{ ...W, seq: 9n, baseline: 0n, complete: true, epoch: "e1" }]);
  r.handoff.signal(W, batch(9n, "e1"));
  expect([r.handoff.get(W)!.handoff, r.blocks()]).toEqual(["pending", 3]);
  r.handoff.signal(W, batch(10n, "e1"));
  expect([r.handoff.get(W)!.handoff, r.blocks()]).toEqual(["exact", 4]);
  expect(r.dumped()).toEqual([{ ...W, seq: 10n, baseline: 0n, complete: true, epoch: "e1" }]);
});
