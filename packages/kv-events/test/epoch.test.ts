// vLLM #57789 (open, not merged): a publisher whose seq frame carries its epoch (24 bytes: the u64 seq,
// then a 16-byte lifetime id, the layout assumed in src/replay.ts). A new epoch is a restart whatever
// the seq says, which plain vLLM streams cannot show when a restarted publisher reaches the seq we
// expect; frames of 8 bytes keep working beside it.
import { afterEach, expect, test } from "bun:test";
import { encodeBatch, encodeSeq, KvEventListener, KvEventPublisher, PubSocket, type KvEventBatch, type ListenerSignal } from "../src/index.ts";
import { waitUntil } from "./zmq-peer.ts";
import { LOOPBACK } from "@kv-epp/testkit";

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

const batch = (i: number): KvEventBatch => ({ ts: i + 0.5, dataParallelRank: 0, events: [{ type: "BlockRemoved", blockHashes: [BigInt(i)], medium: "GPU" }] });
const epochFrame = (seq: number, epoch: number) => Buffer.concat([encodeSeq(BigInt(seq)), Buffer.alloc(16, epoch)]);
const seqs = (got: ListenerSignal[]) => got.map((s) => (s.kind === "batch" ? Number(s.seq) : s.reason));
/** The epoch each batch signal carries (its consumer's handoff compares them with a recovered cursor's). */
const epochs = (got: ListenerSignal[]) => got.flatMap((s) => (s.kind === "batch" ? [s.epoch] : []));

async function rig() {
  const pub = new PubSocket();
  const ep = await pub.bind(`tcp://${LOOPBACK}.1.6:0`);
  cleanups.push(() => pub.close());
  const l = new KvEventListener({ workerId: "w", dpRank: 0, endpoint: ep, socket: { reconnectMinMs: 10, reconnectMaxMs: 50 } });
  cleanups.push(() => l.close());
  const got: ListenerSignal[] = [];
  l.start();
  l.attach((s) => got.push(s));
  await waitUntil(() => pub.subscribedTo() === 1);
  return { pub, l, got };
}

test("a new epoch at the very seq expected is a restart: the rank is reset, the new stream applies from there", async () => {
  const { pub, l, got } = await rig();
  const E = Buffer.alloc(0);
  for (let i = 0; i < 3; i++) pub.send([E, epochFrame(i, 0xaa), encodeBatch(batch(i))]);
  // A restarted process that published three batches of its own meanwhile continues at seq 3.
  pub.send([E, epochFrame(3, 0xbb), encodeBatch(batch(3))]);
  pub.send([E, epochFrame(4, 0xbb), encodeBatch(batch(4))]);
  await waitUntil(() => got.length === 6);
  expect(seqs(got)).toEqual([0, 1, 2, "restarted", 3, 4]);
  expect(epochs(got)).toEqual(["aa", "aa", "aa", "bb", "bb"].map((e) => e.repeat(16)));
  expect(l.counters.restarts).toBe(1);
  expect(l.counters.decodeErrors).toBe(0);
  expect(l.epoch).toBe("bb".repeat(16));
});

test("an unchanged epoch is one stream; a seq frame of neither 8 nor 24 bytes is malformed and skipped", async () => {
  const { pub, l, got } = await rig();
  const E = Buffer.alloc(0);
  pub.send([E, epochFrame(0, 0x11), encodeBatch(batch(0))]);
  pub.send([E, Buffer.alloc(12), encodeBatch(batch(9))]);
  pub.send([E, epochFrame(1, 0x11), encodeBatch(batch(1))]);
  await waitUntil(() => got.length === 2 && l.counters.decodeErrors === 1);
  expect(seqs(got)).toEqual([0, 1]);
  expect(l.counters.restarts).toBe(0);
});

// SGLang with a snapshot endpoint: the epoch in the topic (`<topic>\0sgl-kv-epoch=<epoch>`), the seq frame 8 bytes; a
// snapshot barrier is an empty batch in the stream's order whose topic adds `\0sgl-kv-snapshot=<id>`.
const sglangTopic = (epoch: string, barrier?: string) => Buffer.from(`kv\0sgl-kv-epoch=${epoch}${barrier === undefined ? "" : `\0sgl-kv-snapshot=${barrier}`}`);

test("SGLang: a new epoch in the topic is a restart; a snapshot barrier under the same epoch is a batch of the stream", async () => {
  const { pub, l, got } = await rig();
  pub.send([sglangTopic("replica-epoch-1"), encodeSeq(0n), encodeBatch(batch(0))]);
  pub.send([sglangTopic("replica-epoch-1", "b-1"), encodeSeq(1n), encodeBatch({ ts: 1.5, dataParallelRank: 0, events: [] })]);
  pub.send([sglangTopic("replica-epoch-1"), encodeSeq(2n), encodeBatch(batch(2))]);
  pub.send([sglangTopic("replica-epoch-2"), encodeSeq(3n), encodeBatch(batch(3))]);
  await waitUntil(() => got.length === 5);
  expect(seqs(got)).toEqual([0, 1, 2, "restarted", 3]);
  expect(epochs(got)).toEqual(["replica-epoch-1", "replica-epoch-1", "replica-epoch-1", "replica-epoch-2"]);
  expect(l.counters.restarts).toBe(1);
  expect(l.epoch).toBe("replica-epoch-2");
});

test("SGLang: a batch replayed into a gap carries the live stream's epoch (its replay reply has none of its own)", async () => {
  const pub = await KvEventPublisher.bind({ endpoint: `tcp://${LOOPBACK}.1.6:0`, replayEndpoint: `tcp://${LOOPBACK}.1.6:0`, topic: "kv\0sgl-kv-epoch=e-1" });
  cleanups.push(() => pub.close());
  const l = new KvEventListener({ workerId: "w", dpRank: 0, endpoint: pub.endpoint, replayEndpoint: pub.replayEndpoint, socket: { reconnectMinMs: 10, reconnectMaxMs: 50 } });
  cleanups.push(() => l.close());
  const got: ListenerSignal[] = [];
  l.start();
  l.attach((s) => got.push(s));
  await waitUntil(() => pub.subscribedCount === 1);
  pub.publish(batch(0));
  pub.publish(batch(1), { drop: true });
  pub.publish(batch(2));
  await waitUntil(() => got.length === 3);
  expect(seqs(got)).toEqual([0, 1, 2]);
  expect(l.counters.replayedBatches).toBe(1);
  expect(epochs(got)).toEqual(["e-1", "e-1", "e-1"]);
});

test("SGLang: an epoch marker with an empty, overlong or non-UTF-8 epoch is malformed and skipped; a topic without one has no epoch", async () => {
  const { pub, l, got } = await rig();
  pub.send([Buffer.from("kv"), encodeSeq(0n), encodeBatch(batch(0))]);
  pub.send([sglangTopic(""), encodeSeq(1n), encodeBatch(batch(1))]);
  pub.send([sglangTopic("e".repeat(257)), encodeSeq(1n), encodeBatch(batch(1))]);
  pub.send([Buffer.concat([Buffer.from("kv\0sgl-kv-epoch="), Buffer.from([0xff, 0xfe])]), encodeSeq(1n), encodeBatch(batch(1))]);
  pub.send([Buffer.from("kv"), encodeSeq(1n), encodeBatch(batch(1))]);
  await waitUntil(() => got.length === 2 && l.counters.decodeErrors === 3);
  expect(seqs(got)).toEqual([0, 1]);
  expect(epochs(got)).toEqual([undefined, undefined]);
  expect(l.epoch).toBeNull();
});
