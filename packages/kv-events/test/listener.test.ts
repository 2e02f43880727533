// KvEventListener against a real KvEventPublisher over loopback TCP: baseline, ordering,
// buffering before attach, gap → replay, gap without replay → reset, restart → reset.
import { afterEach, describe, expect, test } from "bun:test";
import {
  DealerSocket,
  END_SEQ,
  encodeBatch,
  encodeSeq,
  KvEventListener,
  type KvEventBatch,
  KvEventPublisher,
  PubSocket,
  RouterSocket,
  type ListenerOptions,
  type ListenerSignal,
  type Logger,
} from "../src/index.ts";
import { waitUntil } from "./zmq-peer.ts";
import { LOOPBACK, LOOPBACK_PATTERN, TcpProxy } from "@kv-epp/testkit";

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

const batch = (i: number): KvEventBatch => ({
  ts: i + 0.5,
  events: [{ type: "BlockStored", blockHashes: [BigInt(i) + 2n ** 63n], parentBlockHash: null, tokenIds: [i], blockSize: 16, loraId: null, medium: null, loraName: null }],
  dataParallelRank: 0,
});

async function publisher(opts: { replay?: boolean; replayBuffer?: number; endpoint?: string } = {}): Promise<KvEventPublisher> {
  const p = await KvEventPublisher.bind({
    endpoint: opts.endpoint ?? `tcp://${LOOPBACK}.1.4:0`,
    replayEndpoint: opts.replay ? `tcp://${LOOPBACK}.1.4:0` : undefined,
    replayBuffer: opts.replayBuffer,
  });
  cleanups.push(() => p.close());
  return p;
}

function listen(opts: Partial<ListenerOptions> & { endpoint: string }): [KvEventListener, ListenerSignal[]] {
  const l = new KvEventListener({ workerId: "w1", dpRank: 0, socket: { reconnectMinMs: 10, reconnectMaxMs: 50 }, ...opts });
  cleanups.push(() => l.close());
  const got: ListenerSignal[] = [];
  l.start();
  l.attach((s) => got.push(s));
  return [l, got];
}

/** A listener started with no sink, once it has buffered `batches` batches (published while it is connected). */
async function buffering(pub: KvEventPublisher, batches: number, opts: Partial<ListenerOptions> = {}): Promise<KvEventListener> {
  const l = new KvEventListener({ workerId: "w1", dpRank: 0, endpoint: pub.endpoint, ...opts });
  cleanups.push(() => l.close());
  l.start();
  await waitUntil(() => {
    if (l.counters.batches >= batches) return true;
    if (l.connected) pub.publish(batch(Number(pub.nextSeq)));
    return false;
  });
  return l;
}

/** Publishes consecutive batches until the listener has delivered `count` signals in total. */
async function publishUntil(pub: KvEventPublisher, got: ListenerSignal[], count: number): Promise<void> {
  await waitUntil(() => {
    if (got.length >= count) return true;
    pub.publish(batch(Number(pub.nextSeq)));
    return false;
  });
}

/** Cuts the live path, publishes `lost` batches the listener never sees live, then restores it. */
async function loseWhileCut(pub: KvEventPublisher, proxy: TcpProxy, l: KvEventListener, lost: number): Promise<void> {
  proxy.cut();
  await waitUntil(() => !l.connected && pub.subscriberCount === 0);
  for (let i = 0; i < lost; i++) pub.publish(batch(Number(pub.nextSeq)));
  proxy.restore();
}

/** A logger keeping only the messages of its warnings. */
function warningsLogger(): { logger: Logger; warnings: string[] } {
  const warnings: string[] = [];
  const noop = () => {};
  return { logger: { debug: noop, info: noop, error: noop, warn: (_: object, msg?: string) => void warnings.push(msg ?? "") }, warnings };
}

const seqs = (got: ListenerSignal[]) => got.map((s) => (s.kind === "batch" ? Number(s.seq) : s.reason));

const E = Buffer.alloc(0);

/**
 * A publisher and a replay endpoint driven by hand, on ephemeral ports: `payload(i, ts)` a batch's bytes, and
 * `answered` a promise the test's replay answers may wait on until it calls `release`.
 */
async function handDriven() {
  const pub = new PubSocket();
  const ep = await pub.bind(`tcp://${LOOPBACK}.1.4:0`);
  const router = new RouterSocket();
  const rep = await router.bind(`tcp://${LOOPBACK}.1.4:0`);
  cleanups.push(() => pub.close(), () => router.close());
  let release = () => {};
  const answered = new Promise<void>((r) => (release = r));
  const payload = (i: number, ts?: number) => encodeBatch(ts === undefined ? batch(i) : { ...batch(i), ts });
  return { pub, ep, router, rep, payload, answered, release };
}

describe("KvEventListener", () => {
  test("the first message sets the baseline; later ones arrive in order with decoded events", async () => {
    const pub = await publisher();
    for (let i = 0; i < 3; i++) pub.publish(batch(i)); // nobody listens yet: history before the baseline
    const [l, got] = listen({ endpoint: pub.endpoint });
    await publishUntil(pub, got, 4);
    const first = got[0]!;
    expect(first.kind).toBe("batch");
    const s = seqs(got);
    expect(s.every((x, i) => i === 0 || x === (s[i - 1] as number) + 1)).toBe(true);
    const b = (first as Extract<ListenerSignal, { kind: "batch" }>).batch;
    expect(b).toEqual(batch(Number((first as { seq: bigint }).seq)));
    expect(l.counters.resets).toBe(0);
    expect(l.connected).toBe(true);
  });

  test("signals wait (bounded) until a sink is attached; overflow turns into a reset", async () => {
    const pub = await publisher();
    const l = await buffering(pub, 5, { maxBuffered: 3 });
    const got: ListenerSignal[] = [];
    l.attach((s) => got.push(s));
    expect(got[0]).toEqual({ kind: "reset", reason: "overflow" });
    expect(got.length).toBeLessThanOrEqual(3);
    expect(l.counters.overflows).toBeGreaterThanOrEqual(1);
  });

  test("a gap is filled from the replay endpoint: every seq is delivered once, in order, no reset", async () => {
    const pub = await publisher({ replay: true });
    const proxy = await TcpProxy.start(pub.endpoint);
    cleanups.push(() => proxy.close());
    const [l, got] = listen({ endpoint: proxy.endpoint, replayEndpoint: pub.replayEndpoint });
    await publishUntil(pub, got, 2);
    await loseWhileCut(pub, proxy, l, 5); // lost on the live path
    await publishUntil(pub, got, 10);
    const s = seqs(got);
    expect(s).toEqual(s.map((_, i) => (s[0] as number) + i));
    expect(l.counters.gaps).toBe(1);
    expect(l.counters.replays).toBe(1);
    expect(l.counters.replayedBatches).toBeGreaterThanOrEqual(5);
    expect(l.counters.resets).toBe(0);
  });

  test("a gap without a replay endpoint resets the worker (gap-unrecovered) and continues", async () => {
    const pub = await publisher();
    const proxy = await TcpProxy.start(pub.endpoint);
    cleanups.push(() => proxy.close());
    const [l, got] = listen({ endpoint: proxy.endpoint });
    await publishUntil(pub, got, 2);
    await loseWhileCut(pub, proxy, l, 3);
    await publishUntil(pub, got, 4);
    expect(got[2]).toEqual({ kind: "reset", reason: "gap-unrecovered" });
    expect(got[3]!.kind).toBe("batch");
    expect(l.counters.gaps).toBe(1);
  });

  test("a replay that does not reach back to the gap falls back to a reset", async () => {
    const pub = await publisher({ replay: true, replayBuffer: 2 });
    const proxy = await TcpProxy.start(pub.endpoint);
    cleanups.push(() => proxy.close());
    const [l, got] = listen({ endpoint: proxy.endpoint, replayEndpoint: pub.replayEndpoint });
    await publishUntil(pub, got, 2);
    await loseWhileCut(pub, proxy, l, 6);
    await publishUntil(pub, got, 4);
    expect(got[2]).toEqual({ kind: "reset", reason: "gap-unrecovered" });
    expect(l.counters.replays).toBe(1);
    expect(l.counters.replayFailures).toBe(1);
  });

  test("a publisher restart (seq going backwards) resets the worker as 'restarted'", async () => {
    let pub = await publisher();
    const endpoint = pub.endpoint;
    for (let i = 0; i < 20; i++) pub.publish(batch(i));
    const [l, got] = listen({ endpoint });
    await publishUntil(pub, got, 2);
    await pub.close();
    await waitUntil(() => !l.connected);
    pub = await publisher({ endpoint });
    await publishUntil(pub, got, 4);
    expect(got[2]).toEqual({ kind: "reset", reason: "restarted" });
    expect(got[3]!.kind === "batch" && got[3]!.seq < 20n).toBe(true);
    expect(l.counters.restarts).toBe(1);
  });

  test("a connection that goes before the first batch: the first batch on the next one follows a reset 'reconnected'", async () => {
    let pub = await publisher();
    const endpoint = pub.endpoint;
    const [l, got] = listen({ endpoint });
    await waitUntil(() => l.connected);
    // The process subscribed to restarts before publishing anything the listener saw.
    await pub.close();
    await waitUntil(() => !l.connected);
    pub = await publisher({ endpoint });
    for (let i = 0; i < 5; i++) pub.publish(batch(i));
    await publishUntil(pub, got, 2);
    expect(got[0]).toEqual({ kind: "reset", reason: "reconnected" });
    expect(got[1]!.kind).toBe("batch");
    expect(got.slice(1).every((s) => s.kind === "batch")).toBe(true);
    expect(l.counters.resets).toBe(1);
  });

  test("a restart that got past our seq while we reconnected is told from a gap: the replayed last batch differs", async () => {
    let pub = await publisher({ replay: true });
    const { endpoint, replayEndpoint } = { endpoint: pub.endpoint, replayEndpoint: pub.replayEndpoint! };
    const [l, got] = listen({ endpoint, replayEndpoint });
    await publishUntil(pub, got, 3);
    const applied = got.length;
    await pub.close();
    await waitUntil(() => !l.connected);
    // The new process (same endpoints) publishes far past our seq before the listener is back.
    pub = await KvEventPublisher.bind({ endpoint, replayEndpoint });
    cleanups.push(() => pub.close());
    for (let i = 0; i < 30; i++) pub.publish({ ...batch(i), ts: 1000 + i });
    await publishUntil(pub, got, applied + 2);
    // Not a gap "covered" by the new process's buffer: a restart, then its stream from the first batch seen.
    expect(got[applied]).toEqual({ kind: "reset", reason: "restarted" });
    expect(l.counters.restarts).toBe(1);
    const next = got[applied + 1]!;
    expect(next.kind === "batch" && next.seq >= 30n).toBe(true);
  });

  test("a restart that reached exactly our next seq while we reconnected is told apart by replaying our last batch", async () => {
    let pub = await publisher({ replay: true });
    const { endpoint, replayEndpoint } = { endpoint: pub.endpoint, replayEndpoint: pub.replayEndpoint! };
    const [l, got] = listen({ endpoint, replayEndpoint });
    await publishUntil(pub, got, 3);
    const seen = Number(pub.nextSeq);
    const applied = got.length;
    await pub.close();
    await waitUntil(() => !l.connected);
    // The new process publishes as many batches as we had seen (other content) before the listener is back:
    // its next seq is the one we expect, so nothing in the seqs alone says it is another stream.
    pub = await KvEventPublisher.bind({ endpoint, replayEndpoint });
    cleanups.push(() => pub.close());
    for (let i = 0; i < seen; i++) pub.publish({ ...batch(i), ts: 1000 + i });
    // Only then is the listener back, and the first batch it sees is seq `seen`.
    await waitUntil(() => pub.subscribedCount === 1);
    await publishUntil(pub, got, applied + 2);
    expect(got[applied]).toEqual({ kind: "reset", reason: "restarted" });
    expect(l.counters.restarts).toBe(1);
    const next = got[applied + 1]!;
    expect(next.kind === "batch" && next.seq >= BigInt(seen)).toBe(true);
  });

  test("a reconnect to the same publisher with nothing lost replays only the check: no reset, no batch twice", async () => {
    const pub = await publisher({ replay: true });
    const proxy = await TcpProxy.start(pub.endpoint);
    cleanups.push(() => proxy.close());
    const [l, got] = listen({ endpoint: proxy.endpoint, replayEndpoint: pub.replayEndpoint! });
    await publishUntil(pub, got, 3);
    await loseWhileCut(pub, proxy, l, 0);
    await publishUntil(pub, got, 6);
    expect(got.every((s) => s.kind === "batch")).toBe(true);
    expect(seqs(got)).toEqual(seqs(got).map((_, i) => Number((got[0] as { seq: bigint }).seq) + i));
    expect(l.counters.restarts).toBe(0);
    expect(l.counters.replays).toBe(1);
  });

  test("after a reconnect, a gap in the same publisher's stream is still filled by replay (its last batch replays unchanged)", async () => {
    const pub = await publisher({ replay: true });
    const proxy = await TcpProxy.start(pub.endpoint);
    cleanups.push(() => proxy.close());
    const [l, got] = listen({ endpoint: proxy.endpoint, replayEndpoint: pub.replayEndpoint! });
    await publishUntil(pub, got, 3);
    await loseWhileCut(pub, proxy, l, 5);
    await publishUntil(pub, got, 3 + 5 + 1);
    expect(got.every((s) => s.kind === "batch")).toBe(true);
    expect(seqs(got)).toEqual(seqs(got).map((_, i) => Number((got[0] as { seq: bigint }).seq) + i));
    expect(l.counters.restarts).toBe(0);
  });

  test("a publisher restart seen while a replay is in flight is reported as 'restarted', the new process's batches delivered", async () => {
    // Hand-driven publisher and replay endpoint, to restart the seqs exactly while the replay is open.
    const { pub, ep, router, rep, payload, answered, release } = await handDriven();
    router.onMessage(([id]) => {
      // The replay (of seq 5) is answered once the restarted publisher's batches were held.
      void answered.then(() => {
        router.send([id!, E, encodeSeq(5n), payload(5)]);
        router.send([id!, E, END_SEQ, E]);
      });
    });
    const [l, got] = listen({ endpoint: ep, replayEndpoint: rep, replayTimeoutMs: 5000 });
    await waitUntil(() => pub.subscribedTo(E) === 1);
    const send = (seq: number) => pub.send([E, encodeSeq(BigInt(seq)), payload(seq)]);
    for (let i = 0; i < 5; i++) send(i);
    await waitUntil(() => got.length === 5);
    send(6); // seq 5 lost: a replay opens
    await waitUntil(() => l.counters.replays === 1);
    for (let i = 0; i < 4; i++) send(i); // the restarted process, seq from 0
    await waitUntil(() => l.counters.messages === 10);
    release();
    await waitUntil(() => got.length === 12);
    expect(seqs(got)).toEqual([0, 1, 2, 3, 4, 5, 6, "restarted", 0, 1, 2, 3]);
    expect(l.counters.restarts).toBe(1);
  });

  test("a new connection's first batch held behind a replay is still checked as possibly another process's", async () => {
    // Hand-driven publisher and replay endpoint: the publisher restarts while a replay is open, and its first batch
    // is the very seq the replay leaves us expecting (nothing in the seqs says it is another stream).
    const first = await handDriven();
    const { ep, router, rep, payload, answered, release } = first;
    let pub = first.pub;
    let requests = 0;
    router.onMessage(([id]) => {
      const n = ++requests;
      void answered.then(() => {
        // The first replay (the gap, 5 and 6) as the old process published them; the next one (the check of our
        // last batch, 7) as the new process did.
        if (n === 1) for (const i of [5, 6]) router.send([id!, E, encodeSeq(BigInt(i)), payload(i)]);
        else router.send([id!, E, encodeSeq(7n), payload(7, 1000)]);
        router.send([id!, E, END_SEQ, E]);
      });
    });
    const [l, got] = listen({ endpoint: ep, replayEndpoint: rep, replayTimeoutMs: 5000 });
    await waitUntil(() => pub.subscribedTo(E) === 1);
    const send = (seq: number, ts = 0) => pub.send([E, encodeSeq(BigInt(seq)), payload(seq, ts)]);
    for (let i = 0; i < 5; i++) send(i);
    await waitUntil(() => got.length === 5);
    send(7); // 5 and 6 lost: a replay opens
    await waitUntil(() => l.counters.replays === 1);
    await pub.close();
    await waitUntil(() => !l.connected);
    pub = new PubSocket();
    cleanups.push(() => pub.close());
    await pub.bind(ep);
    await waitUntil(() => pub.subscribedTo(E) === 1);
    send(8, 1000); // the new process's, held behind the replay
    await waitUntil(() => l.counters.messages === 7);
    release();
    await waitUntil(() => got.length === 10);
    // Taken as the next batch of the same stream, 8 would have gone on top of the old process's blocks.
    expect(seqs(got)).toEqual([0, 1, 2, 3, 4, 5, 6, 7, "restarted", 8]);
    expect(requests).toBe(2);
  });

  test("signals buffered before attach all arrive even when the sink throws on one", async () => {
    const pub = await publisher();
    const l = await buffering(pub, 5);
    const seen: bigint[] = [];
    l.attach((s) => {
      if (s.kind !== "batch") return;
      seen.push(s.seq);
      if (seen.length === 2) throw new Error("consumer bug");
    });
    expect(seen.length).toBe(l.counters.batches);
    expect(l.counters.sinkErrors).toBe(1);
  });

  test("a batch that cannot be decoded is a hole: without a replay endpoint the rank resets (gap-unrecovered), logged once per cause", async () => {
    const pub = await publisher();
    const { logger, warnings } = warningsLogger();
    const [l, got] = listen({ endpoint: pub.endpoint, logger });
    await publishUntil(pub, got, 1);
    const k = Number((got[0] as { seq: bigint }).seq);
    pub.publishPayload(Buffer.from([0xc1, 0xff]));
    pub.publishPayload(Buffer.from([0xc1, 0xfe]));
    pub.publish(batch(99));
    await waitUntil(() => got.length >= 4);
    // Skipped as if nothing was lost, the rank's view would have gone on without those batches' stores and removes.
    expect(seqs(got)).toEqual([k, "gap-unrecovered", "gap-unrecovered", k + 3]);
    expect(l.counters.decodeErrors).toBe(2);
    expect(l.counters.gaps).toBe(2);
    expect(warnings.filter((w) => w.includes("malformed"))).toHaveLength(1);
    expect(warnings.filter((w) => w.includes("could not be decoded"))).toHaveLength(1);
  });

  test("a batch that cannot be decoded is asked again by its seq: a good copy fills the hole, a bad one resets", async () => {
    const { pub, ep, router, rep, payload } = await handDriven();
    const asked: bigint[] = [];
    router.onMessage(([id, , from]) => {
      const seq = from!.readBigUInt64BE(0);
      asked.push(seq);
      // seq 2 replays as it should have read; seq 5 is as broken in the replay buffer as it was live
      router.send([id!, E, encodeSeq(seq), seq === 2n ? payload(2) : Buffer.from([0xc1])]);
      router.send([id!, E, END_SEQ, E]);
    });
    const [l, got] = listen({ endpoint: ep, replayEndpoint: rep });
    await waitUntil(() => pub.subscribedTo(E) === 1);
    for (let i = 0; i < 7; i++) pub.send([E, encodeSeq(BigInt(i)), i === 2 || i === 5 ? Buffer.from([0x93, 0xc1]) : payload(i)]);
    await waitUntil(() => got.length === 7);
    expect(seqs(got)).toEqual([0, 1, 2, 3, 4, "gap-unrecovered", 6]);
    expect(got[2]).toEqual({ kind: "batch", seq: 2n, batch: batch(2) });
    expect(asked).toEqual([2n, 5n]);
    expect(l.counters.replays).toBe(2);
    expect(l.counters.replayFailures).toBe(0);
  });

  test("the first batch of a listener attached before its first connection is marked as newer than the sink's view", async () => {
    const pub = await publisher();
    const [, got] = listen({ endpoint: pub.endpoint });
    await publishUntil(pub, got, 2);
    expect(got.map((s) => s.kind === "batch" && s.connectedAfterAttach === true)).toEqual([true, false]);
    // Connected while buffering: its batches may be older than anything the sink was given meanwhile.
    const l = await buffering(pub, 1);
    const late: ListenerSignal[] = [];
    l.attach((s) => late.push(s));
    expect(late[0]).toMatchObject({ kind: "batch" });
    expect(late.some((s) => s.kind === "batch" && s.connectedAfterAttach)).toBe(false);
  });
});

describe("publisher fault injection", () => {
  test("a dropped batch (kept for replay) is recovered by replay; a skipped seq forces a reset", async () => {
    const pub = await publisher({ replay: true });
    const [l, got] = listen({ endpoint: pub.endpoint, replayEndpoint: pub.replayEndpoint });
    await publishUntil(pub, got, 1);
    pub.publish(batch(1), { drop: true });
    pub.publish(batch(2));
    await waitUntil(() => got.length >= 3);
    expect(got.slice(1).map((s) => s.kind)).toEqual(["batch", "batch"]);
    expect(l.counters.replayedBatches).toBe(1);
    pub.skipSeq(2);
    pub.publish(batch(3));
    await waitUntil(() => got.length >= 5);
    expect(got[3]).toEqual({ kind: "reset", reason: "gap-unrecovered" });
    expect(l.counters.replayFailures).toBe(1);
  });
});

describe("containment", () => {
  test("a malformed replay request is counted, logged once and ignored; the replay endpoint keeps serving", async () => {
    const { logger, warnings } = warningsLogger();
    const pub = await KvEventPublisher.bind({ endpoint: `tcp://${LOOPBACK}.1.4:0`, replayEndpoint: `tcp://${LOOPBACK}.1.4:0`, logger });
    cleanups.push(() => pub.close());
    const dealer = new DealerSocket();
    cleanups.push(() => dealer.close());
    const replies: Buffer[][] = [];
    dealer.onMessage((frames) => void replies.push(frames));
    dealer.connect(pub.replayEndpoint!);
    pub.publish(batch(0));
    dealer.send([Buffer.alloc(0), Buffer.from("not a seq")]);
    dealer.send([Buffer.alloc(0), Buffer.from([1, 2])]);
    dealer.send([Buffer.alloc(0), encodeSeq(0n)]);
    await waitUntil(() => replies.length >= 2); // the batch, then the end marker
    expect(pub.replayCounters).toMatchObject({ malformed: 2, requests: 1, batchesSent: 1 });
    expect(warnings.filter((w) => w.includes("malformed"))).toHaveLength(1);
  });

  test("a sink that throws is counted; the listener keeps delivering", async () => {
    const pub = await publisher();
    const l = new KvEventListener({ workerId: "w1", dpRank: 0, endpoint: pub.endpoint });
    cleanups.push(() => l.close());
    let calls = 0;
    l.attach(() => {
      calls++;
      throw new Error("consumer bug");
    });
    l.start();
    await waitUntil(() => {
      pub.publish(batch(Number(pub.nextSeq)));
      return calls >= 3;
    });
    expect(l.counters.sinkErrors).toBe(calls);
    expect(l.connected).toBe(true);
  });
});

describe("KvEventListener in bind mode", () => {
  test("binds its endpoint and takes a publisher that connects to it (as vLLM's PUB does when its endpoint is not a wildcard)", async () => {
    const [l, got] = listen({ endpoint: `tcp://${LOOPBACK}.1.1:0`, bind: true });
    const endpoint = await l.bound();
    expect(endpoint).toMatch(new RegExp(`^tcp://${LOOPBACK_PATTERN}\\.1\\.1:\\d+$`));
    const pub = new PubSocket({ reconnectMinMs: 10, reconnectMaxMs: 50 });
    cleanups.push(() => pub.close());
    pub.connect(endpoint);
    let seq = 0n;
    await waitUntil(() => {
      if (got.length >= 3) return true;
      pub.send([Buffer.alloc(0), encodeSeq(seq), Buffer.from(encodeBatch(batch(Number(seq))))]);
      seq++;
      return false;
    });
    expect(l.connected).toBe(true);
    expect(got.slice(0, 3).every((s) => s.kind === "batch")).toBe(true);
    expect((got[0] as Extract<ListenerSignal, { kind: "batch" }>).batch).toEqual(batch(Number((got[0] as { seq: bigint }).seq)));
  });

  test("a bind that fails is reported by bound(), and a connect-mode listener has nothing bound", async () => {
    const [a] = listen({ endpoint: `tcp://${LOOPBACK}.1.1:0`, bind: true });
    const taken = await a.bound();
    const [b] = listen({ endpoint: taken, bind: true });
    await expect(b.bound()).rejects.toThrow();
    const [c] = listen({ endpoint: taken });
    await expect(c.bound()).rejects.toThrow(/does not bind/);
  });
});
