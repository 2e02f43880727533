// One bidirectional-streaming gRPC method served straight on node:http2: gRPC's length-prefixed
// framing, status trailers and cancellation, nothing else (no compression, no other methods).
//
// Written here instead of serving ext_proc through @grpc/grpc-js because of a measurement (README
// "Bench"): the same EPP at 500 decisions/s of 8k-token bodies, driven by bench/loadgen.c, 12 runs
// each, had p99 1.78-2.49 ms on grpc-js and 0.70-1.80 ms on this (the target is 1 ms), and ~150 µs
// less server CPU per decision. It also sets its HTTP/2 windows itself, which grpc-js has no option
// for. The health service (9003) stays on grpc-js.
import http2 from "node:http2";
import { EventEmitter } from "node:events";
import { ByteQueue } from "./byte-queue.ts";

/** gRPC status codes used here (grpc/doc/statuscodes.md). */
export const GrpcStatus = { OK: 0, INVALID_ARGUMENT: 3, NOT_FOUND: 5, RESOURCE_EXHAUSTED: 8, UNIMPLEMENTED: 12, INTERNAL: 13, UNAVAILABLE: 14 } as const;
export type StatusCode = (typeof GrpcStatus)[keyof typeof GrpcStatus];

/**
 * The server side of one call: "data" per request message, "end" when the client half-closes,
 * "cancelled" when the call is over otherwise (the client reset it or went away, a message could not
 * be read and the call failed with its status, or shutdown aborted it), "error" on a transport error
 * while the call is open. After "end" the handler ends the call; after "cancelled" it is over.
 */
export interface BidiCall<In, Out> {
  /** `wireBytes`: the message's encoded length (what it may cost decoded: see BidiMethod.besideBulk). */
  on(event: "data", f: (msg: In, wireBytes: number) => void): this;
  on(event: "end" | "cancelled", f: () => void): this;
  on(event: "error", f: (err: Error) => void): this;
  write(msg: Out): void;
  /** Ends the call with status OK. */
  end(): void;
  /** Ends the call with an error status (the client sent what the call cannot take); "cancelled" follows. */
  fail(code: StatusCode, message: string): void;
}

export type BidiMethod<In, Out> = {
  /** "/package.Service/Method" */
  path: string;
  deserialize(bytes: Buffer): In;
  /** The encoded message, as one or more parts (written without joining them). */
  serialize(msg: Out): Uint8Array | Uint8Array[];
  /**
   * A request message's bytes outside its one field that may be large (a body), read from its wire format
   * without decoding it; a number past `limit` once that is certain; undefined when it cannot be read. With
   * it, a message over the server's smallMessageBytes is decoded only when this is within them: decoding
   * costs what the rest holds (a 40 MiB list of tiny entries is millions of objects), a body is one view.
   */
  besideBulk?(msg: Buffer, limit: number): number | undefined;
  /**
   * Whether a request message of `length` bytes, of which `prefix` (its first bytes) has arrived, is certain to have
   * more than `limit` bytes outside its bulk field (what besideBulk would say once all of it is here): with it, and
   * besideBulk, such a message is refused as soon as its first bytes tell, instead of once the server holds all of it.
   */
  besideBulkOverSoFar?(prefix: Buffer, length: number, limit: number): boolean;
};

export type BidiServerOptions = {
  maxMessageBytes: number;
  /**
   * Past this size, a bidi message is decoded only when its method's besideBulk is within it, and a unary
   * request is refused. Default: maxMessageBytes.
   */
  smallMessageBytes?: number;
  /**
   * A call whose message still arriving gains less than MIN_PROGRESS_BYTES in each of two looks `stallMs / 2`
   * apart fails ("stalled"), giving back what it holds; so does one whose answers the client does not read
   * ("unread": what was unsent at a look still is at the next, in each of two looks, and under
   * MIN_PROGRESS_BYTES went out). Without it, a stalled message or unread answer is held until its stream ends.
   */
  stallMs?: number;
  /** HTTP/2 receive window per stream and per connection. */
  windowBytes: number;
  /** TLS (ALPN h2 only, as GAIE's EPP) with this certificate; plaintext h2c without. */
  tls?: { cert: Buffer; key: Buffer };
  onError?: (where: string, err: unknown) => void;
  /**
   * A call failed because of what the client sent: `reason` is "framing" (compressed flag, a stream
   * ending inside a message), "too_large", "too_large_field" (past smallMessageBytes outside its bulk
   * field), "unparsable", "handler" (the handler threw on a message), "budget" (its message arrived past
   * the receive budget), "stalled" or "unread" (see stallMs), or "output_budget" (its answers waiting to go
   * out passed the receive budget's bound on them: see ReceiveBudget).
   */
  onRejected?: (reason: RejectReason, err?: unknown) => void;
  /**
   * Bounds the bytes of messages still arriving, and of answers not yet sent, across every call (see
   * ReceiveBudget). Without it they are bounded only per message, by maxMessageBytes, and per call's output
   * by the stall sweep.
   */
  receiveBudget?: ReceiveBudget;
  /**
   * Unary methods served beside the bidi one, by path ("/package.Service/Method"): the request
   * message's bytes in, the answer's bytes or an error status out (e.g. grpc.health.v1.Health/Check,
   * which GAIE's EPP can serve on the ext_proc port too).
   */
  unary?: Record<string, (request: Buffer) => Buffer | { code: StatusCode; message: string }>;
};

const RAW = { deserialize: (b: Buffer) => b, serialize: (b: Buffer) => b };

/**
 * A bound on bytes held, shared by every call of a server (in the EPP, with the handler's whole bodies, which
 * see these bytes in BodyBudget.usedBytes). A call counts what it holds of a message still arriving (`hold`:
 * those bytes are here, and the block its small chunks are copied into, at its whole size: ByteQueue.heldBytes),
 * and gives it back (`unhold`) once the message is whole, before handing it on. When the
 * bytes still arriving, all calls' together (`arrivingBytes`), pass the bound, a call that receives more fails
 * with RESOURCE_EXHAUSTED ("budget"), unless its message is the one that started arriving first: that one
 * always goes on, so a message that alone exceeds the bound still arrives. Only arriving bytes are weighed
 * here: the handler's bodies filling the bound route by load (server.ts) and must not fail the streams that
 * pass by. Failing, not pausing: a paused stream's unread bytes keep the connection's receive window closed
 * (Bun's HTTP/2, measured), which would stall every other stream the gateway multiplexes on it, the first
 * message's too.
 *
 * Answers written and not yet sent (the stream's writableLength: the peer's flow-control window is shut, or it
 * reads slowly) are held here too, and the window bounds none of them: in full duplex a whole body (up to 32
 * MiB) goes back as soon as its route is known, whether the client reads or not. They are counted apart
 * (`holdOutput`), under a bound of their own with the same number: counted with the arriving bytes, a client
 * that does not read would make other clients' messages fail, and it is its own calls that must. A call
 * whose write takes the output of all calls past the bound fails ("output_budget", its stream reset: answers
 * waiting to go out would keep it open; the reset gives them back at once), unless its output is the one that
 * has waited longest, which always goes on (an answer larger than the bound still goes out, one at a time); one
 * that does not drain fails in the stall sweep ("unread"). The count is taken at each write, when each message's last
 * bytes leave the stream's buffer (their write's callback), and at each look of the sweep: never under what is unsent.
 */
export interface ReceiveBudget {
  readonly maxBytes: number;
  readonly arrivingBytes: number;
  hold(n: number): void;
  unhold(n: number): void;
  readonly outputBytes: number;
  holdOutput(n: number): void;
  unholdOutput(n: number): void;
}

/**
 * The calls of one server that hold part of a message, the oldest message first, and those with answers not
 * yet sent, those waiting longest first (a Set keeps insertion order).
 */
type Arrivals = { budget: ReceiveBudget; arriving: Set<Call<unknown, unknown>>; sending: Set<Call<unknown, unknown>> };

export type RejectReason = "framing" | "too_large" | "too_large_field" | "unparsable" | "handler" | "budget" | "stalled" | "unread" | "output_budget";

export type BidiServer = {
  listen(host: string, port: number): Promise<number>;
  /** Refuses new calls, lets open ones finish for up to `graceMs`, then closes what is left. */
  shutdown(graceMs: number): Promise<void>;
  /** Serves new TLS connections with this certificate (open ones keep theirs). */
  setCertificate(c: { cert: Buffer; key: Buffer }): void;
};

export function createBidiServer<In, Out>(
  method: BidiMethod<In, Out>,
  handler: (call: BidiCall<In, Out>) => void,
  opts: BidiServerOptions,
): BidiServer {
  const settings = { initialWindowSize: opts.windowBytes, maxConcurrentStreams: MAX_CONCURRENT_STREAMS };
  // Session memory unbounded, as @grpc/grpc-js leaves it: http2's default (10 MB) refuses the
  // gateway's new streams (ENHANCE_YOUR_CALM) while a few large bodies are in flight on its
  // connection. The receive windows do not bound what this process holds: Call.read takes data as it
  // arrives, so the window reopens at once. What is held is bounded above: each message by
  // maxMessageBytes, and messages still arriving and answers not yet sent across all streams by the
  // receive budget (the EPP's body budget, which also bounds the bodies its handler holds).
  const serverOpts = { settings, maxSessionMemory: Number.MAX_SAFE_INTEGER };
  const server = opts.tls
    ? http2.createSecureServer({ ...serverOpts, cert: opts.tls.cert, key: opts.tls.key, allowHTTP1: false })
    : http2.createServer(serverOpts);
  const sessions = new Set<http2.ServerHttp2Session>();
  const calls = new Set<Call<unknown, unknown>>();
  const onError = opts.onError ?? (() => {});
  const onRejected = opts.onRejected ?? (() => {});
  const arrivals: Arrivals | undefined = opts.receiveBudget && { budget: opts.receiveBudget, arriving: new Set(), sending: new Set() };
  const smallBytes = Math.min(opts.smallMessageBytes ?? opts.maxMessageBytes, opts.maxMessageBytes);
  // One timer for every call, not one per message.
  let sweep: ReturnType<typeof setInterval> | undefined;
  const lookForStalls = (stallMs: number) => {
    sweep = setInterval(() => {
      for (const c of calls) c.look(stallMs);
    }, stallMs / 2);
    sweep.unref();
  };

  server.on("session", (session) => {
    sessions.add(session);
    session.on("close", () => sessions.delete(session));
    session.on("error", (err) => onError("session", err));
    try {
      session.setLocalWindowSize(opts.windowBytes);
    } catch {
      // A session closing as it opens: nothing to widen.
    }
  });
  server.on("sessionError", (err) => onError("session", err));
  // Both server kinds emit the same server streams; the union's overloads do not say so.
  (server as http2.Http2Server).on("stream", (stream: http2.ServerHttp2Stream, headers: http2.IncomingHttpHeaders) => {
    stream.on("error", (err) => onError("stream", err));
    const unary = opts.unary?.[String(headers[":path"])];
    if (headers[":path"] !== method.path && !unary) return refuse(stream, GrpcStatus.UNIMPLEMENTED, `unknown method ${headers[":path"]}`);
    if (headers[":method"] !== "POST") {
      stream.respond({ ":status": 405, allow: "POST" }, { endStream: true });
      return;
    }
    if (!GRPC_CONTENT_TYPE.test(String(headers["content-type"] ?? ""))) {
      stream.respond({ ":status": 415 }, { endStream: true });
      return;
    }
    const encoding = headers["grpc-encoding"];
    if (encoding !== undefined && encoding !== "identity")
      return refuse(stream, GrpcStatus.UNIMPLEMENTED, `compression ${encoding} is not supported`, { "grpc-accept-encoding": "identity" });
    if (unary) {
      // Unary requests are small (a health check names a service): no more is read of one.
      const call = new Call<Buffer, Buffer>(stream, { path: String(headers[":path"]), ...RAW }, { maxBytes: smallBytes, smallBytes }, onRejected, undefined);
      calls.add(call);
      stream.on("close", () => calls.delete(call));
      let answered = false;
      call.on("data", (req) => {
        if (answered) return;
        answered = true;
        const out = unary(req);
        if (Buffer.isBuffer(out)) {
          call.write(out);
          call.end();
        } else call.abort(out.code, out.message);
      });
      call.on("end", () => answered || call.abort(GrpcStatus.INVALID_ARGUMENT, "no request message"));
      return;
    }
    const call = new Call(stream, method, { maxBytes: opts.maxMessageBytes, smallBytes }, onRejected, arrivals);
    calls.add(call);
    stream.on("close", () => calls.delete(call));
    handler(call);
  });

  return {
    setCertificate: (c) => {
      if (!opts.tls) throw new Error("setCertificate on a plaintext server");
      (server as http2.Http2SecureServer).setSecureContext({ cert: c.cert, key: c.key });
    },
    listen: (host, port) =>
      new Promise((resolve, reject) => {
        server.once("error", reject);
        server.listen(port, host, () => {
          server.off("error", reject);
          server.on("error", (err) => onError("server", err));
          if (opts.stallMs !== undefined && sweep === undefined) lookForStalls(opts.stallMs);
          resolve((server.address() as { port: number }).port);
        });
      }),
    shutdown: async (graceMs) => {
      /** Until every connection has closed, or `ms` have passed. */
      const drained = async (ms: number) => {
        const deadline = Date.now() + ms;
        while (sessions.size > 0 && Date.now() < deadline) await Bun.sleep(10);
      };
      server.close();
      clearInterval(sweep);
      // GOAWAY: open streams go on, new ones are refused.
      for (const s of sessions) s.close();
      await drained(graceMs);
      // Calls still open past the grace period end with UNAVAILABLE (the client may retry elsewhere),
      // then the connections close.
      for (const c of calls) c.abort(GrpcStatus.UNAVAILABLE, "server shutting down");
      await drained(200);
      for (const s of sessions) s.destroy();
    },
  };
}

/** application/grpc, optionally +proto, optionally with parameters (not +json, not grpc-web). */
const GRPC_CONTENT_TYPE = /^application\/grpc(\+proto)?(;|$)/i;

function refuse(stream: http2.ServerHttp2Stream, code: StatusCode, message: string, extra: Record<string, string> = {}): void {
  // Trailers-only response: the status in the only HEADERS frame.
  stream.respond(
    { ":status": 200, "content-type": "application/grpc", "grpc-status": String(code), "grpc-message": encodeURIComponent(message), ...extra },
    { endStream: true },
  );
}

const HEADER_BYTES = 5;
/** Messages up to this size go out as one write (frame header joined to the message). */
const JOIN_BELOW = 16 * 1024;
/**
 * A message from this size that arrived in pieces is joined in shared memory (take()): a body worth handing to a
 * pool member by reference; below it (headers, small bodies) a copy costs the same and a plain buffer is cheaper.
 */
const SHARED_JOIN_BYTES = 64 * 1024;
/** Of a message past smallBytes still arriving, the first bytes asked of besideBulkOverSoFar (a field's tag and length, and a few more). */
const EARLY_LOOK_BYTES = 64;
/**
 * Reading stops while this much of the call's output waits to be sent: in full duplex every body
 * byte goes back, so a client that does not read would otherwise have the server buffer all it sends.
 * The pause holds the connection's receive window too (see ReceiveBudget): the client's other streams on
 * that connection wait with it, until it reads.
 */
const PAUSE_READING_ABOVE = 8 * 1024 * 1024;
/**
 * Streams one client connection may have open at once (HTTP/2's default is unbounded). Envoy opens another
 * connection when its streams on one reach the peer's limit.
 */
const MAX_CONCURRENT_STREAMS = 1024;
/**
 * What a message still arriving must gain between two looks of the stall sweep to count as progress: more
 * than one byte, or a client dripping one byte now and then would hold its message's bytes as long as it
 * likes. Any working link moves this much in far less than a stall period.
 */
const MIN_PROGRESS_BYTES = 64 * 1024;

class Call<In, Out> extends EventEmitter implements BidiCall<In, Out> {
  private status: { code: StatusCode; message: string } | undefined;
  private ended = false;
  /** Bytes received and not yet delivered, and the length of the message they start (once known). */
  private queue = new ByteQueue();
  private messageBytes: number | undefined;
  /** Of the message arriving, the bytes besideBulkOverSoFar has been asked about (see refusedEarly). */
  private lookedBytes = 0;
  private paused = false;
  /** Bytes counted in the receive budget: what the queue holds of a message not yet whole (its heldBytes). */
  private counted = 0;
  /** Bytes received in all, their count at the stall sweep's last look, and how many looks in a row saw too few. */
  private received = 0;
  private receivedAtLook = 0;
  private idleLooks = 0;
  /**
   * Bytes handed to the stream to send, of them those counted in the budget as not yet sent, those sent at
   * the last look, those written by then (to be sent by the next), and how many looks in a row found them not.
   */
  private written = 0;
  private outCounted = 0;
  private sentAtLook = 0;
  private writtenAtLook = 0;
  private unreadLooks = 0;
  /** Reset for answers not taken: what it had not sent is dropped, though the stream may still report it. */
  private outputDropped = false;

  constructor(
    private readonly stream: http2.ServerHttp2Stream,
    private readonly method: BidiMethod<In, Out>,
    private readonly limits: { maxBytes: number; smallBytes: number },
    private readonly onRejected: (reason: RejectReason, err?: unknown) => void,
    private readonly arrivals: Arrivals | undefined,
  ) {
    super();
    stream.respond({ ":status": 200, "content-type": "application/grpc" }, { waitForTrailers: true });
    stream.on("wantTrailers", () => {
      const s = this.status ?? { code: GrpcStatus.OK, message: "" };
      const trailers: Record<string, string> = { "grpc-status": String(s.code) };
      if (s.message) trailers["grpc-message"] = encodeURIComponent(s.message);
      // Asked for even on a stream the client reset, where there is no one to tell.
      if (stream.destroyed || stream.aborted) return;
      stream.sendTrailers(trailers);
      // A failed call is over whatever the client still sends: reset its side (RFC 9113 8.1).
      if (s.code !== GrpcStatus.OK) setImmediate(() => stream.destroyed || stream.close(http2.constants.NGHTTP2_NO_ERROR));
    });
    stream.on("data", (chunk: Buffer) => {
      // Nothing a client sends may escape as an exception (it would end the process): whatever throws
      // while reading or handling a message ends this call only.
      try {
        this.read(chunk);
      } catch (err) {
        this.reject("handler", GrpcStatus.INTERNAL, "internal error", err);
      }
    });
    // Told at once: the handler releases the request's load on it. Bun's node:http2 reports a
    // client's RST_STREAM as "end" then "aborted", so a handler learns of a reset as a half-close
    // (both end the request).
    stream.on("end", () => {
      if (this.ended) return;
      if (this.queue.length > 0 || this.messageBytes !== undefined) return this.reject("framing", GrpcStatus.INTERNAL, "stream ended inside a message");
      this.emit("end");
    });
    stream.on("aborted", () => this.cancel());
    stream.on("close", () => {
      this.cancel();
      this.countOutput(); // nothing left to send
    });
    stream.on("error", (err) => {
      if (!this.ended && this.listenerCount("error") > 0) this.emit("error", err);
    });
  }

  // Once a message's last bytes leave the stream's buffer, what is still unsent is counted again (every message ends
  // with this callback, so the buffer never empties without it: a "drain" would count nothing new).
  private readonly recount = () => void this.countOutput();

  write(msg: Out): void {
    if (this.ended || this.stream.destroyed) return;
    const encoded = this.method.serialize(msg);
    const parts = Array.isArray(encoded) ? encoded : [encoded];
    let len = 0;
    for (const p of parts) len += p.length;
    if (len < JOIN_BELOW) {
      const out = Buffer.allocUnsafe(HEADER_BYTES + len);
      out[0] = 0;
      out.writeUInt32BE(len, 1);
      let off = HEADER_BYTES;
      for (const p of parts) {
        out.set(p, off);
        off += p.length;
      }
      this.stream.write(out, this.recount);
    } else {
      // Large messages (a body handed back) go out part by part, without a copy.
      const header = Buffer.allocUnsafe(HEADER_BYTES);
      header[0] = 0;
      header.writeUInt32BE(len, 1);
      this.stream.write(header);
      parts.forEach((p, i) => this.stream.write(p, i === parts.length - 1 ? this.recount : undefined));
    }
    this.written += HEADER_BYTES + len;
    if (!this.countOutput()) return this.dropOutput("output_budget");
    if (!this.paused && this.stream.writableLength > PAUSE_READING_ABOVE) {
      // No more reads (so no WINDOW_UPDATEs: the client's sending stops) until the output drains.
      this.paused = true;
      this.stream.pause();
      this.stream.once("drain", () => {
        this.paused = false;
        this.stream.resume();
      });
    }
  }

  end(): void {
    this.close();
  }

  fail(code: StatusCode, message: string): void {
    this.failCall(code, message);
  }

  /** Ends the call with an error status (server shutting down); the handler is told "cancelled". */
  abort(code: StatusCode, message: string): void {
    this.failCall(code, message);
  }

  private reject(reason: RejectReason, code: StatusCode, message: string, err?: unknown): void {
    if (this.ended) return;
    this.onRejected(reason, err);
    this.failCall(code, message);
  }

  /**
   * One look of the stall sweep (every `stallMs / 2`). The call fails when, at the second look in a row (a first
   * one may follow a busy event loop that read or sent nothing for a while), the message it is receiving gained
   * less than MIN_PROGRESS_BYTES since the last look, or its answers unsent at the last look are not all sent
   * and under MIN_PROGRESS_BYTES of them went out. Either way it holds bytes of the budget (or, without one,
   * of this process) for as long as the client likes. RESOURCE_EXHAUSTED, as for the budget itself: that is
   * what the call is failed for. DEADLINE_EXCEEDED would say the caller's deadline passed, and the caller set
   * none.
   */
  look(stallMs: number): void {
    const gained = this.received - this.receivedAtLook;
    this.receivedAtLook = this.received;
    const arriving = this.queue.length > 0 || this.messageBytes !== undefined;
    this.idleLooks = !this.ended && arriving && gained < MIN_PROGRESS_BYTES ? this.idleLooks + 1 : 0;
    const sent = this.written - this.unsent();
    const unread = sent < this.writtenAtLook && sent - this.sentAtLook < MIN_PROGRESS_BYTES;
    this.unreadLooks = unread ? this.unreadLooks + 1 : 0;
    this.sentAtLook = sent;
    this.writtenAtLook = this.written;
    this.countOutput();
    if (this.unreadLooks >= 2) this.dropOutput("unread");
    else if (this.idleLooks >= 2) this.reject("stalled", GrpcStatus.RESOURCE_EXHAUSTED, `request message stalled: under ${MIN_PROGRESS_BYTES} bytes in ${stallMs} ms`);
  }

  /** Bytes written to the stream and not yet sent. */
  private unsent(): number {
    return this.outputDropped || this.stream.destroyed ? 0 : this.stream.writableLength;
  }

  /** Counts the answers not yet sent as they are now; false when they take the output past the bound (see ReceiveBudget). */
  private countOutput(): boolean {
    const a = this.arrivals;
    if (a === undefined) return true;
    const unsent = this.unsent();
    if (unsent > this.outCounted) a.budget.holdOutput(unsent - this.outCounted);
    else if (unsent < this.outCounted) a.budget.unholdOutput(this.outCounted - unsent);
    this.outCounted = unsent;
    if (unsent === 0) {
      a.sending.delete(this);
      return true;
    }
    return admitted(a.sending, this, a.budget.outputBytes, a.budget.maxBytes);
  }

  /**
   * Fails the call for answers its client does not take, ended already or not (its trailers would wait behind
   * them, and their bytes with them): the stream is reset at once, what it has not sent dropped. Other failures
   * end the stream as usual, their status after the answers, which a client that reads takes at once; one that
   * does not is reset here by the stall sweep.
   */
  private dropOutput(reason: "unread" | "output_budget"): void {
    this.onRejected(reason);
    if (this.ended) this.reset();
    else this.failCall(GrpcStatus.RESOURCE_EXHAUSTED, `answers not taken (${reason})`, true);
  }

  /**
   * RST_STREAM, which gRPC clients read as RESOURCE_EXHAUSTED. What was not sent is given back now, not at the
   * stream's "close": until then it would count against, and could fail, another call's answers.
   */
  private reset(): void {
    if (!this.stream.destroyed) this.stream.close(http2.constants.NGHTTP2_ENHANCE_YOUR_CALM);
    this.outputDropped = true;
    this.countOutput();
  }

  /** The client reset the stream or went away. */
  private cancel(): void {
    if (this.ended) return;
    this.ended = true;
    this.unholdArriving();
    this.emit("cancelled");
  }

  private close(status?: { code: StatusCode; message: string }, reset = false): void {
    if (this.ended) return;
    this.ended = true;
    this.status = status;
    this.queue.clear();
    this.unholdArriving();
    if (reset) this.reset();
    else if (!this.stream.destroyed) this.stream.end();
  }

  /**
   * Counts what the queue holds now of a message still arriving; false when more of it passes the budget (see
   * ReceiveBudget). Less is given back at once (a block the queue let go once the message's header was taken).
   */
  private holdArriving(): boolean {
    const a = this.arrivals;
    if (a === undefined) return true;
    const held = this.queue.heldBytes;
    const more = held - this.counted;
    this.counted = held;
    if (more < 0) a.budget.unhold(-more);
    if (more <= 0) return true;
    a.budget.hold(more);
    return admitted(a.arriving, this, a.budget.arrivingBytes, a.budget.maxBytes);
  }

  /** Its message whole, or the call over: nothing of it counted, no longer arriving. */
  private unholdArriving(): void {
    const a = this.arrivals;
    if (a === undefined) return;
    a.arriving.delete(this);
    if (this.counted > 0) a.budget.unhold(this.counted);
    this.counted = 0;
  }

  /** Fails the call (status in the trailers, or `reset`), stops reading, and tells the handler it is over. */
  private failCall(code: StatusCode, message: string, reset = false): void {
    if (this.ended) return;
    this.close({ code, message }, reset);
    this.stream.removeAllListeners("data");
    this.stream.resume();
    this.emit("cancelled");
  }

  private read(chunk: Buffer): void {
    if (this.ended) return; // ended with OK while the client still sends: nothing more is read
    this.queue.push(chunk);
    this.received += chunk.length;
    this.readMessages();
    if (!this.ended && !this.holdArriving())
      this.reject("budget", GrpcStatus.RESOURCE_EXHAUSTED, "the server's buffer for request messages is full: retry");
  }

  private readMessages(): void {
    while (!this.ended) {
      if (this.messageBytes === undefined) {
        if (this.queue.length < HEADER_BYTES) return;
        // Frame header: flag byte + u32 length, possibly split across chunks.
        const head = this.take(HEADER_BYTES);
        if (head[0] !== 0) return this.reject("framing", GrpcStatus.INTERNAL, "compressed message without grpc-encoding");
        const len = head.readUInt32BE(1);
        if (len > this.limits.maxBytes) return this.reject("too_large", GrpcStatus.RESOURCE_EXHAUSTED, `message of ${len} bytes exceeds ${this.limits.maxBytes}`);
        this.messageBytes = len;
        this.lookedBytes = 0;
      }
      // The message is joined once all of it is here (not allocated at the length the client claims).
      if (this.queue.length < this.messageBytes) return void this.refusedEarly(this.messageBytes);
      const bytes = this.take(this.messageBytes);
      this.messageBytes = undefined;
      // Whole: its bytes leave the receive budget before the handler may count them as its own. What follows
      // of the next message is that message's, counted after this loop, its age starting then.
      this.unholdArriving();
      this.deliver(bytes);
    }
  }

  /**
   * The next `n` received bytes: a view when they lie in one piece, else joined (from SHARED_JOIN_BYTES, into
   * shared memory). Joined there, the body a message carries (a view of it, see request-bulk.ts) goes to a
   * tokenizer pool member by reference instead of as another copy made on this thread (TokenizerPool.pump:
   * ~100 µs of a 500 KiB body, against the same join into an ArrayBuffer; bench:body-handoff).
   */
  private take(n: number): Buffer {
    return this.queue.take(n, joined);
  }

  /**
   * A message past smallBytes whose first bytes already say it holds more than that outside its bulk field (a
   * request_headers of millions of tiny entries declares its length up front) is refused now, with the answer
   * deliver would give it whole: its bytes are not held meanwhile. True when refused.
   */
  private refusedEarly(len: number): boolean {
    const small = this.limits.smallBytes;
    // Only where deliver would ask besideBulk of the whole message: the early answer is the one it would give.
    const { besideBulk, besideBulkOverSoFar } = this.method;
    if (len <= small || !besideBulk || !besideBulkOverSoFar || this.lookedBytes >= EARLY_LOOK_BYTES) return false;
    const n = Math.min(this.queue.length, EARLY_LOOK_BYTES);
    if (n <= this.lookedBytes) return false;
    this.lookedBytes = n;
    if (!besideBulkOverSoFar(this.queue.peek(n), len, small)) return false;
    this.reject("too_large_field", GrpcStatus.RESOURCE_EXHAUSTED, besideMessage(len, small));
    return true;
  }

  private deliver(bytes: Buffer): void {
    let msg: In;
    try {
      const small = this.limits.smallBytes;
      const beside = bytes.length > small && this.method.besideBulk ? this.method.besideBulk(bytes, small) : 0;
      if (beside === undefined) throw new Error("not readable as its message type");
      if (beside > small)
        return this.reject("too_large_field", GrpcStatus.RESOURCE_EXHAUSTED, besideMessage(bytes.length, small));
      msg = this.method.deserialize(bytes);
    } catch (err) {
      return this.reject("unparsable", GrpcStatus.INTERNAL, `could not parse request message: ${(err as Error).message}`, err);
    }
    this.emit("data", msg, bytes.length);
  }
}

/**
 * Puts `call` in `waiting`, where it stays if it was there already (a Set keeps insertion order: the oldest
 * first); true while `held` is within `maxBytes`, or when `call` has waited longest, which always goes on.
 */
function admitted(waiting: Set<Call<unknown, unknown>>, call: Call<unknown, unknown>, held: number, maxBytes: number): boolean {
  waiting.add(call);
  return held <= maxBytes || waiting.values().next().value === call;
}

const besideMessage = (len: number, small: number) => `message of ${len} bytes has more than ${small} outside its bulk field`;

const joined = (n: number): Buffer => (n >= SHARED_JOIN_BYTES ? Buffer.from(new SharedArrayBuffer(n)) : Buffer.allocUnsafe(n));
