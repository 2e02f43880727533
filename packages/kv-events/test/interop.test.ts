// Our ZMTP sockets (under Bun) against libzmq (the `zeromq` package under Node), both directions.
import { afterAll, afterEach, describe, expect, test } from "bun:test";
import {
  DealerSocket, decodeBatch, decodeSeq, END_SEQ, encodeBatch, encodeSeq, type KvEventBatch, KvEventListener, KvEventPublisher,
  type ListenerSignal, PubSocket, RouterSocket, type SocketOptions, SubSocket,
} from "../src/index.ts";
import { killAllPeers, waitUntil, ZmqPeer } from "./zmq-peer.ts";
import { LOOPBACK } from "@kv-epp/testkit";

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
  await killAllPeers();
});
afterAll(killAllPeers);

const big = (n: number, seed: number) => Buffer.from(Array.from({ length: n }, (_, i) => (i * 31 + seed) & 0xff));
const hex = (fs: Uint8Array[]) => fs.map((f) => Buffer.from(f).toString("hex"));

describe("libzmq PUB → our SUB", () => {
  test("multipart messages with short, long (>255 B) and very long (>64 KiB) frames arrive intact, filtered by prefix", async () => {
    const peer = await ZmqPeer.start("PUB", "bind", `tcp://${LOOPBACK}.1.1:*`);
    const sub = new SubSocket();
    cleanups.push(() => sub.close());
    const got: Buffer[][] = [];
    sub.onMessage((f) => got.push(f.map((x) => Buffer.from(x))));
    sub.subscribe("kv");
    sub.connect(peer.endpoint);
    // Slow joiner: probe until the subscription has reached libzmq.
    await waitUntil(() => {
      peer.send([Buffer.from("kv-probe")]);
      return got.length > 0;
    });
    const msgs = [
      [Buffer.from("kv"), Buffer.alloc(0), big(300, 1)],
      [Buffer.from("other"), big(10, 2)],
      [Buffer.from("kv.1"), big(70_000, 3), big(5, 4), big(256, 5)],
    ];
    for (const m of msgs) peer.send(m);
    peer.send([Buffer.from("kv-end")]);
    await waitUntil(() => got.some((g) => g[0]!.toString() === "kv-end"));
    const real = got.filter((g) => !g[0]!.toString().startsWith("kv-"));
    expect(real.map(hex)).toEqual([hex(msgs[0]!), hex(msgs[2]!)]);
  });

  test("libzmq answers our heartbeat PINGs and keeps us through idle and busy spells (its TTL timer is fed)", async () => {
    const peer = await ZmqPeer.start("PUB", "bind", `tcp://${LOOPBACK}.1.1:*`);
    // A TTL a loaded machine's scheduling cannot run out by itself (a 200 ms one did, once, in a CI run): the
    // spells below are several TTLs long, so a libzmq that did not hear our PINGs would still drop us.
    const hb = { intervalMs: 100, timeoutMs: 1000 };
    const sub = new SubSocket({ heartbeat: hb });
    cleanups.push(() => sub.close());
    const got: string[] = [];
    sub.onMessage((f) => got.push(Buffer.from(f[0]!).toString()));
    sub.subscribe("");
    sub.connect(peer.endpoint);
    await waitUntil(() => sub.peerCount === 1);
    await Bun.sleep(hb.timeoutMs * 3); // idle: only PING/PONG on the wire
    expect(sub.counters.heartbeatTimeouts).toBe(0);
    expect(sub.counters.disconnects).toBe(0);
    await waitUntil(() => {
      peer.send([Buffer.from("after-idle")]);
      return got.includes("after-idle");
    });
    // Busy: events keep arriving, and libzmq still hears from us within each PING's TTL.
    const t0 = performance.now();
    while (performance.now() - t0 < hb.timeoutMs * 3) {
      peer.send([Buffer.from("busy")]);
      await Bun.sleep(20);
    }
    expect(sub.counters.disconnects).toBe(0);
    expect(sub.counters.heartbeatTimeouts).toBe(0);
  });

  test("a 3.0-speaking SUB (message-form subscriptions) is understood by libzmq", async () => {
    const peer = await ZmqPeer.start("PUB", "bind", `tcp://${LOOPBACK}.1.1:*`);
    const sub = new SubSocket({ zmtpMinor: 0 });
    cleanups.push(() => sub.close());
    const got: string[] = [];
    sub.onMessage((f) => got.push(f[0]!.toString()));
    sub.subscribe("a");
    sub.connect(peer.endpoint);
    await waitUntil(() => {
      peer.send([Buffer.from("b-no")]);
      peer.send([Buffer.from("a-yes")]);
      return got.length > 0;
    });
    expect(got.every((t) => t === "a-yes")).toBe(true);
  });

  test("the SUB reconnects after the publisher restarts and re-sends its subscription", async () => {
    let peer = await ZmqPeer.start("PUB", "bind", `tcp://${LOOPBACK}.1.1:*`);
    const endpoint = peer.endpoint;
    const sub = new SubSocket({ reconnectMinMs: 20, reconnectMaxMs: 200 });
    cleanups.push(() => sub.close());
    const got: string[] = [];
    sub.onMessage((f) => got.push(f[0]!.toString()));
    sub.subscribe("");
    sub.connect(endpoint);
    await waitUntil(() => {
      peer.send([Buffer.from("before")]);
      return got.includes("before");
    });
    await peer.kill();
    await waitUntil(() => sub.peerCount === 0);
    peer = await ZmqPeer.start("PUB", "bind", endpoint);
    await waitUntil(() => {
      peer.send([Buffer.from("after")]);
      return got.includes("after");
    });
    expect(sub.counters.disconnects).toBeGreaterThanOrEqual(1);
    expect(sub.counters.reconnects).toBeGreaterThanOrEqual(1);
  });

  test("a message above maxMessageSize closes that connection and is counted", async () => {
    const peer = await ZmqPeer.start("PUB", "bind", `tcp://${LOOPBACK}.1.1:*`);
    const sub = new SubSocket({ maxMessageSize: 1000, reconnectMinMs: 20 });
    cleanups.push(() => sub.close());
    const got: number[] = [];
    sub.onMessage((f) => got.push(f[0]!.length));
    sub.subscribe("");
    sub.connect(peer.endpoint);
    await waitUntil(() => {
      peer.send([Buffer.from("x")]);
      return got.length > 0;
    });
    peer.send([big(5000, 9)]);
    await waitUntil(() => sub.counters.oversize >= 1);
    expect(got.includes(5000)).toBe(false);
  });
});

/** Our PUB bound on loopback with a libzmq SUB connected and subscribed to `prefix`. */
async function ourPubWithZmqSub(prefix: string, opts: SocketOptions = {}) {
  const pub = new PubSocket(opts);
  cleanups.push(() => pub.close());
  const endpoint = await pub.bind(`tcp://${LOOPBACK}.1.1:0`);
  const peer = await ZmqPeer.start("SUB", "connect", endpoint);
  peer.subscribe(prefix);
  return { pub, endpoint, peer };
}

describe("our PUB → libzmq SUB", () => {
  test("libzmq (ZMTP 3.1 SUBSCRIBE) receives multipart and long frames, prefix-filtered", async () => {
    const { pub, peer } = await ourPubWithZmqSub("kv");
    await waitUntil(() => {
      pub.send([Buffer.from("kv-probe")]);
      return peer.messages.length > 0;
    });
    const msgs = [
      [Buffer.from("kv"), Buffer.alloc(0), big(300, 1)],
      [Buffer.from("zz"), big(10, 2)],
      [Buffer.from("kv.2"), big(70_000, 3), big(256, 5)],
    ];
    for (const m of msgs) pub.send(m);
    pub.send([Buffer.from("kv-end")]);
    await waitUntil(() => peer.messages.some((g) => g[0]!.toString() === "kv-end"));
    const real = peer.messages.filter((g) => !g[0]!.toString().startsWith("kv-"));
    expect(real.map(hex)).toEqual([hex(msgs[0]!), hex(msgs[2]!)]);
  });

  test("one PUB fans out to many subscribers (libzmq and ours), each filtered by its own prefixes", async () => {
    const { pub, endpoint, peer } = await ourPubWithZmqSub("a");
    const ours = ["b", "a"].map((prefix) => {
      const sub = new SubSocket();
      cleanups.push(() => sub.close());
      const got: string[] = [];
      sub.onMessage((f) => got.push(f[0]!.toString()));
      sub.subscribe(prefix);
      sub.connect(endpoint);
      return got;
    });
    await waitUntil(() => {
      pub.send([Buffer.from("a-probe")]);
      pub.send([Buffer.from("b-probe")]);
      return peer.messages.length > 0 && ours.every((g) => g.length > 0);
    });
    for (const t of ["a1", "b1", "c1", "a2"]) pub.send([Buffer.from(t)]);
    pub.send([Buffer.from("a-end")]);
    pub.send([Buffer.from("b-end")]);
    await waitUntil(() => peer.messages.some((m) => m[0]!.toString() === "a-end") && ours[0]!.includes("b-end") && ours[1]!.includes("a-end"));
    const real = (xs: string[]) => xs.filter((t) => !t.includes("-"));
    expect(real(peer.messages.map((m) => m[0]!.toString()))).toEqual(["a1", "a2"]);
    expect(real(ours[0]!)).toEqual(["b1"]);
    expect(real(ours[1]!)).toEqual(["a1", "a2"]);
    expect(pub.subscriberCount).toBe(3);
  });

  test("a 3.0 PUB (ours advertising minor 0) gets libzmq's message-form subscriptions", async () => {
    const { pub, peer } = await ourPubWithZmqSub("t", { zmtpMinor: 0 });
    await waitUntil(() => {
      pub.send([Buffer.from("u-no")]);
      pub.send([Buffer.from("t-yes")]);
      return peer.messages.length > 0;
    });
    expect(peer.messages.every((m) => m[0]!.toString() === "t-yes")).toBe(true);
  });
});

describe("ROUTER / DEALER", () => {
  test("libzmq DEALER → our ROUTER: requests carry a routing id and replies are routed back", async () => {
    const router = new RouterSocket();
    cleanups.push(() => router.close());
    const endpoint = await router.bind(`tcp://${LOOPBACK}.1.1:0`);
    router.onMessage((frames) => router.send([frames[0]!, ...frames.slice(1), Buffer.from("pong")]));
    const peer = await ZmqPeer.start("DEALER", "connect", endpoint);
    peer.send([Buffer.alloc(0), big(300, 7)]);
    await waitUntil(() => peer.messages.length > 0);
    expect(hex(peer.messages[0]!)).toEqual(hex([Buffer.alloc(0), big(300, 7), Buffer.from("pong")]));
  });

  test("our DEALER → libzmq ROUTER (echo): multipart with a 64 KiB+ frame round-trips", async () => {
    const peer = await ZmqPeer.start("ROUTER", "bind", `tcp://${LOOPBACK}.1.1:*`);
    peer.command({ echo: true });
    const dealer = new DealerSocket();
    cleanups.push(() => dealer.close());
    const got: Buffer[][] = [];
    dealer.onMessage((f) => got.push(f.map((x) => Buffer.from(x))));
    dealer.connect(peer.endpoint);
    const msg = [Buffer.alloc(0), big(70_000, 11), Buffer.from("tail")];
    dealer.send(msg); // queued until the session is up
    await waitUntil(() => got.length > 0);
    expect(hex(got[0]!)).toEqual(hex(msg));
  });
});

describe("KV events with a vLLM-like libzmq publisher", () => {
  const batch = (i: number): KvEventBatch => ({
    ts: i,
    events: [{ type: "BlockStored", blockHashes: [BigInt(i) * 0x1_0000_0001n], parentBlockHash: null, tokenIds: [i, i + 1], blockSize: 2, loraId: null, medium: "GPU", loraName: null }],
    dataParallelRank: null,
  });
  const payloadHex = (i: number) => Buffer.from(encodeBatch(batch(i))).toString("hex");

  test("our listener fills a lost message from libzmq's replay ROUTER (older reply form without topic)", async () => {
    const peer = await ZmqPeer.script("vllm-publisher.cjs", [`tcp://${LOOPBACK}.1.6:*`, `tcp://${LOOPBACK}.1.6:*`]);
    const replay = String(peer.lines[0]!.replay);
    const l = new KvEventListener({ workerId: "w", dpRank: 0, endpoint: peer.endpoint, replayEndpoint: replay });
    cleanups.push(() => l.close());
    const got: ListenerSignal[] = [];
    l.start();
    l.attach((s) => got.push(s));
    let i = 0;
    await waitUntil(() => {
      peer.command({ payload: payloadHex(i++) });
      return got.length > 0;
    });
    // The loop may have published more after the first batch seen (seq = command index): those arrive
    // first, or the three below could be counted before the replay ran.
    await waitUntil(() => got.at(-1)?.kind === "batch" && (got.at(-1) as { seq: bigint }).seq === BigInt(i - 1));
    const base = got.length;
    peer.command({ payload: payloadHex(i++), drop: true });
    peer.command({ payload: payloadHex(i++), drop: true });
    peer.command({ payload: payloadHex(i++) });
    await waitUntil(() => got.length >= base + 3);
    const seqs = got.map((s) => (s.kind === "batch" ? Number(s.seq) : -1));
    expect(seqs).toEqual(seqs.map((_, k) => seqs[0]! + k));
    expect(l.counters.replays).toBe(1);
    expect(l.counters.replayedBatches).toBe(2);
    const last = got.at(-1) as Extract<ListenerSignal, { kind: "batch" }>;
    expect(last.batch).toEqual(batch(i - 1));
  });

  test("a libzmq DEALER gets our publisher's replay (newer reply form with topic, then the end marker)", async () => {
    const pub = await KvEventPublisher.bind({ endpoint: `tcp://${LOOPBACK}.1.6:0`, replayEndpoint: `tcp://${LOOPBACK}.1.6:0`, topic: "kv@w" });
    cleanups.push(() => pub.close());
    for (let k = 0; k < 4; k++) pub.publish(batch(k));
    const peer = await ZmqPeer.start("DEALER", "connect", pub.replayEndpoint!);
    peer.send([Buffer.alloc(0), encodeSeq(2n)]);
    await waitUntil(() => peer.messages.length >= 3);
    expect(peer.messages.map((m) => m.length)).toEqual([4, 4, 4]);
    expect(peer.messages.map((m) => m[1]!.toString())).toEqual(["kv@w", "kv@w", "kv@w"]);
    expect(peer.messages.map((m) => decodeSeq(m[2]!))).toEqual([2n, 3n, END_SEQ.readBigUInt64BE(0)]);
    expect(decodeBatch(peer.messages[1]![3]!)).toEqual(batch(3));
    expect(peer.messages[2]![3]!.length).toBe(0);
  });
});
