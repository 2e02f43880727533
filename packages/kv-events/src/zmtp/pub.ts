// PUB: fan-out to every subscriber whose subscriptions prefix-match the first frame.
// Accepts subscriptions both as ZMTP 3.0 messages (0x01/0x00 + prefix) and as ZMTP 3.1
// SUBSCRIBE/CANCEL commands. A slow subscriber loses messages at its HWM; send() never blocks.
import { ZmtpSocket, type SocketOptions } from "./base.ts";
import type { Connection } from "./connection.ts";
import { encodeMessage } from "./wire.ts";

/** Distinct prefixes per subscriber: every send() tests each, and vLLM's listeners use one. */
const MAX_PREFIXES = 1024;
/**
 * Bytes of distinct prefixes per subscriber, and so the largest message a subscriber may send (it
 * only sends subscriptions). Topics here are a few bytes; without a bound, 1024 prefixes of 400 KB
 * on one connection held ~850 MB (each kept twice: bytes and map key).
 */
export const MAX_SUBSCRIPTION_BYTES = 64 * 1024;

/** Subscription prefixes of one subscriber, counted (a prefix subscribed twice needs two cancels). */
class Subscriptions {
  private readonly counts = new Map<string, number>();
  prefixes: Buffer[] = [];
  private bytes = 0;
  /** Why `p` is refused (the subscriber is over a bound), else undefined once it is added. */
  add(p: Buffer): string | undefined {
    const k = p.toString("latin1");
    const n = this.counts.get(k) ?? 0;
    if (n === 0 && this.prefixes.length >= MAX_PREFIXES) return `more than ${MAX_PREFIXES} subscriptions`;
    if (n === 0 && this.bytes + p.length > MAX_SUBSCRIPTION_BYTES) return `subscriptions over ${MAX_SUBSCRIPTION_BYTES} bytes`;
    this.counts.set(k, n + 1);
    if (n === 0) {
      this.prefixes.push(Buffer.from(p));
      this.bytes += p.length;
    }
    return undefined;
  }
  remove(p: Buffer): void {
    const k = p.toString("latin1");
    const n = this.counts.get(k);
    if (n === undefined) return;
    if (n > 1) return void this.counts.set(k, n - 1);
    this.counts.delete(k);
    this.bytes -= p.length;
    this.prefixes = this.prefixes.filter((x) => !x.equals(p));
  }
  matches(topic: Uint8Array): boolean {
    for (const p of this.prefixes) {
      if (p.length === 0) return true;
      if (p.length > topic.length) continue;
      let i = 0;
      while (i < p.length && p[i] === topic[i]) i++;
      if (i === p.length) return true;
    }
    return false;
  }
}

export class PubSocket extends ZmtpSocket {
  private readonly subs = new Map<Connection, Subscriptions>();

  constructor(opts: SocketOptions = {}) {
    // What a subscriber sends is subscriptions: nothing larger than all of them together is read.
    super("PUB", { maxMessageSize: MAX_SUBSCRIPTION_BYTES + 16, ...opts });
  }

  /** Subscribers that completed the handshake. */
  get subscriberCount(): number {
    return this.subs.size;
  }

  /**
   * Subscribers whose subscriptions match `topic`: a message sent now with that first frame reaches
   * them (a subscriber's SUBSCRIBE arrives after its handshake, so it may be counted above and not here).
   */
  subscribedTo(topic: Uint8Array = new Uint8Array(0)): number {
    let n = 0;
    for (const s of this.subs.values()) if (s.matches(topic)) n++;
    return n;
  }

  /** The longest user-space send queue over subscribers (a publisher can pace itself on it). */
  get maxQueued(): number {
    let m = 0;
    for (const c of this.subs.keys()) if (c.queued > m) m = c.queued;
    return m;
  }

  /** Sends one multipart message to every matching subscriber. Returns how many got it queued. */
  send(frames: readonly Uint8Array[]): number {
    if (this.subs.size === 0 || frames.length === 0) return 0;
    const topic = frames[0]!;
    let encoded: Buffer | undefined;
    let n = 0;
    for (const [c, s] of this.subs) {
      if (!s.matches(topic)) continue;
      encoded ??= encodeMessage(frames);
      if (c.send(encoded)) {
        n++;
        this.counters.messagesOut++;
      } else this.counters.dropped++;
    }
    return n;
  }

  protected onPeerReady(c: Connection): void {
    this.subs.set(c, new Subscriptions());
  }

  protected override onPeerGone(c: Connection): void {
    this.subs.delete(c);
  }

  protected received(c: Connection, frames: Buffer[]): void {
    // ZMTP 3.0 subscription form: a single-frame message 0x01|0x00 + prefix; anything else is ignored.
    const f = frames[0]!;
    if (frames.length !== 1 || f.length === 0) return;
    if (f[0] === 1) this.subscribe(c, f.subarray(1));
    else if (f[0] === 0) this.subs.get(c)?.remove(f.subarray(1));
  }

  protected override onCommand(c: Connection, name: string, data: Buffer): void {
    if (name === "SUBSCRIBE") this.subscribe(c, data);
    else if (name === "CANCEL") this.subs.get(c)?.remove(data);
  }

  private subscribe(c: Connection, prefix: Buffer): void {
    const s = this.subs.get(c);
    const refused = s?.add(prefix);
    if (refused) c.close({ kind: "protocol", detail: refused });
  }
}
