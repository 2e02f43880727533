// The handoff's seam with the dump: a peer cursor's publisher epoch reaches the rank it is taken over for,
// and a rank's own epoch leaves in its dumped cursor. The rule itself is rank-stream.test.ts's; here also a
// real listener over loopback TCP whose link to its publisher drops before the view's first batch.
import { afterEach, expect, test } from "bun:test";
import type { StreamCursor, WorkerRef } from "@kv-epp/protocol";
import { KvEventListener, KvEventPublisher, type KvEventBatch, type ListenerSignal } from "@kv-epp/kv-events";
import { LOOPBACK, TcpProxy, waitFor } from "@kv-epp/testkit";
import type { DumpTarget } from "@kv-epp/recovery";
import pino from "pino";
import { Registry } from "prom-client";
import { StreamHandoff } from "./handoff.ts";

const KEY = "m:t";
/** The EPP's loopback octet (testkit README "Addresses"). */
const HOST = `${LOOPBACK}.4`;
const W: WorkerRef = { workerId: "w", dpRank: 0 };

const cleanups: (() => unknown)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

/**
 * A handoff over one rank that holds `blocks` blocks, recovered from a peer whose cursor is `peer`; `replay`:
 * the rank's replay endpoint.
 */
function recovered(peer: StreamCursor, replay?: string) {
  let blocks = 3;
  const handoff = new StreamHandoff({
    liveKey: KEY,
    index: {
      // The index reads each rank's blocks while its dump is pulled: that is when the rank's cursor is taken.
      models: ({ onSnapshot }) => [{ key: KEY, blockSize: 16, events: (function* () { onSnapshot(KEY, W); })() }],
      workers: () => (blocks > 0 ? [W] : []),
      rank: () => ({ apply: (s) => void (s.kind === "reset" ? (blocks = 0) : blocks++), clear: () => void (blocks = 0), blocks: () => blocks }),
    },
    replayEndpoint: () => replay,
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

/** A worker's KV publisher (a new process each time) under `epoch`, SGLang's topic marker; null: no epoch. */
async function publisher(endpoint: string, replayEndpoint: string, epoch: string | null): Promise<KvEventPublisher> {
  const p = await KvEventPublisher.bind({ endpoint, replayEndpoint, topic: epoch === null ? "kv" : `kv\0sgl-kv-epoch=${epoch}` });
  cleanups.push(() => p.close());
  return p;
}

const removal = (i: number): KvEventBatch => ({ ts: i + 0.5, dataParallelRank: 0, events: [{ type: "BlockRemoved", blockHashes: [BigInt(i)], medium: "GPU" }] });

/**
 * The view taken over at the publisher's seq 4 (`peerEpoch`), and a listener that connects to the publisher
 * (through a link the test cuts), hears nothing, and loses the link. While it is down, `meanwhile` runs (and
 * may replace the publisher); then the link comes back and the publisher sends one batch, the listener's first.
 * `replay`: the rank has a replay endpoint.
 */
async function reconnectBeforeFirstBatch(o: { epoch: string | null; peerEpoch: string | null; replay: boolean; meanwhile: (p: KvEventPublisher) => Promise<KvEventPublisher> }) {
  let pub = await publisher(`tcp://${HOST}.210:0`, `tcp://${HOST}.210:0`, o.epoch);
  for (let i = 0; i <= 4; i++) pub.publish(removal(i));
  const r = recovered({ ...W, seq: 4n, baseline: 0n, complete: true, epoch: o.peerEpoch }, o.replay ? pub.replayEndpoint : undefined);
  const link = await TcpProxy.start(pub.endpoint, `${HOST}.211`);
  cleanups.push(() => link.close());
  const l = new KvEventListener({ workerId: W.workerId, dpRank: W.dpRank, endpoint: link.endpoint, socket: { reconnectMinMs: 10, reconnectMaxMs: 50 } });
  cleanups.push(() => l.close());
  l.start();
  l.attach((s) => r.handoff.signal(W, s));
  await waitFor(() => pub.subscribedCount === 1, { message: "listener subscribed" });
  link.cut();
  await waitFor(() => !l.connected && pub.subscriberCount === 0, { message: "link down" });
  pub = await o.meanwhile(pub);
  link.restore();
  await waitFor(() => pub.subscribedCount === 1, { message: "listener subscribed again" });
  pub.publish(removal(Number(pub.nextSeq)));
  await waitFor(() => r.handoff.get(W)!.handoff !== "pending", { message: "handoff decided" });
  return { r, l, seq: pub.nextSeq - 1n };
}

const samePublisher = async (p: KvEventPublisher) => p;

test("a reconnect to the same publisher epoch before the view's first batch keeps the view: the next seq continues it, or replay fills what the link missed", async () => {
  const next = await reconnectBeforeFirstBatch({ epoch: "e1", peerEpoch: "e1", replay: false, meanwhile: samePublisher });
  expect(next.l.counters.resets).toBe(1); // the listener could not tell: the rank's stream did
  expect([next.r.handoff.get(W)!.handoff, next.r.blocks()]).toEqual(["exact", 4]);
  expect(next.r.dumped()).toEqual([{ ...W, seq: 5n, baseline: 0n, complete: true, epoch: "e1" }]);
  const hole = await reconnectBeforeFirstBatch({
    epoch: "e1",
    peerEpoch: "e1",
    replay: true,
    meanwhile: async (p) => {
      for (let i = 0; i < 2; i++) p.publish(removal(Number(p.nextSeq)));
      return p;
    },
  });
  expect([hole.seq, hole.r.handoff.get(W)!.handoff, hole.r.blocks()]).toEqual([7n, "replayed", 6]);
  expect(hole.r.dumped()).toEqual([{ ...W, seq: 7n, baseline: 0n, complete: true, epoch: "e1" }]);
});

test("a reconnect before the view's first batch drops the view when its publisher restarted (another epoch, even at the next seq), when the epoch is unknown, or when the link's hole is not replayable", async () => {
  const restarted = await reconnectBeforeFirstBatch({
    epoch: "e1",
    peerEpoch: "e1",
    replay: false,
    // The new process has published as many batches as the view holds: its next seq is the view's next.
    meanwhile: async (p) => {
      await p.close();
      const q = await publisher(p.endpoint, p.replayEndpoint!, "e2");
      for (let i = 0; i <= 4; i++) q.publish(removal(i));
      return q;
    },
  });
  expect([restarted.seq, restarted.r.handoff.get(W)!.handoff, restarted.r.blocks()]).toEqual([5n, "reset", 1]);
  const noEpoch = await reconnectBeforeFirstBatch({ epoch: null, peerEpoch: null, replay: false, meanwhile: samePublisher });
  expect([noEpoch.r.handoff.get(W)!.handoff, noEpoch.r.blocks()]).toEqual(["reset", 1]);
  const unreplayable = await reconnectBeforeFirstBatch({
    epoch: "e1",
    peerEpoch: "e1",
    replay: false,
    meanwhile: async (p) => {
      p.publish(removal(Number(p.nextSeq)));
      return p;
    },
  });
  expect([unreplayable.r.handoff.get(W)!.handoff, unreplayable.r.blocks()]).toEqual(["dropped", 1]);
  expect(unreplayable.r.dumped()).toEqual([{ ...W, seq: 6n, baseline: 6n, complete: false, epoch: "e1" }]);
});
