// The bidi gRPC server on node:http2, driven by @grpc/grpc-js clients (and raw HTTP/2 where a gRPC
// client cannot produce the input): messages both ways, status trailers, refusals, cancellation and
// graceful shutdown.
import { afterEach, describe, expect, test } from "bun:test";
import * as grpc from "@grpc/grpc-js";
import fc from "fast-check";
import http2 from "node:http2";
import net from "node:net";
import { BodyBudget } from "./body-budget.ts";
import { createBidiServer, GrpcStatus, type BidiCall, type BidiServer } from "./grpc-h2.ts";
import { LOOPBACK, waitFor } from "@kv-epp/testkit";

const HOST = `${LOOPBACK}.4.90`;
const PATH = "/test.Echo/Chat";

// Messages are UTF-8 strings; "bad" fails to parse. The answer to "big:N" is N bytes in three parts.
const method = {
  path: PATH,
  deserialize: (b: Buffer) => {
    const s = b.toString();
    if (s === "bad") throw new Error("not a message");
    return s;
  },
  serialize: (s: string) => {
    const big = /^big:(\d+)$/.exec(s);
    if (!big) return Buffer.from(s);
    const n = Number(big[1]);
    return [Buffer.alloc(1, 97), Buffer.alloc(n - 2, 98), Buffer.alloc(1, 99)];
  },
};

let server: BidiServer | undefined;
const calls: string[] = [];

async function start(
  handler: (call: BidiCall<string, string>) => void,
  maxMessageBytes = 1 << 20,
  onRejected?: (reason: string) => void,
): Promise<number> {
  server = createBidiServer(method, handler, { maxMessageBytes, windowBytes: 1 << 20, onRejected });
  return server.listen(HOST, 0);
}

afterEach(async () => {
  await server?.shutdown(0);
  server = undefined;
  calls.length = 0;
});

/** Echoes every message upper-cased; ends when the client does. */
const echo = (call: BidiCall<string, string>) => {
  call.on("data", (m) => call.write(m.startsWith("big:") ? m : m.toUpperCase()));
  call.on("end", () => {
    calls.push("end");
    call.end();
  });
  call.on("cancelled", () => calls.push("cancelled"));
};

function client(port: number) {
  const c = new grpc.Client(`${HOST}:${port}`, grpc.credentials.createInsecure());
  const open = (path = PATH) =>
    c.makeBidiStreamRequest(
      path,
      (s: string) => Buffer.from(s),
      (b: Buffer) => b.toString(),
    );
  return { c, open };
}

/** Messages until the call ends, and its status. */
function collect(stream: grpc.ClientDuplexStream<string, string>): Promise<{ messages: string[]; status: grpc.StatusObject }> {
  const messages: string[] = [];
  stream.on("data", (m: string) => messages.push(m));
  stream.on("error", () => {});
  return new Promise((resolve) => stream.on("status", (status: grpc.StatusObject) => resolve({ messages, status })));
}

/** A gRPC call on a raw HTTP/2 session, for input a gRPC client would not send. */
function rawCall(session: http2.ClientHttp2Session): http2.ClientHttp2Stream {
  const r = session.request({ ":method": "POST", ":path": PATH, "content-type": "application/grpc", te: "trailers" });
  r.on("error", () => {});
  return r;
}

/** A message's frame header: uncompressed, `n` bytes. */
function head(n: number): Buffer {
  const h = Buffer.alloc(5);
  h.writeUInt32BE(n, 1);
  return h;
}

/** HTTP/2 spoken frame by frame (RFC 9113), for what no client library sends: a message one byte per DATA frame. */
const h2 = {
  preface: Buffer.from("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"),
  DATA: 0,
  HEADERS: 1,
  SETTINGS: 4,
  END_STREAM: 1,
  END_HEADERS: 4,
  frame(type: number, flags: number, stream: number, payload: Uint8Array = Buffer.alloc(0)): Buffer {
    const h = Buffer.alloc(9);
    h.writeUIntBE(payload.length, 0, 3);
    h[3] = type;
    h[4] = flags;
    h.writeUInt32BE(stream, 5);
    return Buffer.concat([h, payload]);
  },
  /** A gRPC call's request headers, each an HPACK literal without indexing (RFC 7541 6.2.2), no Huffman coding. */
  requestHeaders(path: string): Buffer {
    const fields = [[":method", "POST"], [":scheme", "http"], [":path", path], [":authority", "epp"], ["content-type", "application/grpc"], ["te", "trailers"]];
    return Buffer.concat(fields.map(([k, v]) => Buffer.concat([Buffer.from([0, k!.length]), Buffer.from(k!), Buffer.from([v!.length]), Buffer.from(v!)])));
  },
};

/** The grpc-status of a raw call's trailers. */
const grpcStatus = (r: http2.ClientHttp2Stream) => new Promise<string | undefined>((resolve) => r.on("trailers", (t) => resolve(String(t["grpc-status"]))));
const trailersOf = (r: http2.ClientHttp2Stream) =>
  new Promise<{ status: string; message: string }>((resolve) => r.on("trailers", (t) => resolve({ status: String(t["grpc-status"]), message: decodeURIComponent(String(t["grpc-message"])) })));

/** The answers of a new call on the same client that sends "still" and ends. */
async function answersAfter(open: () => grpc.ClientDuplexStream<string, string>): Promise<string[]> {
  const again = open();
  const next = collect(again);
  again.write("still");
  again.end();
  return (await next).messages;
}

describe("createBidiServer", () => {
  test("messages go both ways in order and the call ends with OK", async () => {
    const port = await start(echo);
    const { c, open } = client(port);
    const s = open();
    const done = collect(s);
    for (const m of ["one", "two", "three"]) s.write(m);
    s.end();
    const { messages, status } = await done;
    expect(messages).toEqual(["ONE", "TWO", "THREE"]);
    expect(status.code).toBe(grpc.status.OK);
    expect(calls).toEqual(["end"]);
    c.close();
  });

  test("large messages cross chunk boundaries both ways; a multi-part answer arrives whole", async () => {
    const port = await start(echo);
    const { c, open } = client(port);
    const s = open();
    const done = collect(s);
    const big = "x".repeat(300_000); // many DATA frames
    s.write(big);
    s.write("big:200000");
    s.end();
    const { messages, status } = await done;
    expect(status.code).toBe(grpc.status.OK);
    expect(messages[0]).toBe(big.toUpperCase());
    expect(messages[1]!.length).toBe(200_000);
    expect(messages[1]![0]).toBe("a");
    expect(messages[1]!.at(-1)).toBe("c");
    c.close();
  });

  test("a message that arrives in one chunk is delivered as a view of it, a large one joined from several in shared memory", async () => {
    const shared = { ...method, deserialize: (b: Buffer) => `${b.buffer instanceof SharedArrayBuffer ? "shared" : "view"}:${b.length}` };
    server = createBidiServer(shared, echo, { maxMessageBytes: 1 << 20, windowBytes: 1 << 20 });
    const { c, open } = client(await server.listen(HOST, 0));
    const s = open();
    const done = collect(s);
    s.write("small");
    s.write("x".repeat(300_000)); // many DATA frames
    s.end();
    expect((await done).messages).toEqual(["VIEW:5", "SHARED:300000"]);
    c.close();
  });

  test("an unknown method is UNIMPLEMENTED", async () => {
    const port = await start(echo);
    const { c, open } = client(port);
    const { status } = await (async () => {
      const s = open("/test.Echo/Other");
      const r = collect(s);
      s.end();
      return r;
    })();
    expect(status.code).toBe(grpc.status.UNIMPLEMENTED);
    c.close();
  });

  test("a message that does not parse ends the call with INTERNAL; the server keeps serving", async () => {
    const port = await start(echo);
    const { c, open } = client(port);
    const s = open();
    const done = collect(s);
    s.write("ok");
    s.write("bad");
    const { messages, status } = await done;
    expect(messages).toEqual(["OK"]);
    expect(status.code).toBe(grpc.status.INTERNAL);
    expect(status.details).toContain("could not parse");
    // The handler is told the call is over (the EPP releases the request's load on it).
    expect(calls).toEqual(["cancelled"]);
    expect(await answersAfter(open)).toEqual(["STILL"]);
    c.close();
  });

  test("an empty message (the bare frame 00 00 00 00 00) is delivered, also as the last bytes of a stream", async () => {
    const got: string[] = [];
    const port = await start((call) => {
      call.on("data", (m) => {
        got.push(m);
        call.write(`len:${m.length}`);
      });
      call.on("end", () => call.end());
    });
    const session = http2.connect(`http://${HOST}:${port}`);
    const exchange = (...writes: Buffer[]) =>
      new Promise<{ status: string | undefined; data: string }>((resolve) => {
        const req = session.request({ ":method": "POST", ":path": PATH, "content-type": "application/grpc", te: "trailers" });
        let status: string | undefined;
        let data = "";
        req.on("trailers", (t) => (status = t["grpc-status"] as string));
        req.on("data", (d: Buffer) => (data += d.subarray(5).toString()));
        req.on("close", () => resolve({ status, data }));
        for (const w of writes.slice(0, -1)) req.write(w);
        req.end(writes.at(-1));
      });
    const empty = Buffer.from([0, 0, 0, 0, 0]);
    // Alone, after another message in the same write, and split from the stream's end.
    expect(await exchange(empty)).toEqual({ status: "0", data: "len:0" });
    expect(await exchange(Buffer.from([0, 0, 0, 0, 2, 104, 105, 0, 0, 0, 0, 0]))).toEqual({ status: "0", data: "len:2len:0" });
    expect(await exchange(empty, empty, Buffer.alloc(0))).toEqual({ status: "0", data: "len:0len:0" });
    expect(got).toEqual(["", "hi", "", "", ""]);
    // A frame header whose message never comes is a framing error, not a silent end.
    expect((await exchange(Buffer.from([0, 0, 0, 0, 9]))).status).toBe(String(GrpcStatus.INTERNAL));
    session.destroy();
  });

  test("a handler that throws on a message ends that call with INTERNAL, reported; other calls go on", async () => {
    const rejected: string[] = [];
    const port = await start(
      (call) => {
        call.on("data", (m) => {
          if (m === "boom") throw new Error("handler bug");
          call.write(m.toUpperCase());
        });
        call.on("end", () => call.end());
        call.on("cancelled", () => calls.push("cancelled"));
      },
      1 << 20,
      (reason) => rejected.push(reason),
    );
    const { c, open } = client(port);
    const s = open();
    const done = collect(s);
    s.write("a");
    s.write("boom");
    const { messages, status } = await done;
    expect(messages).toEqual(["A"]);
    expect(status.code).toBe(grpc.status.INTERNAL);
    expect(calls).toEqual(["cancelled"]);
    const bad = open();
    const badDone = collect(bad);
    bad.write("bad");
    expect((await badDone).status.code).toBe(grpc.status.INTERNAL);
    expect(rejected).toEqual(["handler", "unparsable"]);
    expect(await answersAfter(open)).toEqual(["STILL"]);
    c.close();
  });

  test("fail() ends the call with the handler's status; the handler is told it is over", async () => {
    const port = await start((call) => {
      call.on("data", (m) => (m === "nope" ? call.fail(GrpcStatus.INVALID_ARGUMENT, "not for this state") : call.write(m)));
      call.on("end", () => call.end());
      call.on("cancelled", () => calls.push("cancelled"));
    });
    const { c, open } = client(port);
    const s = open();
    const done = collect(s);
    s.write("ok");
    s.write("nope");
    const { messages, status } = await done;
    expect(messages).toEqual(["ok"]);
    expect(status.code).toBe(grpc.status.INVALID_ARGUMENT);
    expect(status.details).toBe("not for this state");
    expect(calls).toEqual(["cancelled"]);
    c.close();
  });

  test("framing, fuzzed: any messages (empty ones too) split anywhere arrive whole and in order; a cut-off stream fails", async () => {
    const port = await start(echo);
    const session = http2.connect(`http://${HOST}:${port}`);
    const msg = fc.oneof(fc.constant(""), fc.string({ maxLength: 40 }), fc.constant("x".repeat(70_000))).filter((m) => m !== "bad");
    await fc.assert(
      fc.asyncProperty(fc.array(msg, { maxLength: 6 }), fc.array(fc.nat(), { maxLength: 6 }), fc.option(fc.nat(), { nil: undefined }), async (msgs, cuts, truncate) => {
        const frames = Buffer.concat(
          msgs.map((m) => {
            const b = Buffer.from(m);
            const f = Buffer.alloc(5 + b.length);
            f.writeUInt32BE(b.length, 1);
            b.copy(f, 5);
            return f;
          }),
        );
        // Truncated: the bytes stop inside a frame (never at a frame boundary, which is a whole stream).
        let sent = frames;
        if (truncate !== undefined && frames.length > 0) {
          const bounds = new Set<number>();
          for (let off = 0, i = 0; i < msgs.length; off += 5 + Buffer.byteLength(msgs[i]!), i++) bounds.add(off);
          const inside = [...Array(frames.length).keys()].filter((k) => !bounds.has(k));
          if (inside.length > 0) sent = frames.subarray(0, inside[truncate % inside.length]!);
        }
        const at = [...new Set(cuts.map((c) => c % (sent.length + 1)))].sort((x, y) => x - y);
        const { status, data } = await new Promise<{ status: string | undefined; data: Buffer }>((resolve) => {
          const req = session.request({ ":method": "POST", ":path": PATH, "content-type": "application/grpc", te: "trailers" });
          const got: Buffer[] = [];
          let status: string | undefined;
          req.on("trailers", (t) => (status = t["grpc-status"] as string));
          req.on("data", (d: Buffer) => got.push(d));
          req.on("error", () => {});
          req.on("close", () => resolve({ status, data: Buffer.concat(got) }));
          let prev = 0;
          for (const c of at) {
            req.write(sent.subarray(prev, c));
            prev = c;
          }
          req.end(sent.subarray(prev));
        });
        const answers: string[] = [];
        for (let off = 0; off < data.length; ) {
          const len = data.readUInt32BE(off + 1);
          answers.push(data.subarray(off + 5, off + 5 + len).toString());
          off += 5 + len;
        }
        if (sent === frames) {
          expect(status).toBe("0");
          expect(answers).toEqual(msgs.map((m) => m.toUpperCase()));
        } else {
          expect(status).toBe(String(GrpcStatus.INTERNAL));
          expect(msgs.map((m) => m.toUpperCase()).slice(0, answers.length)).toEqual(answers);
        }
      }),
      { numRuns: 100 },
    );
    session.destroy();
  }, 30_000);

  test("a message over the size limit is RESOURCE_EXHAUSTED", async () => {
    const port = await start(echo, 1000);
    const { c, open } = client(port);
    const s = open();
    const done = collect(s);
    s.write("y".repeat(1001));
    const { status } = await done;
    expect(status.code).toBe(grpc.status.RESOURCE_EXHAUSTED);
    expect(calls).toEqual(["cancelled"]);
    c.close();
  });

  test("a compressed message or an unknown grpc-encoding is refused", async () => {
    const port = await start(echo);
    const session = http2.connect(`http://${HOST}:${port}`);
    const trailersOf = (headers: http2.OutgoingHttpHeaders, body: Buffer) =>
      new Promise<string | undefined>((resolve) => {
        const req = session.request({ ":method": "POST", ":path": PATH, "content-type": "application/grpc", te: "trailers", ...headers });
        let status: string | undefined;
        req.on("response", (h) => (status ??= h["grpc-status"] as string | undefined));
        req.on("trailers", (t) => (status = t["grpc-status"] as string));
        req.on("data", () => {});
        req.on("close", () => resolve(status));
        req.end(body);
      });
    const compressed = Buffer.from([1, 0, 0, 0, 2, 104, 105]);
    expect(await trailersOf({}, compressed)).toBe(String(GrpcStatus.INTERNAL));
    expect(await trailersOf({ "grpc-encoding": "gzip" }, compressed)).toBe(String(GrpcStatus.UNIMPLEMENTED));
    // A stream that ends inside a message fails instead of dropping the message silently.
    expect(await trailersOf({}, Buffer.from([0, 0, 0, 0, 9, 104, 105]))).toBe(String(GrpcStatus.INTERNAL));
    // Not gRPC: a GET, or another content type.
    const statusOf = (headers: http2.OutgoingHttpHeaders) =>
      new Promise<number>((resolve) => {
        const req = session.request({ ":path": PATH, ...headers });
        req.on("response", (h) => resolve(h[":status"] as number));
        req.on("error", () => {});
        req.end();
      });
    expect(await statusOf({ ":method": "GET", "content-type": "application/grpc" })).toBe(405);
    expect(await statusOf({ ":method": "POST", "content-type": "application/grpc-web" })).toBe(415);
    expect(await statusOf({ ":method": "POST", "content-type": "application/json" })).toBe(415);
    // A frame header split across two writes is still read as one message.
    const split = await new Promise<string>((resolve) => {
      const req = session.request({ ":method": "POST", ":path": PATH, "content-type": "application/grpc", te: "trailers" });
      let got = "";
      req.on("data", (d: Buffer) => (got += d.subarray(5).toString()));
      req.on("close", () => resolve(got));
      req.write(Buffer.from([0, 0, 0]));
      setTimeout(() => req.end(Buffer.from([0, 2, 104, 105])), 20);
    });
    expect(split).toBe("HI");
    session.destroy();
  });

  test("a client that resets the stream or drops the connection mid-call ends the call once", async () => {
    const port = await start(echo);
    for (const leave of ["reset", "drop"] as const) {
      calls.length = 0;
      const session = http2.connect(`http://${HOST}:${port}`);
      const req = session.request({ ":method": "POST", ":path": PATH, "content-type": "application/grpc", te: "trailers" });
      req.on("error", () => {});
      req.write(Buffer.from([0, 0, 0, 0, 2, 104, 105]));
      await new Promise((r) => req.once("data", r));
      if (leave === "reset") req.close(http2.constants.NGHTTP2_CANCEL);
      else session.destroy();
      const deadline = Date.now() + 3000;
      while (calls.length === 0 && Date.now() < deadline) await Bun.sleep(10);
      await Bun.sleep(50);
      // Bun's node:http2 reports a reset as a half-close ("end"); either ends the request.
      expect(calls).toHaveLength(1);
      expect(["end", "cancelled"]).toContain(calls[0]!);
      session.destroy();
    }
  });

  test("a client that does not read its answers stops being read until it does (no unbounded buffering)", async () => {
    let handled = 0;
    const port = await start((call) => {
      call.on("data", (m) => {
        handled++;
        call.write(m);
      });
      call.on("end", () => call.end());
    }, 4 << 20);
    const session = http2.connect(`http://${HOST}:${port}`, { settings: { initialWindowSize: 65_535 } });
    const req = session.request({ ":method": "POST", ":path": PATH, "content-type": "application/grpc", te: "trailers" });
    req.pause(); // the answers are not read: the client's receive window closes
    const mib = Buffer.alloc(1 << 20, 120);
    const frame = Buffer.alloc(5);
    frame.writeUInt32BE(mib.length, 1);
    const total = 40;
    for (let i = 0; i < total; i++) {
      req.write(frame);
      req.write(mib);
    }
    req.end();
    // Reading stops once more than 8 MiB of answers wait: the server has handled 8 messages by then.
    await waitFor(() => handled >= 8, { timeoutMs: 30_000, message: "8 MiB of answers waiting" });
    // Then the client's sending stalls: its queue stops shrinking over consecutive looks (a server
    // that kept reading would drain it and handle all 40).
    let queued = -1;
    await waitFor(
      () => {
        const now = session.state.outboundQueueSize ?? 0;
        const still = now === queued;
        queued = now;
        return still;
      },
      { timeoutMs: 30_000, intervalMs: 100, message: "the client's sending stalled" },
    );
    expect(handled).toBeLessThan(total);
    let received = 0;
    req.on("data", (d: Buffer) => (received += d.length));
    req.resume();
    await waitFor(() => received >= total * (5 + mib.length), { timeoutMs: 60_000, message: "every answer read" });
    expect(handled).toBe(total);
    expect(received).toBe(total * (5 + mib.length));
    session.destroy();
  });

  test("a receive budget: a message arriving past it fails its call (RESOURCE_EXHAUSTED), the older one, larger than the budget, arrives whole; no stream on the connection stalls; every byte is given back", async () => {
    const budget = new BodyBudget(100_000);
    const rejected: string[] = [];
    const got: string[] = [];
    // Windows of 64 KiB: the rejected stream's bytes, more than that, must not close the connection's window.
    server = createBidiServer(method, (call) => {
      call.on("data", (m) => got.push(`${m[0]}:${m.length}`));
      call.on("end", () => call.end());
    }, { maxMessageBytes: 1 << 20, windowBytes: 65_535, receiveBudget: budget, onRejected: (r) => rejected.push(r) });
    const port = await server.listen(HOST, 0);
    const session = http2.connect(`http://${HOST}:${port}`);
    const request = () => rawCall(session);
    // A: 300,000 bytes, more than the budget alone: the oldest message always goes on.
    const a = request();
    a.write(head(300_000));
    a.write(Buffer.alloc(150_000, 97));
    await waitFor(() => budget.usedBytes >= 150_000, { message: "A's first half counted" });
    // B: its first bytes pass the budget while A's message arrives: its call fails, what it held given back.
    const b = request();
    const bStatus = grpcStatus(b);
    b.write(head(200_000));
    b.write(Buffer.alloc(2_000, 98));
    b.write(Buffer.alloc(150_000, 98)); // in flight as B fails, more than the connection's window: read and dropped
    expect(await bStatus).toBe(String(GrpcStatus.RESOURCE_EXHAUSTED));
    expect(rejected).toEqual(["budget"]);
    const aStatus = grpcStatus(a);
    a.end(Buffer.alloc(150_000, 97));
    await waitFor(() => got.length === 1, { message: "A delivered" });
    expect(got).toEqual(["a:300000"]);
    expect(await aStatus).toBe(String(GrpcStatus.OK));
    await waitFor(() => budget.usedBytes === 0, { message: "every byte given back" });
    // A message within the budget goes through as before.
    const c = request();
    const cStatus = grpcStatus(c);
    c.end(Buffer.concat([head(50_000), Buffer.alloc(50_000, 99)]));
    expect(await cStatus).toBe(String(GrpcStatus.OK));
    expect(got).toEqual(["a:300000", "c:50000"]);
    expect(budget.usedBytes).toBe(0);
    session.destroy();
  });

  test("a receive budget counts the 16 KiB block a call copies its small chunks into: calls holding a few bytes each reach it and fail, past the budget; one that holds goes on; every byte is given back", async () => {
    const budget = new BodyBudget(100_000);
    const rejected: string[] = [];
    const got: string[] = [];
    server = createBidiServer(method, (call) => {
      call.on("data", (m) => got.push(m));
      call.on("end", () => call.end());
    }, { maxMessageBytes: 1 << 20, windowBytes: 1 << 20, receiveBudget: budget, onRejected: (r) => rejected.push(r) });
    const port = await server.listen(HOST, 0);
    const socket = net.connect(port, HOST);
    await new Promise((r) => socket.once("connect", r));
    socket.on("data", () => {});
    socket.on("error", () => {});
    // Each call sends 3 bytes of a message header in two DATA frames: the first is kept as it came, the second
    // copied into a block of its own. Counted by their bytes, 20 calls would hold 60 bytes of the budget.
    const calls = 20;
    const header = head(1);
    const frames: Buffer[] = [h2.preface, h2.frame(h2.SETTINGS, 0, 0)];
    for (let i = 0; i < calls; i++) {
      const id = 1 + 2 * i;
      frames.push(h2.frame(h2.HEADERS, h2.END_HEADERS, id, h2.requestHeaders(PATH)));
      frames.push(h2.frame(h2.DATA, 0, id, header.subarray(0, 2)), h2.frame(h2.DATA, 0, id, header.subarray(2, 3)));
    }
    socket.write(Buffer.concat(frames));
    const perCall = 3 + 16 * 1024;
    const held = Math.floor(budget.maxBytes / perCall);
    await waitFor(() => rejected.length === calls - held, { message: "the calls past the budget failed" });
    expect(rejected.every((r) => r === "budget")).toBe(true);
    expect(budget.arrivingBytes).toBe(held * perCall);
    // A call that holds its bytes goes on. The rest of its header empties its queue: the block is given back at
    // once, not when the message is whole.
    socket.write(h2.frame(h2.DATA, 0, 1, header.subarray(3)));
    await waitFor(() => budget.arrivingBytes === (held - 1) * perCall, { message: "the emptied queue's block given back" });
    socket.write(h2.frame(h2.DATA, h2.END_STREAM, 1, Buffer.from("x")));
    await waitFor(() => got.length === 1, { message: "the message delivered" });
    expect(got).toEqual(["x"]);
    expect(budget.arrivingBytes).toBe((held - 1) * perCall);
    socket.destroy();
    await waitFor(() => budget.usedBytes === 0, { message: "every byte given back" });
  });

  test("answers a client does not read count in the receive budget: past its bound the call whose answers waited least is reset (RESOURCE_EXHAUSTED), the one waiting longest goes on; every byte given back", async () => {
    const budget = new BodyBudget(1 << 20);
    const rejected: string[] = [];
    // The output counted just after each answer is written: a reset call's is given back at once.
    const afterWrite: number[] = [];
    const answer = (call: BidiCall<string, string>) => {
      call.on("data", (m) => {
        call.write(m);
        afterWrite.push(budget.outputBytes);
      });
    };
    server = createBidiServer(method, answer, { maxMessageBytes: 1 << 20, windowBytes: 1 << 20, receiveBudget: budget, onRejected: (r) => rejected.push(r) });
    const port = await server.listen(HOST, 0);
    // A receive window of 0: not one byte of an answer can go out.
    const session = http2.connect(`http://${HOST}:${port}`, { settings: { initialWindowSize: 0 } });
    const ask = (m: string) => {
      const r = rawCall(session);
      r.write(Buffer.concat([head(m.length), Buffer.from(m)]));
      return r;
    };
    const closed = (r: http2.ClientHttp2Stream) => new Promise<number>((resolve) => r.on("close", () => resolve(r.rstCode ?? -1)));
    const a = ask("big:600000");
    await waitFor(() => budget.outputBytes >= 600_000, { message: "A's answer counted" });
    expect(budget.usedBytes).toBe(budget.outputBytes);
    const b = ask("big:600000");
    expect(await closed(b)).toBe(http2.constants.NGHTTP2_ENHANCE_YOUR_CALM);
    expect(rejected).toEqual(["output_budget"]);
    // B's answer dropped with its stream; A's, waiting longest, still counted.
    expect(afterWrite).toEqual([600_005, 600_005]);
    expect(budget.outputBytes).toBe(600_005);
    const aClosed = closed(a);
    session.destroy();
    await aClosed;
    await waitFor(() => budget.usedBytes === 0, { message: "every byte given back" });
    expect(budget.outputBytes).toBe(0);
  });

  test("a call whose answers stay unread fails at the stall sweep (reset, RESOURCE_EXHAUSTED), ended already or not, giving back their bytes; a client that reads is answered", async () => {
    const budget = new BodyBudget(1 << 20);
    const rejected: string[] = [];
    // Looks 500 ms apart: a client that reads (or sends) is never that slow, even on a loaded machine.
    server = createBidiServer(method, echo, { maxMessageBytes: 1 << 20, windowBytes: 1 << 20, receiveBudget: budget, stallMs: 1000, onRejected: (r) => rejected.push(r) });
    const port = await server.listen(HOST, 0);
    const stuck = http2.connect(`http://${HOST}:${port}`, { settings: { initialWindowSize: 0 } });
    const frame = (m: string) => Buffer.concat([head(m.length), Buffer.from(m)]);
    const open = rawCall(stuck);
    open.write(frame("big:100000"));
    // Ended by the handler with OK: its trailers wait behind the answer, and would for good.
    const ended = rawCall(stuck);
    ended.end(frame("big:100000"));
    const rst = (r: http2.ClientHttp2Stream) => new Promise<number>((resolve) => r.on("close", () => resolve(r.rstCode ?? -1)));
    const [openRst, endedRst] = [rst(open), rst(ended)];
    // A client that reads its answers, meanwhile, is not failed.
    const reader = http2.connect(`http://${HOST}:${port}`);
    const read = rawCall(reader);
    const readStatus = grpcStatus(read);
    let got = 0;
    read.on("data", (d: Buffer) => (got += d.length));
    read.end(frame("big:300000"));
    expect(await readStatus).toBe("0");
    expect(got).toBe(300_005);
    expect(await openRst).toBe(http2.constants.NGHTTP2_ENHANCE_YOUR_CALM);
    expect(await endedRst).toBe(http2.constants.NGHTTP2_ENHANCE_YOUR_CALM);
    expect(rejected).toEqual(["unread", "unread"]);
    await waitFor(() => budget.usedBytes === 0, { message: "every byte given back" });
    stuck.destroy();
    reader.destroy();
  });

  test("a message sent one byte per DATA frame arrives whole", async () => {
    const got: number[] = [];
    server = createBidiServer(method, (call) => {
      call.on("data", (m) => got.push(m.length));
      call.on("end", () => call.end());
    }, { maxMessageBytes: 1 << 20, windowBytes: 1 << 20 });
    const port = await server.listen(HOST, 0);
    const socket = net.connect(port, HOST);
    await new Promise((r) => socket.once("connect", r));
    socket.on("data", () => {});
    socket.on("error", () => {});
    const n = 64 * 1024;
    const message = Buffer.concat([head(n), Buffer.alloc(n, 120)]);
    const frames: Buffer[] = [h2.preface, h2.frame(h2.SETTINGS, 0, 0), h2.frame(h2.HEADERS, h2.END_HEADERS, 1, h2.requestHeaders(PATH))];
    for (let i = 0; i < message.length; i++) frames.push(h2.frame(h2.DATA, i === message.length - 1 ? h2.END_STREAM : 0, 1, message.subarray(i, i + 1)));
    socket.write(Buffer.concat(frames));
    await waitFor(() => got.length === 1, { message: "the message delivered" });
    expect(got).toEqual([n]);
    socket.destroy();
  });

  test("past smallMessageBytes a message is decoded only when its bulk field holds all but them; a unary request is refused", async () => {
    // Here a message's bulk field is what follows its first "|".
    const decoded: number[] = [];
    const rejected: string[] = [];
    const bulky = {
      ...method,
      deserialize: (b: Buffer) => (decoded.push(b.length), method.deserialize(b)),
      besideBulk: (b: Buffer) => (b.includes(63) ? undefined : b.indexOf(124) < 0 ? b.length : b.indexOf(124) + 1), // "?": unreadable
    };
    server = createBidiServer(bulky, echo, {
      maxMessageBytes: 1 << 20,
      smallMessageBytes: 1000,
      windowBytes: 1 << 20,
      onRejected: (r) => rejected.push(r),
      unary: { "/test.Echo/Unary": (req) => req },
    });
    const port = await server.listen(HOST, 0);
    const { c, open } = client(port);
    const statusOf = async (m: string) => {
      const s = open();
      const done = collect(s);
      s.write(m);
      s.end();
      return (await done).status;
    };
    expect((await statusOf(`head|${"b".repeat(100_000)}`)).code).toBe(grpc.status.OK);
    expect(decoded).toEqual([100_005]);
    const tooLarge = await statusOf(`${"h".repeat(1001)}|body`);
    expect(tooLarge.code).toBe(grpc.status.RESOURCE_EXHAUSTED);
    expect(tooLarge.details).toContain("outside its bulk field");
    expect((await statusOf(`?${"x".repeat(1000)}`)).code).toBe(grpc.status.INTERNAL);
    // Within smallMessageBytes nothing is asked of besideBulk.
    expect((await statusOf("h".repeat(1000))).code).toBe(grpc.status.OK);
    expect(decoded).toEqual([100_005, 1000]);
    expect(rejected).toEqual(["too_large_field", "unparsable"]);
    const unary = (m: string) =>
      new Promise<grpc.ServiceError | null>((resolve) =>
        c.makeUnaryRequest("/test.Echo/Unary", (s: string) => Buffer.from(s), (b: Buffer) => b.toString(), m, (err) => resolve(err)),
      );
    expect(await unary("x".repeat(1000))).toBeNull();
    expect((await unary("x".repeat(1001)))?.code).toBe(grpc.status.RESOURCE_EXHAUSTED);
    c.close();
  });

  test("a large message whose first bytes say it is over smallMessageBytes outside its bulk field is refused before the rest arrives", async () => {
    // Here a message that opens with "H" declares a head past the limit (request-bulk.ts reads a request_headers'
    // length so); any other is read whole.
    const asked: number[] = [];
    const rejected: string[] = [];
    const budget = new BodyBudget(1 << 20);
    const early = { ...method, besideBulk: () => 0, besideBulkOverSoFar: (p: Buffer) => (asked.push(p.length), p[0] === 72) };
    // No stall sweep (no stallMs) to end a call whose message stops arriving: only the early refusal can.
    server = createBidiServer(early, echo, { maxMessageBytes: 1 << 20, smallMessageBytes: 1000, windowBytes: 1 << 20, receiveBudget: budget, onRejected: (r) => rejected.push(r) });
    const port = await server.listen(HOST, 0);
    const session = http2.connect(`http://${HOST}:${port}`);
    const refused = rawCall(session);
    const refusedTrailers = trailersOf(refused);
    refused.write(Buffer.concat([head(300_000), Buffer.from("H".repeat(100))])); // and never the rest
    expect(await refusedTrailers).toEqual({ status: String(GrpcStatus.RESOURCE_EXHAUSTED), message: "message of 300000 bytes has more than 1000 outside its bulk field" });
    expect(rejected).toEqual(["too_large_field"]);
    await waitFor(() => budget.usedBytes === 0, { message: "its bytes given back" });
    // On one call: a message that opens otherwise is held until it is whole, then read, asked of its first bytes until
    // 64 of them were seen (20, then 64); the next message is looked at afresh, and refused.
    asked.length = 0;
    const call = rawCall(session);
    const callTrailers = trailersOf(call);
    const answers: Buffer[] = [];
    call.on("data", (d: Buffer) => answers.push(d));
    call.write(Buffer.concat([head(3000), Buffer.from("b".repeat(20))]));
    await waitFor(() => asked.length === 1, { message: "its first bytes looked at" });
    call.write(Buffer.from("b".repeat(1000)));
    await waitFor(() => asked.length === 2, { message: "its first 64 bytes looked at" });
    call.write(Buffer.from("b".repeat(500)));
    call.write(Buffer.from("c".repeat(1480)));
    await waitFor(() => Buffer.concat(answers).length === 5 + 3000, { message: "the whole message answered" });
    expect(asked).toEqual([20, 64]);
    call.write(Buffer.concat([head(300_000), Buffer.from("H".repeat(100))]));
    expect((await callTrailers).status).toBe(String(GrpcStatus.RESOURCE_EXHAUSTED));
    expect(asked).toEqual([20, 64, 64]);
    expect(rejected).toEqual(["too_large_field", "too_large_field"]);
    session.destroy();
  });

  test("a message that stops arriving fails its call (RESOURCE_EXHAUSTED) and gives back its bytes; a call idle between messages goes on", async () => {
    const budget = new BodyBudget(1 << 20);
    const rejected: string[] = [];
    // Looks 500 ms apart: a client that reads (or sends) is never that slow, even on a loaded machine.
    server = createBidiServer(method, echo, { maxMessageBytes: 1 << 20, windowBytes: 1 << 20, receiveBudget: budget, stallMs: 1000, onRejected: (r) => rejected.push(r) });
    const port = await server.listen(HOST, 0);
    const session = http2.connect(`http://${HOST}:${port}`);
    const request = () => rawCall(session);
    const frame = (m: string) => Buffer.concat([head(m.length), Buffer.from(m)]);
    // Idle between whole messages: not stalled, however long.
    const idle = request();
    const idleStatus = grpcStatus(idle);
    const answers: string[] = [];
    idle.on("data", (d: Buffer) => answers.push(d.subarray(5).toString()));
    idle.write(frame("one"));
    // Half of a message, then nothing.
    const stuck = request();
    const stuckStatus = grpcStatus(stuck);
    stuck.write(head(300_000));
    stuck.write(Buffer.alloc(150_000, 97));
    await waitFor(() => budget.usedBytes >= 150_000, { message: "the half counted" });
    expect(await stuckStatus).toBe(String(GrpcStatus.RESOURCE_EXHAUSTED));
    expect(rejected).toEqual(["stalled"]);
    await waitFor(() => budget.usedBytes === 0, { message: "its bytes given back" });
    idle.end(frame("two"));
    expect(await idleStatus).toBe(String(GrpcStatus.OK));
    expect(answers.join("")).toBe("ONETWO");
    session.destroy();
  });

  test("a client connection may open at most 1024 streams at once", async () => {
    const port = await start(echo);
    const session = http2.connect(`http://${HOST}:${port}`);
    await new Promise((r) => session.once("remoteSettings", r));
    expect(session.remoteSettings.maxConcurrentStreams).toBe(1024);
    session.destroy();
  });

  test("shutdown lets an open call finish and refuses new connections", async () => {
    const port = await start(echo);
    const { c, open } = client(port);
    const s = open();
    const done = collect(s);
    s.write("before");
    await new Promise((r) => s.once("data", r));
    const stopped = server!.shutdown(5000);
    s.write("during");
    await Bun.sleep(50);
    s.end();
    const { messages, status } = await done;
    expect(messages).toEqual(["BEFORE", "DURING"]);
    expect(status.code).toBe(grpc.status.OK);
    await stopped;
    const late = client(port);
    const r = late.open();
    const refused = collect(r);
    r.end();
    expect((await refused).status.code).toBe(grpc.status.UNAVAILABLE);
    late.c.close();
    c.close();
    server = undefined;
  });

  test("shutdown closes what is still open after the grace period", async () => {
    const port = await start(echo);
    const { c, open } = client(port);
    const s = open();
    const done = collect(s);
    s.write("hang");
    await new Promise((r) => s.once("data", r));
    await server!.shutdown(100);
    const { status } = await done;
    expect(status.code).not.toBe(grpc.status.OK);
    c.close();
    server = undefined;
  });
});
