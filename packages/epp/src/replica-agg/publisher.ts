// The sending side of replica-agg: this replica's load changes, batched per event-loop turn, as delta
// messages on a PUB socket, and its whole active set as a snapshot every heartbeat. Subscribers that
// join late or lose messages are made exact again by the next snapshot; no back channel is needed.
import { PubSocket } from "@kv-epp/kv-events";
import type { Logger } from "pino";
import { AGG_TOPIC, AggOutbox, deltaParts, encodeAggMessage, opOf, type ActiveLoad, type AggMessage, type AggOp } from "@kv-epp/routing";

/** A fresh random replica id (64 bits, hex): a restarted process is a new replica to its peers. */
export function newReplicaId(): string {
  return Buffer.from(crypto.getRandomValues(new Uint8Array(8))).toString("hex");
}

const TOPIC = new TextEncoder().encode(AGG_TOPIC);

export class AggPublisher {
  private readonly outbox: AggOutbox;
  private pending: AggOp[] = [];
  private flushScheduled = false;
  private timer: ReturnType<typeof setInterval> | undefined;
  private closed = false;

  private constructor(
    private readonly pub: PubSocket,
    readonly endpoint: string,
    private readonly opts: { load: ActiveLoad; heartbeatMs: number; onSent: (m: AggMessage, bytes: number) => void },
    replica: string,
  ) {
    this.outbox = new AggOutbox(replica);
    opts.load.observe((c) => {
      // With no subscriber there is no one to tell: a joiner's first message is its baseline, and the next snapshot
      // makes it exact, whatever was not sent before it joined. Spares every pick's turn an encode and a send.
      if (this.closed || this.pub.subscriberCount === 0) return;
      this.pending.push(opOf(c));
      if (this.flushScheduled) return;
      this.flushScheduled = true;
      // One message per event-loop turn: a burst of picks costs one send, and the delay is sub-ms.
      setImmediate(() => this.flush());
    });
    this.timer = setInterval(() => this.heartbeat(), opts.heartbeatMs);
    this.timer.unref?.();
  }

  static async bind(o: {
    endpoint: string;
    replica: string;
    load: ActiveLoad;
    heartbeatMs: number;
    log: Logger;
    onSent?: (m: AggMessage, bytes: number) => void;
  }): Promise<AggPublisher> {
    const pub = new PubSocket({ logger: o.log });
    const endpoint = await pub.bind(o.endpoint);
    const p = new AggPublisher(pub, endpoint, { load: o.load, heartbeatMs: o.heartbeatMs, onSent: o.onSent ?? (() => {}) }, o.replica);
    p.heartbeat(); // a peer that is already connected hears of us at once
    return p;
  }

  get replica(): string {
    return this.outbox.replica;
  }

  get subscribers(): number {
    return this.pub.subscriberCount;
  }

  /** Subscriber connections closed for breaking ZMTP or going past the subscription bounds. */
  get refusedSubscribers(): number {
    return this.pub.counters.protocolErrors + this.pub.counters.oversize;
  }

  /** Sends pending deltas, then the whole active set. */
  heartbeat(): void {
    if (this.closed) return;
    this.flush();
    this.send(this.outbox.snapshot(this.opts.load));
  }

  private flush(): void {
    this.flushScheduled = false;
    if (this.pending.length === 0 || this.closed) return;
    const ops = this.pending;
    this.pending = [];
    for (const part of deltaParts(ops)) this.send(this.outbox.delta(part));
  }

  private send(m: AggMessage): void {
    const payload = encodeAggMessage(m);
    // A snapshot is sent (and numbered) even with no subscriber (deltas are not: see the constructor); a
    // subscriber's first message is its baseline.
    this.pub.send([TOPIC, payload]);
    this.opts.onSent(m, payload.length);
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    clearInterval(this.timer);
    await this.pub.close();
  }
}
