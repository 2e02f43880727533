// ROUTER: every inbound message is prefixed with the sending peer's routing id; send() takes
// [id, ...frames] and routes to that peer (unknown ids are dropped, as libzmq does by default).
import { ZmtpSocket, type SocketOptions } from "./base.ts";
import type { Connection } from "./connection.ts";
import { encodeMessage } from "./wire.ts";

export class RouterSocket extends ZmtpSocket {
  private readonly byId = new Map<string, Connection>();
  private readonly idOf = new Map<Connection, Buffer>();
  private nextId = 0x4000_0000; // generated ids: 0x00 + u32, as libzmq does
  private messageHandler: (frames: Buffer[]) => void = () => {};

  constructor(opts: SocketOptions = {}) {
    super("ROUTER", opts);
  }

  onMessage(h: (frames: Buffer[]) => void): void {
    this.messageHandler = h;
  }

  /** frames[0] is the peer's routing id. Returns false when the peer is unknown or at its HWM. */
  send(frames: readonly Uint8Array[]): boolean {
    const c = frames.length > 1 ? this.byId.get(Buffer.from(frames[0]!).toString("latin1")) : undefined;
    if (!c) return false;
    const ok = c.send(encodeMessage(frames.slice(1)));
    if (ok) this.counters.messagesOut++;
    else this.counters.dropped++;
    return ok;
  }

  protected onPeerReady(c: Connection): void {
    let id = c.peerIdentity;
    if (!id || this.byId.has(id.toString("latin1"))) {
      id = Buffer.alloc(5);
      id.writeUInt32BE(this.nextId++ >>> 0, 1);
    }
    this.byId.set(id.toString("latin1"), c);
    this.idOf.set(c, id);
  }

  protected override onPeerGone(c: Connection): void {
    const id = this.idOf.get(c);
    if (id) this.byId.delete(id.toString("latin1"));
    this.idOf.delete(c);
  }

  protected received(c: Connection, frames: Buffer[]): void {
    const id = this.idOf.get(c);
    if (id) this.messageHandler([id, ...frames]);
  }
}
