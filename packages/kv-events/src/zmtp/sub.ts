// SUB: connects to publishers, (re)sends its subscriptions on every new session in the form
// the peer speaks (3.1 SUBSCRIBE command, or 3.0 0x01+prefix message), filters by prefix too.
import { ZmtpSocket, type SocketOptions } from "./base.ts";
import type { Connection } from "./connection.ts";
import { encodeCommand, encodeMessage } from "./wire.ts";

export type MessageHandler = (frames: Buffer[]) => void;

export class SubSocket extends ZmtpSocket {
  private readonly prefixes = new Map<string, Buffer>();
  private messageHandler: MessageHandler = () => {};
  private peerHandler: (up: boolean, peer: string) => void = () => {};

  constructor(opts: SocketOptions = {}) {
    super("SUB", opts);
  }

  /** Receives every matching message (callback style; the handler runs synchronously per message). */
  onMessage(h: MessageHandler): void {
    this.messageHandler = h;
  }

  /**
   * Async-iterator style: messages queue up to `highWaterMark`, then reading from the publishers
   * pauses until the consumer catches up (explicit back-pressure; the publisher's HWM then drops).
   * Replaces any onMessage handler. Ends when the socket is closed.
   */
  messages(opts: { highWaterMark?: number } = {}): AsyncIterableIterator<Buffer[]> {
    const hwm = opts.highWaterMark ?? 1000;
    const queue: Buffer[][] = [];
    let wake: (() => void) | undefined;
    this.onMessage((frames) => {
      queue.push(frames);
      if (queue.length >= hwm) this.pause();
      wake?.();
    });
    this.closeHooks.push(() => wake?.());
    const self = this;
    return (async function* () {
      for (;;) {
        const m = queue.shift();
        if (m) {
          if (queue.length < hwm / 2) self.resume();
          yield m;
          continue;
        }
        if (self.isClosed) return;
        await new Promise<void>((r) => (wake = r));
        wake = undefined;
      }
    })();
  }

  /** Told when a publisher session comes up (handshake done) or goes away. */
  onPeer(h: (up: boolean, peer: string) => void): void {
    this.peerHandler = h;
  }

  subscribe(prefix: Uint8Array | string = ""): void {
    const p = Buffer.from(prefix);
    const k = p.toString("latin1");
    if (this.prefixes.has(k)) return;
    this.prefixes.set(k, p);
    for (const c of this.peers) this.sendSubscription(c, p, true);
  }

  unsubscribe(prefix: Uint8Array | string = ""): void {
    const p = Buffer.from(prefix);
    if (!this.prefixes.delete(p.toString("latin1"))) return;
    for (const c of this.peers) this.sendSubscription(c, p, false);
  }

  protected onPeerReady(c: Connection): void {
    for (const p of this.prefixes.values()) this.sendSubscription(c, p, true);
    this.peerHandler(true, c.peer);
  }

  protected override onPeerGone(c: Connection): void {
    this.peerHandler(false, c.peer);
  }

  protected received(_c: Connection, frames: Buffer[]): void {
    if (!this.matches(frames[0]!)) return;
    this.messageHandler(frames);
  }

  /** 3.1 commands only when both sides speak 3.1; otherwise the 3.0 message form. */
  private sendSubscription(c: Connection, prefix: Buffer, subscribe: boolean): void {
    if (c.peerMinor >= 1 && (this.opts.zmtpMinor ?? 1) >= 1) {
      c.send(encodeCommand(subscribe ? "SUBSCRIBE" : "CANCEL", prefix));
    } else {
      const body = Buffer.allocUnsafe(prefix.length + 1);
      body[0] = subscribe ? 1 : 0;
      prefix.copy(body, 1);
      c.send(encodeMessage([body]));
    }
  }

  private matches(topic: Buffer): boolean {
    for (const p of this.prefixes.values()) {
      if (p.length === 0) return true;
      if (p.length <= topic.length && topic.compare(p, 0, p.length, 0, p.length) === 0) return true;
    }
    return false;
  }
}

