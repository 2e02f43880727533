// One bidirectional-streaming gRPC method served straight on node:http2: gRPC's length-prefixed
// framing, status trailers and cancellation, nothing else (no compression, no other methods).
//
// Written here instead of serving ext_proc through @grpc/grpc-js because of a measurement
// (bench/epp.bench.ts, bench/REPORT.md): per decision on an 8k-token body, grpc-js's server machinery
// cost ~200 µs of CPU and its message copies drove the GC pauses that set p99 at 500 decisions/s,
// past the 1 ms target in full-duplex mode. It also lets the server set its HTTP/2 windows itself,
// which grpc-js has no option for. The health service (9003) stays on grpc-js.
import http2 from "node:http2";
import { EventEmitter } from "node:events";

/** gRPC status codes used here (grpc/doc/statuscodes.md). */
export const GrpcStatus = { OK: 0, RESOURCE_EXHAUSTED: 8, UNIMPLEMENTED: 12, INTERNAL: 13, UNAVAILABLE: 14 } as const;
type StatusCode = (typeof GrpcStatus)[keyof typeof GrpcStatus];

/**
 * The server side of one call: "data" per request message, "end" when the client half-closes,
 * "cancelled" when the stream goes away before the call ended, "error" on a transport error.
 */
export interface BidiCall<In, Out> {
  on(event: "data", f: (msg: In) => void): this;
  on(event: "end" | "cancelled", f: () => void): this;
  on(event: "error", f: (err: Error) => void): this;
  write(msg: Out): void;
  /** Ends the call with status OK. */
  end(): void;
}

export type BidiMethod<In, Out> = {
  /** "/package.Service/Method" */
  path: string;
  deserialize(bytes: Buffer): In;
  /** The encoded message, as one or more parts (written without joining them). */
  serialize(msg: Out): Uint8Array | Uint8Array[];
};

export type BidiServerOptions = {
  maxMessageBytes: number;
  /** HTTP/2 receive window per stream and per connection. */
  windowBytes: number;
  tls?: { cert: Buffer; key: Buffer };
  onError?: (where: string, err: unknown) => void;
};

export type BidiServer = {
  listen(host: string, port: number): Promise<number>;
  /** Refuses new calls, lets open ones finish for up to `graceMs`, then closes what is left. */
  shutdown(graceMs: number): Promise<void>;
};

export function createBidiServer<In, Out>(
  method: BidiMethod<In, Out>,
  handler: (call: BidiCall<In, Out>) => void,
  opts: BidiServerOptions,
): BidiServer {
  const settings = { initialWindowSize: opts.windowBytes };
  // Session memory unbounded, as @grpc/grpc-js leaves it: http2's default (10 MB) refuses the
  // gateway's new streams (ENHANCE_YOUR_CALM) while a few large bodies are in flight on its
  // connection; the receive windows bound what a client can queue.
  const serverOpts = { settings, maxSessionMemory: Number.MAX_SAFE_INTEGER };
  const server = opts.tls
    ? http2.createSecureServer({ ...serverOpts, cert: opts.tls.cert, key: opts.tls.key, allowHTTP1: false })
    : http2.createServer(serverOpts);
  const sessions = new Set<http2.ServerHttp2Session>();
  const calls = new Set<Call<In, Out>>();
  const onError = opts.onError ?? (() => {});

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
    if (headers[":path"] !== method.path) return refuse(stream, GrpcStatus.UNIMPLEMENTED, `unknown method ${headers[":path"]}`);
    if (!String(headers["content-type"] ?? "").startsWith("application/grpc")) {
      stream.respond({ ":status": 415 }, { endStream: true });
      return;
    }
    const encoding = headers["grpc-encoding"];
    if (encoding !== undefined && encoding !== "identity")
      return refuse(stream, GrpcStatus.UNIMPLEMENTED, `compression ${encoding} is not supported`, { "grpc-accept-encoding": "identity" });
    const call = new Call(stream, method, opts.maxMessageBytes);
    calls.add(call);
    stream.on("close", () => calls.delete(call));
    handler(call);
  });

  return {
    listen: (host, port) =>
      new Promise((resolve, reject) => {
        server.once("error", reject);
        server.listen(port, host, () => {
          server.off("error", reject);
          server.on("error", (err) => onError("server", err));
          resolve((server.address() as { port: number }).port);
        });
      }),
    shutdown: async (graceMs) => {
      server.close();
      // GOAWAY: open streams go on, new ones are refused.
      for (const s of sessions) s.close();
      const deadline = Date.now() + graceMs;
      while (sessions.size > 0 && Date.now() < deadline) await Bun.sleep(20);
      // Calls still open past the grace period end with UNAVAILABLE (the client may retry elsewhere),
      // then the connections close.
      for (const c of calls) c.abort(GrpcStatus.UNAVAILABLE, "server shutting down");
      const closing = Date.now() + 200;
      while (sessions.size > 0 && Date.now() < closing) await Bun.sleep(10);
      for (const s of sessions) s.destroy();
    },
  };
}

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

class Call<In, Out> extends EventEmitter implements BidiCall<In, Out> {
  #status: { code: StatusCode; message: string } | undefined;
  #ended = false;
  /** The message being read: its buffer once the length is known, or the bytes before that. */
  #head: Buffer = Buffer.alloc(0);
  #body: Buffer | undefined;
  #filled = 0;

  constructor(
    private readonly stream: http2.ServerHttp2Stream,
    private readonly method: BidiMethod<In, Out>,
    private readonly maxMessageBytes: number,
  ) {
    super();
    stream.respond({ ":status": 200, "content-type": "application/grpc" }, { waitForTrailers: true });
    stream.on("wantTrailers", () => {
      const s = this.#status ?? { code: GrpcStatus.OK, message: "" };
      const trailers: Record<string, string> = { "grpc-status": String(s.code) };
      if (s.message) trailers["grpc-message"] = encodeURIComponent(s.message);
      // Asked for even on a stream the client reset, where there is no one to tell.
      if (!stream.destroyed && !stream.aborted) stream.sendTrailers(trailers);
    });
    stream.on("data", (chunk: Buffer) => this.#read(chunk));
    // Told at once: the handler releases the request's load on it. Bun's node:http2 reports a
    // client's RST_STREAM as "end" then "aborted", so a handler learns of a reset as a half-close
    // (both end the request); a connection that drops without either is "cancelled".
    stream.on("end", () => {
      if (!this.#ended) this.emit("end");
    });
    stream.on("aborted", () => this.#cancelled());
    stream.on("close", () => this.#cancelled());
    stream.on("error", (err) => this.emit("error", err));
  }

  write(msg: Out): void {
    if (this.#ended || this.stream.destroyed) return;
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
      this.stream.write(out);
      return;
    }
    // Large messages (a body handed back) go out part by part, without a copy.
    const header = Buffer.allocUnsafe(HEADER_BYTES);
    header[0] = 0;
    header.writeUInt32BE(len, 1);
    this.stream.write(header);
    for (const p of parts) this.stream.write(p);
  }

  end(): void {
    this.#close();
  }

  /** Ends the call with an error status (server shutting down). */
  abort(code: StatusCode, message: string): void {
    this.#close({ code, message });
  }

  #cancelled(): void {
    if (this.#ended) return;
    this.#ended = true;
    this.emit("cancelled");
  }

  #close(status?: { code: StatusCode; message: string }): void {
    if (this.#ended) return;
    this.#ended = true;
    this.#status = status;
    if (!this.stream.destroyed) this.stream.end();
  }

  /** Fails the call (status in the trailers) and stops reading. */
  #fail(code: StatusCode, message: string): void {
    this.#close({ code, message });
    this.stream.removeAllListeners("data");
    this.stream.resume();
  }

  #read(chunk: Buffer): void {
    let off = 0;
    while (off < chunk.length && !this.#ended) {
      if (this.#body === undefined) {
        // Frame header: flag byte + u32 length, possibly split across chunks.
        const need = HEADER_BYTES - this.#head.length;
        const take = Math.min(need, chunk.length - off);
        this.#head = this.#head.length === 0 && take === HEADER_BYTES ? chunk.subarray(off, off + take) : Buffer.concat([this.#head, chunk.subarray(off, off + take)]);
        off += take;
        if (this.#head.length < HEADER_BYTES) return;
        const compressed = this.#head[0] !== 0;
        const len = this.#head.readUInt32BE(1);
        this.#head = Buffer.alloc(0);
        if (compressed) return this.#fail(GrpcStatus.INTERNAL, "compressed message without grpc-encoding");
        if (len > this.maxMessageBytes) return this.#fail(GrpcStatus.RESOURCE_EXHAUSTED, `message of ${len} bytes exceeds ${this.maxMessageBytes}`);
        // A message wholly inside this chunk is used in place; otherwise it is assembled.
        if (chunk.length - off >= len) {
          this.#deliver(chunk.subarray(off, off + len));
          off += len;
          continue;
        }
        this.#body = Buffer.allocUnsafe(len);
        this.#filled = 0;
      }
      const take = Math.min(this.#body.length - this.#filled, chunk.length - off);
      chunk.copy(this.#body, this.#filled, off, off + take);
      this.#filled += take;
      off += take;
      if (this.#filled === this.#body.length) {
        const body = this.#body;
        this.#body = undefined;
        this.#deliver(body);
      }
    }
  }

  #deliver(bytes: Buffer): void {
    let msg: In;
    try {
      msg = this.method.deserialize(bytes);
    } catch (err) {
      return this.#fail(GrpcStatus.INTERNAL, `could not parse request message: ${(err as Error).message}`);
    }
    this.emit("data", msg);
  }
}
