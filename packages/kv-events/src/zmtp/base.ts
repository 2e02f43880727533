// Shared machinery of our ZMTP sockets: bind (accept many peers), connect (one peer per
// endpoint, reconnecting with capped exponential backoff), counters, close.
import { type Server, type Socket, createConnection, createServer } from "node:net";
import { Backoff, formatEndpoint, parseEndpoint } from "@kv-epp/protocol";
import { childLogger, type Logger } from "../logger.ts";
import { type CloseReason, Connection, type ConnectionHandler, type Heartbeat } from "./connection.ts";
import type { SocketType } from "./wire.ts";

export type SocketOptions = {
  /** Largest accepted inbound message in bytes (default 8 MiB). */
  maxMessageSize?: number;
  /** Per-peer queued messages before sends to that peer are dropped (default 10000). */
  hwm?: number;
  /** Reconnect backoff for connect(): first delay and cap in ms (defaults 100 / 5000). */
  reconnectMinMs?: number;
  reconnectMaxMs?: number;
  /** Routing identity announced in READY (ROUTER/DEALER). */
  identity?: Uint8Array;
  /** ZMTP minor version advertised (default 1 = ZMTP 3.1). */
  zmtpMinor?: 0 | 1;
  handshakeTimeoutMs?: number;
  /** ZMTP 3.1 PING/PONG liveness per connection (see Heartbeat); off unless given. */
  heartbeat?: Heartbeat;
  logger?: Logger;
};

export type SocketCounters = {
  accepted: number;
  connects: number;
  reconnects: number;
  disconnects: number;
  protocolErrors: number;
  oversize: number;
  /** Connections closed because the peer went silent past the heartbeat timeout. */
  heartbeatTimeouts: number;
  dropped: number;
  messagesIn: number;
  messagesOut: number;
};

const DEFAULT_MAX_MESSAGE_SIZE = 8 * 1024 * 1024;

type Dialer = { endpoint: string; backoff: Backoff; timer?: ReturnType<typeof setTimeout>; conn?: Connection; socket?: Socket };

export abstract class ZmtpSocket {
  readonly counters: SocketCounters = {
    accepted: 0, connects: 0, reconnects: 0, disconnects: 0, protocolErrors: 0, oversize: 0, heartbeatTimeouts: 0, dropped: 0, messagesIn: 0, messagesOut: 0,
  };
  protected readonly peers = new Set<Connection>();
  /** Every live connection, handshaken or not: close() must end those still mid-handshake too. */
  private readonly conns = new Set<Connection>();
  protected readonly log: Logger;
  private readonly servers: Server[] = [];
  private readonly dialers: Dialer[] = [];
  private closing = false;
  private paused = false;
  private readonly connHandler: ConnectionHandler;

  protected constructor(protected readonly type: SocketType, protected readonly opts: SocketOptions = {}) {
    this.log = childLogger(opts.logger, { component: `zmtp-${type.toLowerCase()}` });
    this.connHandler = {
      ready: (c) => {
        this.peers.add(c);
        if (this.paused) c.socket.pause();
        this.onPeerReady(c);
      },
      message: (c, frames) => {
        this.counters.messagesIn++;
        this.received(c, frames);
      },
      command: (c, name, data) => this.onCommand(c, name, data),
      closed: (c, reason) => this.onConnectionClosed(c, reason),
    };
  }

  /** Peers that completed the handshake. */
  get peerCount(): number {
    return this.peers.size;
  }

  /** Binds and returns the actual endpoint (port 0 / "*" resolved). */
  async bind(endpoint: string): Promise<string> {
    const { host, port } = parseEndpoint(endpoint);
    const server = createServer((sock) => {
      if (this.closing) return void sock.destroy();
      this.counters.accepted++;
      this.attach(sock, true);
    });
    await new Promise<void>((resolve, reject) => {
      server.once("error", reject);
      server.listen(port, host, () => {
        server.off("error", reject);
        resolve();
      });
    });
    server.on("error", (e) => this.log.warn({ err: e.message }, "listener error"));
    this.servers.push(server);
    const addr = server.address();
    const actualPort = typeof addr === "object" && addr ? addr.port : port;
    return formatEndpoint(host, actualPort);
  }

  /** Connects (and keeps reconnecting) to one peer endpoint. */
  connect(endpoint: string): void {
    parseEndpoint(endpoint); // validate eagerly
    // Jitter (±20%) so many listeners do not reconnect in lockstep after a publisher restart.
    const backoff = new Backoff({ initialMs: this.opts.reconnectMinMs ?? 100, maxMs: this.opts.reconnectMaxMs ?? 5000, jitter: 0.2 });
    const d: Dialer = { endpoint, backoff };
    this.dialers.push(d);
    this.dial(d);
  }

  /** Run once close() starts (used to end async iterators). */
  protected readonly closeHooks: (() => void)[] = [];

  /** True while reading is paused (pause() or an iterator at its high-water mark). */
  get isPaused(): boolean {
    return this.paused;
  }

  get isClosed(): boolean {
    return this.closing;
  }

  async close(): Promise<void> {
    if (this.closing) return;
    this.closing = true;
    for (const h of this.closeHooks) h();
    for (const d of this.dialers) {
      clearTimeout(d.timer);
      d.socket?.destroy();
    }
    for (const c of [...this.conns]) c.close();
    await Promise.all(this.servers.map((s) => new Promise<void>((r) => s.close(() => r()))));
  }

  protected abstract onPeerReady(c: Connection): void;
  protected abstract received(c: Connection, frames: Buffer[]): void;
  protected onCommand(_c: Connection, _name: string, _data: Buffer): void {}
  protected onPeerGone(_c: Connection): void {}

  /** Stops reading from every peer (explicit back-pressure: TCP windows fill, the sender's HWM drops). */
  pause(): void {
    this.paused = true;
    for (const c of this.peers) c.socket.pause();
  }

  resume(): void {
    this.paused = false;
    for (const c of this.peers) c.socket.resume();
  }

  private attach(sock: Socket, asServer: boolean): Connection {
    const conn = new Connection(sock, {
      socketType: this.type,
      identity: this.opts.identity ?? (this.type === "ROUTER" || this.type === "DEALER" ? new Uint8Array(0) : undefined),
      maxMessageSize: this.opts.maxMessageSize ?? DEFAULT_MAX_MESSAGE_SIZE,
      hwm: this.opts.hwm ?? 10_000,
      minor: this.opts.zmtpMinor ?? 1,
      asServer,
      handshakeTimeoutMs: this.opts.handshakeTimeoutMs ?? 10_000,
      heartbeat: this.opts.heartbeat,
    }, this.connHandler);
    this.conns.add(conn);
    return conn;
  }

  private dial(d: Dialer): void {
    if (this.closing) return;
    const { host, port } = parseEndpoint(d.endpoint);
    const sock = createConnection({ host, port });
    d.socket = sock;
    let conn: Connection | undefined;
    let failed = false;
    const onConnectError = () => {
      if (conn || failed) return;
      failed = true;
      clearTimeout(connectTimer);
      sock.destroy();
      this.scheduleDial(d);
    };
    sock.once("error", onConnectError);
    // A SYN nobody answers (a host gone, a blackholed pod IP) would hold this dial for the kernel's
    // retry budget (~2 min): it is given up after the handshake timeout and redialed on the backoff.
    const connectTimer = setTimeout(onConnectError, this.opts.handshakeTimeoutMs ?? 10_000);
    connectTimer.unref?.();
    sock.once("connect", () => {
      clearTimeout(connectTimer);
      if (failed) return;
      sock.off("error", onConnectError);
      if (this.closing) return void sock.destroy();
      this.counters.connects++;
      conn = this.attach(sock, false);
      d.conn = conn;
    });
  }

  private scheduleDial(d: Dialer): void {
    if (this.closing) return;
    this.counters.reconnects++;
    d.timer = setTimeout(() => this.dial(d), d.backoff.next());
    d.timer.unref?.();
  }

  private onConnectionClosed(c: Connection, reason: CloseReason): void {
    this.conns.delete(c);
    const wasPeer = this.peers.delete(c);
    if (reason.kind === "protocol") this.counters.protocolErrors++;
    if (reason.kind === "oversize") this.counters.oversize++;
    if (reason.kind === "heartbeat") this.counters.heartbeatTimeouts++;
    if (reason.kind === "protocol" || reason.kind === "oversize" || reason.kind === "heartbeat") {
      this.log.warn({ peer: c.peer, reason: reason.detail }, "closing ZMTP connection");
    }
    if (wasPeer) {
      this.counters.disconnects++;
      this.onPeerGone(c);
    }
    const d = this.dialers.find((x) => x.conn === c);
    if (d) {
      d.conn = undefined;
      if (wasPeer) d.backoff.reset();
      this.scheduleDial(d);
    }
  }
}
