// Hostile and broken peers of a running EPP, each a loop that keeps attacking one of its ports until
// stopped: used by test/hostile.test.ts (one round each, then the EPP must still answer) and by
// bench/hostile.bench.ts (each one beside a steady load of good requests). They speak the real
// protocols (HTTP/2 + gRPC framing, HTTP/1.1, ZMTP) and send what a broken or malicious peer would.
import { readFileSync } from "node:fs";
import { connect } from "node:net";
import http2 from "node:http2";
import { PubSocket } from "@kv-epp/kv-events";
import type { ProcessingRequest } from "../src/extproc/messages.ts";
import { loadProtos } from "../src/extproc/protos.ts";
import { headers, rawExtProcSession } from "./helpers.ts";

/** Where the EPP under attack listens. */
export type Target = {
  host: string;
  grpc: number;
  grpcHealth: number;
  metrics: number;
  selection: number;
  replicaAgg: number;
  /** A worker's KV event endpoint (tcp://host:port) that the attack may bind and publish garbage on. */
  kvEvents?: string;
  /** ext_proc over TLS (the default) or h2c. */
  tls?: boolean;
};

export type Attack = {
  name: string;
  /** Starts attacking; `stop()` ends it and resolves with how many attack messages went out. */
  start(t: Target): { stop(): Promise<number> };
};

const method = () => loadProtos().extProc.service.Process!;
const enc = new TextEncoder();
/** 50k levels: as deep as the bodies that held the event loop for seconds before the depth limit. */
const DEEP = 50_000;
const deepArray = "[".repeat(DEEP) + "]".repeat(DEEP);
const deepObject = '{"a":'.repeat(DEEP) + "1" + "}".repeat(DEEP);
export const DEEP_BODIES = [
  `{"prompt":${deepArray}}`,
  `{"token_ids":${deepArray}}`,
  `{"messages":[{"role":"user","content":[${deepObject}]}]}`,
  `{"messages":[{"role":"user","content":"hi"}],"tools":[${deepObject}]}`,
];

/**
 * A request_headers of `n` empty HeaderValues (2 bytes each): decoded, millions of objects per few MiB, seconds
 * of the event loop and hundreds of MB each time.
 */
function tinyHeaders(n: number): Buffer {
  const lengthDelimited = (field: number, bytes: Buffer) => {
    const head = [(field << 3) | 2];
    for (let v = bytes.length; ; v = Math.floor(v / 128)) {
      if (v < 128) {
        head.push(v);
        break;
      }
      head.push((v & 127) | 128);
    }
    return Buffer.concat([Buffer.from(head), bytes]);
  };
  const entries = Buffer.alloc(2 * n);
  for (let i = 0; i < n; i++) entries[2 * i] = 0x0a; // HeaderMap.headers, length 0
  return lengthDelimited(2, lengthDelimited(1, entries)); // ProcessingRequest.request_headers -> HttpHeaders.headers
}
let manyHeaders: Buffer | undefined;

export function grpcFrame(m: Uint8Array): Buffer {
  const out = Buffer.alloc(5 + m.length);
  out.writeUInt32BE(m.length, 1);
  out.set(m, 5);
  return out;
}

/** One gRPC call on `session`: `frames` sent, then half-closed; resolves with grpc-status when it ends. */
export function grpcCall(session: http2.ClientHttp2Session, path: string, frames: Buffer[]): Promise<string | undefined> {
  return new Promise((resolve) => {
    let status: string | undefined;
    let req: http2.ClientHttp2Stream;
    try {
      req = session.request({ ":method": "POST", ":path": path, "content-type": "application/grpc", te: "trailers" });
    } catch {
      return resolve(undefined);
    }
    req.on("response", (h) => (status ??= h["grpc-status"] as string | undefined));
    req.on("trailers", (t) => (status = t["grpc-status"] as string));
    req.on("data", () => {});
    req.on("error", () => {});
    req.on("close", () => resolve(status));
    for (const f of frames.slice(0, -1)) req.write(f);
    req.end(frames.at(-1));
  });
}

/**
 * Runs `once` back to back until stopped (a failed round, e.g. the EPP gone, waits 50 ms and goes on);
 * `workers` loops at once.
 */
function loop(once: (i: number) => Promise<unknown>, workers = 1): { stop(): Promise<number> } {
  let running = true;
  let n = 0;
  const one = async () => {
    while (running) {
      try {
        await once(n++);
      } catch {
        await Bun.sleep(50);
      }
    }
  };
  const all = Promise.all(Array.from({ length: workers }, one));
  return {
    stop: async () => {
      running = false;
      await all;
      return n;
    },
  };
}

/** ext_proc as gateways open it (TLS); health in plaintext, as kubelet probes it. */
const extProcSession = (t: Target) => (t.tls === false ? http2.connect(`http://${t.host}:${t.grpc}`) : rawExtProcSession(t.grpc, t.host));
const healthSession = (t: Target) => http2.connect(`http://${t.host}:${t.grpcHealth}`);

/** gRPC calls on one HTTP/2 connection, reopened when it breaks. */
function grpcLoop(open: (t: Target) => http2.ClientHttp2Session, path: () => string, frames: (i: number) => Buffer[]): Attack["start"] {
  return (t) => {
    let session: http2.ClientHttp2Session | undefined;
    const l = loop(async (i) => {
      if (!session || session.destroyed || session.closed) {
        session = open(t);
        session.on("error", () => {});
      }
      if ((await grpcCall(session, path(), frames(i))) === undefined) {
        session.destroy();
        throw new Error("call failed");
      }
    });
    return {
      stop: async () => {
        const n = await l.stop();
        session?.destroy();
        return n;
      },
    };
  };
}

const serialize = (m: ProcessingRequest) => Buffer.from(method().requestSerialize(m));

export const ATTACKS: Attack[] = [
  {
    // A valid empty ProcessingRequest as the stream's last bytes: it used to end the process.
    name: "empty ProcessingRequest",
    start: grpcLoop(extProcSession, () => method().path, () => [Buffer.alloc(5)]),
  },
  {
    name: "garbage and truncated protobuf",
    start: grpcLoop(
      extProcSession,
      () => method().path,
      (i) => {
        const good = serialize(headers());
        return [grpcFrame(i % 2 ? good.subarray(0, 1 + (i % (good.length - 1))) : crypto.getRandomValues(new Uint8Array(1 + (i % 64))))];
      },
    ),
  },
  {
    // 4 MiB, within the 40 MiB a body may take, of 2 million headers.
    name: "headers of millions of tiny entries",
    start: grpcLoop(extProcSession, () => method().path, () => [(manyHeaders ??= grpcFrame(tinyHeaders(2 << 20)))]),
  },
  {
    name: "deep JSON on ext_proc",
    start: grpcLoop(
      extProcSession,
      () => method().path,
      (i) => [grpcFrame(serialize(headers())), grpcFrame(serialize({ request_body: { body: enc.encode(DEEP_BODIES[i % DEEP_BODIES.length]!), end_of_stream: true } }))],
    ),
  },
  {
    name: "deep JSON on /score and /select",
    start: (t) =>
      loop(async (i) => {
        const res = await fetch(`http://${t.host}:${t.selection}/${i % 2 ? "select" : "score"}`, { method: "POST", body: DEEP_BODIES[i % 2] });
        await res.arrayBuffer();
      }),
  },
  {
    name: "two clients scraping /metrics",
    start: (t) => loop(async () => void (await (await fetch(`http://${t.host}:${t.metrics}/metrics`)).arrayBuffer()), 2),
  },
  {
    name: "empty and garbage health checks",
    start: grpcLoop(
      healthSession,
      () => "/grpc.health.v1.Health/Check",
      (i) => [i % 2 ? Buffer.alloc(5) : grpcFrame(crypto.getRandomValues(new Uint8Array(1 + (i % 32))))],
    ),
  },
  {
    // 1024 SUBSCRIBE commands of 400 KB each per connection (419 MB) was +854 MB of RSS.
    name: "SUBSCRIBE flood on replica-agg",
    start: (t) => loop(() => subscribeFlood(t.host, t.replicaAgg, 1024, 400 * 1024)),
  },
  {
    name: "malformed KV messages",
    start: (t) => {
      if (!t.kvEvents) throw new Error("malformed KV messages need the target's kvEvents endpoint");
      const pub = new PubSocket();
      const bound = pub.bind(t.kvEvents);
      const l = loop(async (i) => {
        await bound;
        // The EPP's listener (re)dials with backoff: nothing is sent before it is connected.
        if (pub.subscriberCount === 0) return Bun.sleep(20);
        // Not [topic, seq(8), payload]; then a good frame layout with a payload that is not msgpack.
        const seq = Buffer.alloc(8);
        seq.writeBigUInt64BE(BigInt(i));
        pub.send(i % 2 ? [Buffer.from(""), Buffer.from("bad")] : [Buffer.from(""), seq, crypto.getRandomValues(new Uint8Array(32))]);
        // ~1000 messages/s: a broken publisher, not a flood (any consumer is saturated by one).
        await Bun.sleep(1);
      });
      return {
        stop: async () => {
          const n = await l.stop();
          await pub.close();
          return n;
        },
      };
    },
  },
];

/**
 * A ZMTP 3.1 SUB that sends `count` SUBSCRIBE commands of `bytes` each, then waits for the
 * connection to end (the EPP drops it) or 2 s. Written byte by byte (RFC 23/37): a hostile peer does
 * not go through a well-behaved socket.
 */
export async function subscribeFlood(host: string, port: number, count: number, bytes: number): Promise<void> {
  const sock = connect({ host, port });
  sock.on("error", () => {});
  await new Promise<void>((resolve, reject) => {
    sock.once("connect", () => resolve());
    sock.once("error", reject);
  });
  const closed = new Promise<void>((r) => sock.once("close", () => r()));
  const greeting = Buffer.alloc(64);
  greeting[0] = 0xff;
  greeting[9] = 0x7f;
  greeting[10] = 3;
  greeting[11] = 1;
  greeting.write("NULL", 12, "latin1");
  const command = (name: string, data: Buffer) => {
    const body = Buffer.concat([Buffer.from([name.length]), Buffer.from(name, "latin1"), data]);
    const head = Buffer.alloc(9);
    head[0] = 0x04 | 0x02; // COMMAND | LONG
    head.writeBigUInt64BE(BigInt(body.length), 1);
    return Buffer.concat([head, body]);
  };
  const prop = Buffer.concat([Buffer.from([11]), Buffer.from("Socket-Type"), Buffer.from([0, 0, 0, 3]), Buffer.from("SUB")]);
  sock.write(greeting);
  sock.write(command("READY", prop));
  const prefix = Buffer.alloc(bytes, 0x61);
  for (let i = 0; i < count && !sock.destroyed; i++) {
    prefix.writeUInt32BE(i, 0); // distinct prefixes
    if (!sock.write(command("SUBSCRIBE", prefix))) await Promise.race([new Promise((r) => sock.once("drain", r)), closed]);
  }
  await Promise.race([closed, Bun.sleep(2000)]);
  sock.destroy();
}

/** Resident set size of a process, and its peak, in MiB (from /proc). */
export function rssMiB(pid: number): { rss: number; peak: number } {
  const status = readFileSync(`/proc/${pid}/status`, "utf8");
  const kb = (key: string) => Number(new RegExp(`^${key}:\\s+(\\d+)`, "m").exec(status)?.[1] ?? NaN);
  return { rss: kb("VmRSS") / 1024, peak: kb("VmHWM") / 1024 };
}
