// One ZMTP 3.x session over one TCP stream (NULL security): greeting, READY handshake,
// PING→PONG, heartbeats, message assembly with a size limit, and a batched, bounded write queue.
import type { Socket } from "node:net";
import { ZmtpParser } from "./parser.ts";
import {
  FLAG_COMMAND, FLAG_MORE, type SocketType, compatible, encodeCommand, encodeGreeting, encodeReady,
  parseCommand, parseGreeting, parseMetadata,
} from "./wire.ts";

export type ConnectionOptions = {
  socketType: SocketType;
  identity?: Uint8Array;
  /** Largest accepted message (sum of its frames); a larger one closes the connection. */
  maxMessageSize: number;
  /** Messages queued in user space before send() starts dropping (only once the socket is backed up). */
  hwm: number;
  /** Minor ZMTP version we advertise (1 = 3.1; 0 makes peers use 3.0 subscription messages). */
  minor: number;
  asServer: boolean;
  handshakeTimeoutMs: number;
  heartbeat?: Heartbeat;
};

/**
 * ZMTP 3.1 heartbeats (RFC 37), as libzmq's ZMQ_HEARTBEAT_IVL / _TIMEOUT: a PING every `intervalMs`
 * (its TTL the timeout, at most 65.5 s), and the connection closed when nothing at all (PONG or anything
 * else) arrived for `timeoutMs`. Why: a SUB only reads, so a publisher host that vanished without a FIN (node lost, a
 * partition) leaves a connection that looks open forever, and a worker's events silently stop. libzmq
 * answers PING by itself, whatever its own heartbeat options. A 3.0 peer has no PING; TCP keepalive
 * (enabled with heartbeats) is what finds a dead one.
 */
export type Heartbeat = { intervalMs: number; timeoutMs: number };

export type CloseReason =
  | { kind: "peer-closed" }
  | { kind: "local" }
  | { kind: "protocol"; detail: string }
  | { kind: "oversize"; detail: string }
  | { kind: "heartbeat"; detail: string }
  | { kind: "io"; detail: string };

export type ConnectionHandler = {
  ready(c: Connection): void;
  message(c: Connection, frames: Buffer[]): void;
  /** Commands other than READY/PING/PONG/ERROR (SUBSCRIBE, CANCEL, unknown ones). */
  command?(c: Connection, name: string, data: Buffer): void;
  closed(c: Connection, reason: CloseReason): void;
};

const FLUSH_BYTES = 64 * 1024;

export class Connection {
  /** Peer's minor ZMTP version, known after the greeting. */
  peerMinor = -1;
  peerSocketType = "";
  peerIdentity: Buffer | undefined;
  isReady = false;
  private closed = false;
  private readonly parser: ZmtpParser;
  private parts: Buffer[] = [];
  private partsBytes = 0;
  private out: Buffer[] = [];
  private outBytes = 0;
  private outMsgs = 0;
  private flushScheduled = false;
  private blocked = false;
  private handshakeTimer: ReturnType<typeof setTimeout> | undefined;
  private heartbeatTimer: ReturnType<typeof setInterval> | undefined;
  private lastInAt = performance.now();
  /** Messages dropped by send() because the queue was at the HWM. */
  dropped = 0;
  bytesIn = 0;

  constructor(readonly socket: Socket, private readonly opts: ConnectionOptions, private readonly handler: ConnectionHandler) {
    // Until READY only handshake commands may come: a peer cannot make us allocate a large frame first.
    this.parser = new ZmtpParser(
      { greeting: (g) => this.onGreeting(g), frame: (f, b) => this.onFrame(f, b) },
      Math.min(opts.maxMessageSize, HANDSHAKE_MAX_FRAME),
    );
    socket.setNoDelay(true);
    if (opts.heartbeat) socket.setKeepAlive(true, opts.heartbeat.intervalMs);
    socket.on("data", (chunk: Buffer) => {
      this.bytesIn += chunk.length;
      this.lastInAt = performance.now();
      try {
        this.parser.push(chunk);
      } catch (e) {
        // A consumer callback threw: contain it to this connection rather than the process.
        return this.close({ kind: "protocol", detail: `message handler threw: ${(e as Error)?.message ?? String(e)}` });
      }
      if (this.parser.error !== null && !this.closed) {
        const detail = this.parser.error;
        this.close(detail.includes("exceeds") ? { kind: "oversize", detail } : { kind: "protocol", detail });
      }
    });
    socket.on("drain", () => {
      this.blocked = false;
      this.flush();
    });
    socket.on("error", (e: Error) => this.close({ kind: "io", detail: e.message }));
    socket.on("close", () => this.close({ kind: "peer-closed" }));
    this.handshakeTimer = setTimeout(
      () => this.close({ kind: "protocol", detail: "handshake timeout" }),
      opts.handshakeTimeoutMs,
    );
    this.handshakeTimer.unref?.();
    this.rawWrite(encodeGreeting(opts.minor, opts.asServer));
  }

  get peer(): string {
    return `${this.socket.remoteAddress}:${this.socket.remotePort}`;
  }

  /** Queues one encoded message (see encodeMessage). Returns false when dropped at the HWM. */
  send(msg: Buffer): boolean {
    if (this.closed || !this.isReady) return false;
    if (this.blocked && this.outMsgs >= this.opts.hwm) {
      this.dropped++;
      return false;
    }
    this.out.push(msg);
    this.outBytes += msg.length;
    this.outMsgs++;
    if (this.outBytes >= FLUSH_BYTES) this.flush();
    else if (!this.flushScheduled) {
      this.flushScheduled = true;
      setImmediate(() => {
        this.flushScheduled = false;
        this.flush();
      });
    }
    return true;
  }

  /** Messages waiting in user space. */
  get queued(): number {
    return this.outMsgs;
  }

  close(reason: CloseReason = { kind: "local" }): void {
    if (this.closed) return;
    this.closed = true;
    clearTimeout(this.handshakeTimer);
    clearInterval(this.heartbeatTimer);
    if (reason.kind === "local") {
      // Graceful end so queued messages go out, bounded so a peer that stopped reading
      // cannot hold the socket (and a server's close()) open.
      this.flush(true);
      this.socket.end();
      setTimeout(() => this.socket.destroy(), 100).unref?.();
    } else this.socket.destroy();
    this.out = [];
    this.handler.closed(this, reason);
  }

  /** `closing`: the last flush of close(), which writes whatever waits even past back-pressure. */
  private flush(closing = false): void {
    if (this.outMsgs === 0 || (!closing && (this.blocked || this.closed))) return;
    const data = this.out.length === 1 ? this.out[0]! : Buffer.concat(this.out, this.outBytes);
    this.out = [];
    this.outBytes = 0;
    this.outMsgs = 0;
    if (!this.rawWrite(data)) this.blocked = true;
  }

  private rawWrite(b: Buffer): boolean {
    try {
      return this.socket.write(b);
    } catch (e) {
      this.close({ kind: "io", detail: (e as Error).message });
      return false;
    }
  }

  private startHeartbeat(): void {
    const hb = this.opts.heartbeat;
    if (!hb || this.peerMinor < 1) return;
    const ping = encodeCommand("PING", pingBody(hb.timeoutMs));
    this.lastInAt = performance.now();
    let lastTick = this.lastInAt;
    this.heartbeatTimer = setInterval(() => {
      const now = performance.now();
      // Reading paused (back-pressure): the silence is ours, not the peer's.
      if (this.socket.isPaused()) this.lastInAt = now;
      // Time this process did not run (CPU starved, a long task) is not the peer's silence: when it
      // resumes, timers may come before the reads of what the peer sent meanwhile.
      this.lastInAt += Math.max(0, now - lastTick - hb.intervalMs);
      lastTick = now;
      const idle = now - this.lastInAt;
      if (idle >= hb.timeoutMs) return this.close({ kind: "heartbeat", detail: `nothing received for ${Math.round(idle)} ms` });
      // Every interval, busy or not: the PING's TTL makes libzmq expect traffic from us within it, and a
      // SUB sends nothing else (pinging only when idle got us dropped by libzmq once events flowed).
      this.rawWrite(ping);
    }, hb.intervalMs);
    this.heartbeatTimer.unref?.();
  }

  private onGreeting(g: Buffer): string | undefined {
    const parsed = parseGreeting(g);
    if (typeof parsed === "string") return parsed;
    this.peerMinor = parsed.major > 3 ? 1 : parsed.minor;
    this.rawWrite(encodeReady(this.opts.socketType, this.opts.identity));
    return undefined;
  }

  private onFrame(flags: number, body: Buffer): string | undefined {
    if (this.closed) return "closed";
    if (flags & FLAG_COMMAND) {
      if (flags & FLAG_MORE) return "command frame with MORE set";
      const cmd = parseCommand(body);
      if (!cmd) return "malformed command";
      return this.onCommand(cmd.name, cmd.data);
    }
    if (!this.isReady) return "data frame before READY";
    // Each frame counts for at least FRAME_OVERHEAD: a message of countless empty frames is bounded too.
    this.partsBytes += body.length + FRAME_OVERHEAD;
    if (this.partsBytes > this.opts.maxMessageSize) {
      this.close({ kind: "oversize", detail: `message exceeds the maximum ${this.opts.maxMessageSize}` });
      return undefined;
    }
    if (flags & FLAG_MORE) {
      this.parts.push(body);
      return undefined;
    }
    let frames: Buffer[];
    if (this.parts.length === 0) frames = [body];
    else {
      frames = this.parts;
      frames.push(body);
      this.parts = [];
    }
    this.partsBytes = 0;
    this.handler.message(this, frames);
    return undefined;
  }

  private onCommand(name: string, data: Buffer): string | undefined {
    if (!this.isReady) {
      if (name === "ERROR") return `peer error: ${data.toString("latin1", 1, 1 + (data[0] ?? 0))}`;
      if (name !== "READY") return `expected READY, got ${name}`;
      const meta = parseMetadata(data);
      if (!meta) return "malformed READY metadata";
      this.peerSocketType = meta.get("socket-type")?.toString("latin1") ?? "";
      if (!compatible(this.opts.socketType, this.peerSocketType)) {
        this.rawWrite(encodeCommand("ERROR", errorBody("Invalid socket type")));
        return `incompatible peer socket type ${JSON.stringify(this.peerSocketType)}`;
      }
      const id = meta.get("identity");
      if (id && id.length > 0) this.peerIdentity = Buffer.from(id);
      this.isReady = true;
      this.parser.maxFrame = this.opts.maxMessageSize;
      clearTimeout(this.handshakeTimer);
      this.startHeartbeat();
      this.handler.ready(this);
      return undefined;
    }
    switch (name) {
      case "PING": {
        // PONG echoes the ping context (after the 2-byte TTL), at most 16 bytes (RFC 37). None is
        // sent to a peer that is not reading our output: it would only pile up here.
        if (data.length > 2 + MAX_PING_CONTEXT) return `PING context of ${data.length - 2} bytes (at most ${MAX_PING_CONTEXT})`;
        if (this.socket.writableLength > PONG_SKIP_ABOVE) return undefined;
        this.rawWrite(encodeCommand("PONG", data.subarray(Math.min(2, data.length))));
        return undefined;
      }
      case "PONG":
        return undefined;
      case "ERROR":
        return `peer error: ${data.toString("latin1", 1, 1 + (data[0] ?? 0))}`;
      case "READY":
        return "duplicate READY";
      default:
        this.handler.command?.(this, name, data);
        return undefined;
    }
  }
}

/** The largest frame before the handshake ends (READY metadata is a few hundred bytes). */
const HANDSHAKE_MAX_FRAME = 64 * 1024;
/** Counted per data frame toward maxMessageSize besides its bytes (a frame's header and bookkeeping). */
const FRAME_OVERHEAD = 64;
const MAX_PING_CONTEXT = 16;
/** Output waiting in the socket past which PINGs go unanswered (the peer is not reading). */
const PONG_SKIP_ABOVE = 1 << 20;

/** libzmq keeps a PING's TTL as milliseconds in a u16 (TTL x 100): beyond 655 deciseconds it wraps. */
const MAX_TTL_DECISECONDS = 655;

function pingBody(timeoutMs: number): Buffer {
  // TTL (deciseconds, u16 BE): how long the peer may wait for our traffic; no context.
  const b = Buffer.alloc(2);
  b.writeUInt16BE(Math.min(MAX_TTL_DECISECONDS, Math.ceil(timeoutMs / 100)));
  return b;
}

function errorBody(reason: string): Buffer {
  const b = Buffer.allocUnsafe(1 + reason.length);
  b[0] = reason.length;
  b.write(reason, 1, "latin1");
  return b;
}
