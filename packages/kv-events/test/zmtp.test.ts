// ZMTP behaviours checked with a hand-driven peer: 3.0 subscriptions, PING/PONG, garbage,
// oversize frames, incompatible peers, and the HWM that drops instead of blocking.
import { afterEach, describe, expect, test } from "bun:test";
import { createServer } from "node:net";
import { PubSocket, SubSocket } from "../src/index.ts";
import { MAX_SUBSCRIPTION_BYTES } from "../src/zmtp/pub.ts";
import { encodeCommand, encodeGreeting, encodeMessage, encodeReady, FLAG_COMMAND, parseCommand } from "../src/zmtp/wire.ts";
import { RawPeer } from "./raw-peer.ts";
import { waitUntil } from "./zmq-peer.ts";
import { LOOPBACK } from "@kv-epp/testkit";

const cleanups: (() => Promise<void> | void)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

async function boundPub(opts: ConstructorParameters<typeof PubSocket>[0] = {}): Promise<[PubSocket, string]> {
  const pub = new PubSocket(opts);
  cleanups.push(() => pub.close());
  return [pub, await pub.bind(`tcp://${LOOPBACK}.1.2:0`)];
}

async function rawSub(endpoint: string, minor = 0): Promise<RawPeer> {
  const p = await RawPeer.handshake(endpoint, minor, "SUB");
  cleanups.push(() => p.close());
  return p;
}

describe("ZMTP 3.0 peers", () => {
  test("a 3.0 subscriber's message-form subscribe and cancel drive PUB filtering", async () => {
    const [pub, ep] = await boundPub();
    const raw = await rawSub(ep, 0);
    raw.write(encodeMessage([Buffer.from("\x01ab")]));
    await waitUntil(() => {
      pub.send([Buffer.from("zz")]);
      pub.send([Buffer.from("abc"), Buffer.from("x")]);
      return raw.dataFrames().length >= 2;
    });
    expect(raw.dataFrames().some((f) => f.toString() === "zz")).toBe(false);
    expect(raw.greeting![11]).toBe(1); // we advertise 3.1 but speak 3.0 to a 3.0 peer
    raw.write(encodeMessage([Buffer.from("\x00ab")]));
    await waitUntil(() => pub.send([Buffer.from("abc")]) === 0);
  });

  test("a 3.1 subscriber's SUBSCRIBE and CANCEL commands drive PUB filtering", async () => {
    const [pub, ep] = await boundPub();
    const raw = await rawSub(ep, 1);
    raw.write(encodeCommand("SUBSCRIBE", Buffer.from("k")));
    await waitUntil(() => pub.send([Buffer.from("kv")]) === 1);
    raw.write(encodeCommand("CANCEL", Buffer.from("k")));
    await waitUntil(() => pub.send([Buffer.from("kv")]) === 0);
  });

  test("our SUB sends 3.0 message-form subscriptions to a 3.0 publisher", async () => {
    const frames: Buffer[] = [];
    const server = createServer((s) => {
      s.write(Buffer.concat([encodeGreeting(0, true), encodeReady("PUB")]));
      s.on("data", (d: Buffer) => frames.push(d));
      s.on("error", () => {});
    });
    await new Promise<void>((r) => server.listen(0, `${LOOPBACK}.1.2`, () => r()));
    cleanups.push(() => new Promise<void>((r) => server.close(() => r())));
    const sub = new SubSocket();
    cleanups.push(() => sub.close());
    sub.subscribe("topic");
    sub.connect(`tcp://${LOOPBACK}.1.2:${(server.address() as { port: number }).port}`);
    const want = Buffer.from([0x00, 0x06, 0x01, ...Buffer.from("topic")]);
    await waitUntil(() => Buffer.concat(frames).includes(want));
  });
});

describe("commands and errors", () => {
  test("PING is answered with a PONG carrying the ping context", async () => {
    const [, ep] = await boundPub();
    const raw = await rawSub(ep, 1);
    raw.write(encodeCommand("PING", Buffer.from([0, 10, ...Buffer.from("ctx-42")])));
    const pongs = await waitUntil(() => raw.commands("PONG").length > 0 && raw.commands("PONG"));
    expect(pongs[0]!.toString()).toBe("ctx-42");
  });

  test("a PING whose context is over 16 bytes (RFC 37) closes the connection", async () => {
    const [pub, ep] = await boundPub();
    const raw = await rawSub(ep, 1);
    await waitUntil(() => pub.peerCount === 1);
    raw.write(encodeCommand("PING", Buffer.concat([Buffer.from([0, 10]), Buffer.alloc(17, 1)])));
    await waitUntil(() => raw.closed);
    expect(pub.counters.protocolErrors).toBe(1);
    expect(raw.commands("PONG")).toHaveLength(0);
  });

  test("close() sends what send() queued before it", async () => {
    const [pub, ep] = await boundPub();
    const sub = new SubSocket();
    cleanups.push(() => sub.close());
    const got: string[] = [];
    sub.onMessage((f) => got.push(f[0]!.toString()));
    sub.subscribe("");
    sub.connect(ep);
    await waitUntil(() => pub.subscribedTo() === 1);
    for (let i = 0; i < 5; i++) pub.send([Buffer.from(`m${i}`)]);
    await pub.close();
    await waitUntil(() => got.length === 5);
    expect(got).toEqual(["m0", "m1", "m2", "m3", "m4"]);
  });

  // A listener whose accept queue is full drops SYNs, as a vanished host does; python3 holds one
  // (a Bun server accepts everything, so its queue never fills).
  const python = Bun.which("python3");
  test.skipIf(!python)("a dial that gets no answer is given up after the handshake timeout and redialed", async () => {
    const held = Bun.spawn(
      [python!, "-c", `import socket,sys,time\ns=socket.socket();s.bind(('${LOOPBACK}.1.2',0));s.listen(0);print(s.getsockname()[1],flush=True);time.sleep(60)`],
      { stdout: "pipe" },
    );
    cleanups.push(() => void held.kill());
    const port = Number(new TextDecoder().decode((await held.stdout.getReader().read()).value).trim());
    const { connect } = await import("node:net");
    const fillers = [0, 1, 2].map(() => connect({ host: `${LOOPBACK}.1.2`, port }).on("error", () => {}));
    cleanups.push(() => fillers.forEach((f) => f.destroy()));
    await Bun.sleep(200);
    const sub = new SubSocket({ handshakeTimeoutMs: 300, reconnectMinMs: 50, reconnectMaxMs: 100 });
    cleanups.push(() => sub.close());
    sub.connect(`tcp://${LOOPBACK}.1.2:${port}`);
    await waitUntil(() => sub.counters.reconnects >= 2, 5000);
    expect(sub.counters.connects).toBe(0);
  });

  test("close() ends connections still mid-handshake instead of waiting for them", async () => {
    const pub = new PubSocket();
    const ep = await pub.bind(`tcp://${LOOPBACK}.1.2:0`);
    // A peer that connected but never sent its greeting: the publisher must not wait for it.
    const silent = await RawPeer.open(ep);
    cleanups.push(() => silent.close());
    await pub.close();
    await waitUntil(() => silent.closed);
  });

  test("a garbage greeting closes that connection only; the publisher keeps serving", async () => {
    const [pub, ep] = await boundPub();
    const garbage = await RawPeer.open(ep);
    cleanups.push(() => garbage.close());
    garbage.write(Buffer.from("GET / HTTP/1.1\r\nHost: x\r\n\r\n".padEnd(80, "x")));
    await waitUntil(() => garbage.closed);
    expect(pub.counters.protocolErrors).toBe(1);
    const good = await rawSub(ep, 1);
    good.write(encodeCommand("SUBSCRIBE", Buffer.alloc(0)));
    await waitUntil(() => pub.send([Buffer.from("still-alive")]) === 1);
  });

  test("garbage after a valid handshake (reserved flag bits) closes the connection and is counted", async () => {
    const [pub, ep] = await boundPub();
    const raw = await rawSub(ep, 1);
    await waitUntil(() => pub.peerCount === 1);
    raw.write(Buffer.from([0xf0, 0x01, 0x00]));
    await waitUntil(() => raw.closed);
    expect(pub.counters.protocolErrors).toBe(1);
  });

  test("a frame above maxMessageSize closes the connection and counts as oversize", async () => {
    const [pub, ep] = await boundPub({ maxMessageSize: 1024 });
    const raw = await rawSub(ep, 1);
    await waitUntil(() => pub.peerCount === 1);
    raw.write(encodeMessage([Buffer.alloc(4096, 1)]));
    await waitUntil(() => raw.closed);
    expect(pub.counters.oversize).toBe(1);
  });

  test("a multipart message whose frames each fit but whose sum exceeds maxMessageSize is rejected", async () => {
    const [pub, ep] = await boundPub({ maxMessageSize: 1024 });
    const raw = await rawSub(ep, 1);
    await waitUntil(() => pub.peerCount === 1);
    raw.write(encodeMessage([Buffer.alloc(600, 1), Buffer.alloc(600, 2)]));
    await waitUntil(() => raw.closed);
    expect(pub.counters.oversize).toBe(1);
  });

  test("a message of countless empty frames is bounded by maxMessageSize too", async () => {
    const [pub, ep] = await boundPub({ maxMessageSize: 1024 });
    const raw = await rawSub(ep, 1);
    await waitUntil(() => pub.peerCount === 1);
    raw.write(Buffer.alloc(2 * 4096, Buffer.from([1, 0]))); // 4096 x (MORE, size 0)
    await waitUntil(() => raw.closed);
    expect(pub.counters.oversize).toBe(1);
  });

  test("a data frame larger than a handshake needs, before READY, closes the connection unread", async () => {
    const [pub, ep] = await boundPub();
    const raw = await RawPeer.open(ep);
    cleanups.push(() => raw.close());
    raw.write(encodeGreeting(1, false));
    raw.write(Buffer.from([0x02, 0, 0, 0, 0, 0, 0x10, 0, 0])); // a 1 MiB frame's header (within maxMessageSize), no body
    await waitUntil(() => raw.closed);
    expect(pub.counters.protocolErrors + pub.counters.oversize).toBe(1);
  });

  test("a subscriber past 1024 distinct subscriptions is dropped", async () => {
    const [pub, ep] = await boundPub();
    const raw = await rawSub(ep, 1);
    await waitUntil(() => pub.peerCount === 1);
    for (let i = 0; i <= 1024; i++) raw.write(encodeCommand("SUBSCRIBE", Buffer.from(`t${i}`)));
    await waitUntil(() => raw.closed);
    expect(pub.counters.protocolErrors).toBe(1);
  });

  test("a subscriber whose subscriptions add up past MAX_SUBSCRIPTION_BYTES is dropped; one large subscription is not read", async () => {
    const [pub, ep] = await boundPub();
    const many = await rawSub(ep, 1);
    await waitUntil(() => pub.peerCount === 1);
    const kb = (i: number) => Buffer.concat([Buffer.from(`${i}:`), Buffer.alloc(990, 97)]);
    for (let i = 0; i * 990 <= MAX_SUBSCRIPTION_BYTES; i++) many.write(encodeCommand("SUBSCRIBE", kb(i)));
    await waitUntil(() => many.closed);
    expect(pub.counters.protocolErrors).toBe(1);
    // One subscription as large as everything allowed is a message over the PUB's inbound size.
    const big = await rawSub(ep, 1);
    await waitUntil(() => pub.peerCount === 1);
    big.write(encodeCommand("SUBSCRIBE", Buffer.alloc(MAX_SUBSCRIPTION_BYTES + 64 * 1024, 98)));
    await waitUntil(() => big.closed);
    expect(pub.counters.oversize).toBe(1);
    // Below the bounds, and repeated subscriptions of one prefix (counted, not stored again), stay.
    const fine = await rawSub(ep, 1);
    await waitUntil(() => pub.peerCount === 1);
    // 20 of 60 kB: many times the byte bound, were repeats counted.
    for (let i = 0; i < 20; i++) fine.write(encodeCommand("SUBSCRIBE", Buffer.alloc(60_000, 99)));
    fine.write(encodeCommand("SUBSCRIBE", Buffer.from("kv")));
    await waitUntil(() => pub.send([Buffer.from("kv")]) === 1);
    expect(fine.closed).toBe(false);
  });

  test("a peer announcing an incompatible socket type gets ERROR and is dropped", async () => {
    const [pub, ep] = await boundPub();
    const raw = await RawPeer.handshake(ep, 1, "PUB");
    cleanups.push(() => raw.close());
    await waitUntil(() => raw.closed);
    expect(raw.commands("ERROR").length).toBe(1);
    expect(pub.counters.protocolErrors).toBe(1);
    expect(pub.peerCount).toBe(0);
  });

  test("command frames with MORE set are rejected", async () => {
    const [pub, ep] = await boundPub();
    const raw = await rawSub(ep, 1);
    await waitUntil(() => pub.peerCount === 1);
    const cmd = encodeCommand("PING", Buffer.from([0, 1]));
    cmd[0] = FLAG_COMMAND | 1;
    raw.write(cmd);
    await waitUntil(() => raw.closed);
    expect(pub.counters.protocolErrors).toBe(1);
  });
});

describe("heartbeats", () => {
  const HB = { intervalMs: 40, timeoutMs: 150 };

  /** A 3.1 PUB that completes the handshake, then never sends a byte (a host gone without a FIN). */
  async function silentPub(): Promise<{ endpoint: string; accepted: () => number; pings: () => Buffer[] }> {
    let accepted = 0;
    const pings: Buffer[] = [];
    const server = createServer((s) => {
      accepted++;
      s.write(Buffer.concat([encodeGreeting(1, true), encodeReady("PUB")]));
      s.on("data", (d: Buffer) => {
        // frames after the greeting + READY: pick out the PING commands (short frames, flag 0x04)
        for (let i = d.indexOf(Buffer.from("\x04PING")); i >= 0; i = d.indexOf(Buffer.from("\x04PING"), i + 1)) {
          const cmd = parseCommand(d.subarray(i, i + 7));
          if (cmd?.name === "PING") pings.push(cmd.data);
        }
      });
      s.on("error", () => {});
    });
    await new Promise<void>((r) => server.listen(0, `${LOOPBACK}.1.2`, () => r()));
    cleanups.push(() => new Promise<void>((r) => server.close(() => r())));
    return { endpoint: `tcp://${LOOPBACK}.1.2:${(server.address() as { port: number }).port}`, accepted: () => accepted, pings: () => pings };
  }

  test("a peer that answers nothing is PINGed, then dropped after the timeout, and redialed", async () => {
    const peer = await silentPub();
    const sub = new SubSocket({ heartbeat: HB, reconnectMinMs: 10 });
    cleanups.push(() => sub.close());
    sub.connect(peer.endpoint);
    await waitUntil(() => sub.counters.heartbeatTimeouts >= 1 && peer.accepted() >= 2, 5000);
    expect(peer.pings().length).toBeGreaterThan(0);
    expect(peer.pings()[0]!.readUInt16BE(0)).toBe(2); // TTL in deciseconds: the 150 ms timeout
    expect(sub.counters.disconnects).toBeGreaterThanOrEqual(1);
  });

  test("the PING's TTL is capped at 65.5 s (libzmq keeps it as u16 milliseconds)", async () => {
    const peer = await silentPub();
    const sub = new SubSocket({ heartbeat: { intervalMs: 40, timeoutMs: 100_000 } });
    cleanups.push(() => sub.close());
    sub.connect(peer.endpoint);
    await waitUntil(() => peer.pings().length > 0, 5000);
    expect(peer.pings()[0]!.readUInt16BE(0)).toBe(655);
  });

  test("an idle publisher that answers PING (ours, as libzmq does) stays connected", async () => {
    const [pub, ep] = await boundPub();
    const sub = new SubSocket({ heartbeat: HB });
    cleanups.push(() => sub.close());
    sub.subscribe("");
    sub.connect(ep);
    await waitUntil(() => pub.peerCount === 1 && sub.peerCount === 1);
    await Bun.sleep(HB.timeoutMs * 4);
    expect(sub.counters.heartbeatTimeouts).toBe(0);
    expect(sub.counters.disconnects).toBe(0);
  });

  test("this process stalling past the timeout does not drop a peer whose answers wait unread", async () => {
    const [pub, ep] = await boundPub();
    const sub = new SubSocket({ heartbeat: HB });
    cleanups.push(() => sub.close());
    const got: string[] = [];
    sub.onMessage((f) => got.push(f[0]!.toString()));
    sub.subscribe("");
    sub.connect(ep);
    await waitUntil(() => pub.subscribedTo() === 1 && sub.peerCount === 1);
    // The whole thread blocked (CPU starved, a long task), several times: PINGs and PONGs wait in the sockets.
    for (let i = 0; i < 5; i++) {
      Bun.sleepSync(HB.timeoutMs * 2);
      pub.send([Buffer.from(`after stall ${i}`)]);
      await waitUntil(() => got.length === i + 1);
    }
    expect(sub.counters.heartbeatTimeouts).toBe(0);
    expect(sub.counters.disconnects).toBe(0);
  });

  test("without heartbeat options nothing is sent and a silent peer is kept", async () => {
    const peer = await silentPub();
    const sub = new SubSocket();
    cleanups.push(() => sub.close());
    sub.connect(peer.endpoint);
    await waitUntil(() => sub.peerCount === 1);
    await Bun.sleep(HB.timeoutMs * 2);
    expect(peer.pings()).toEqual([]);
    expect(sub.peerCount).toBe(1);
  });

  test("a SUB whose reading is paused (back-pressure) does not time its publisher out", async () => {
    const peer = await silentPub();
    const sub = new SubSocket({ heartbeat: HB });
    cleanups.push(() => sub.close());
    sub.connect(peer.endpoint);
    await waitUntil(() => sub.peerCount === 1);
    sub.pause();
    await Bun.sleep(HB.timeoutMs * 3);
    expect(sub.counters.heartbeatTimeouts).toBe(0);
    sub.resume();
    await waitUntil(() => sub.counters.heartbeatTimeouts >= 1, 5000);
  });
});

describe("high-water mark", () => {
  test("a subscriber that stops reading loses messages at its HWM; send() never blocks and others still get through", async () => {
    const [pub, ep] = await boundPub({ hwm: 8 });
    const slow = await rawSub(ep, 1);
    slow.write(encodeCommand("SUBSCRIBE", Buffer.alloc(0)));
    slow.sock.pause(); // never reads again: kernel buffers fill, then the HWM drops
    await waitUntil(() => pub.send([Buffer.from("probe")]) === 1);
    const payload = Buffer.alloc(64 * 1024, 7);
    for (let i = 0; i < 400; i++) pub.send([Buffer.from("bulk"), payload]);
    await waitUntil(() => {
      pub.send([Buffer.from("bulk"), payload]);
      return pub.counters.dropped > 0;
    });
    const sub = new SubSocket();
    cleanups.push(() => sub.close());
    const got: string[] = [];
    sub.onMessage((f) => got.push(f[0]!.toString()));
    sub.subscribe("fresh");
    sub.connect(ep);
    await waitUntil(() => {
      pub.send([Buffer.from("fresh")]);
      return got.length > 0;
    });
  });
});

describe("async iteration", () => {
  test("messages() yields in order, pauses reading at its high-water mark, and ends on close", async () => {
    const [pub, ep] = await boundPub();
    const sub = new SubSocket();
    sub.subscribe("");
    sub.connect(ep);
    const it = sub.messages({ highWaterMark: 4 });
    await waitUntil(() => pub.send([Buffer.from("probe")]) === 1);
    for (let i = 0; i < 50; i++) pub.send([Buffer.from(`m${i}`)]);
    const seen: string[] = [];
    for await (const m of it) {
      const t = m[0]!.toString();
      if (t !== "probe") seen.push(t);
      if (seen.length === 50) break;
      if (seen.length === 1) {
        await waitUntil(() => sub.isPaused); // a slow consumer: the queue fills and reading pauses
      }
    }
    expect(seen).toEqual(Array.from({ length: 50 }, (_, i) => `m${i}`));
    expect(sub.isPaused).toBe(false);
    const rest = sub.messages();
    const ended = (async () => {
      for await (const _ of rest) {
        // drained until close
      }
      return true;
    })();
    await sub.close();
    expect(await ended).toBe(true);
  });
});
