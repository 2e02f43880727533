// DEALER: round-robins outbound messages over its peers; messages sent before any peer is up
// wait in a bounded queue (the HWM), as libzmq's DEALER would block until a peer connects.
import { ZmtpSocket, type SocketOptions } from "./base.ts";
import type { Connection } from "./connection.ts";
import { encodeMessage } from "./wire.ts";

export class DealerSocket extends ZmtpSocket {
  private readonly ready: Connection[] = [];
  private next = 0;
  private pending: Buffer[] = [];
  private messageHandler: (frames: Buffer[]) => void = () => {};

  constructor(opts: SocketOptions = {}) {
    super("DEALER", opts);
  }

  onMessage(h: (frames: Buffer[]) => void): void {
    this.messageHandler = h;
  }

  /** Returns false when the message was dropped (no peer and the waiting queue is full). */
  send(frames: readonly Uint8Array[]): boolean {
    const msg = encodeMessage(frames);
    if (this.ready.length === 0) {
      if (this.pending.length >= (this.opts.hwm ?? 10_000)) {
        this.counters.dropped++;
        return false;
      }
      this.pending.push(msg);
      return true;
    }
    const c = this.ready[this.next++ % this.ready.length]!;
    const ok = c.send(msg);
    if (ok) this.counters.messagesOut++;
    else this.counters.dropped++;
    return ok;
  }

  protected onPeerReady(c: Connection): void {
    this.ready.push(c);
    const waiting = this.pending;
    this.pending = [];
    for (const m of waiting) c.send(m);
  }

  protected override onPeerGone(c: Connection): void {
    const i = this.ready.indexOf(c);
    if (i >= 0) this.ready.splice(i, 1);
  }

  protected received(_c: Connection, frames: Buffer[]): void {
    this.messageHandler(frames);
  }
}
