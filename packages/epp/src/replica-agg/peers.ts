// The receiving side of replica-agg: one SUB socket per peer (level-triggered: the peer source
// hands over the whole desired set, this reconciles toward it), each message decoded and applied to
// PeerLoads. A peer's load is dropped when its session ends, when it goes silent past the
// timeout, or when it leaves discovery.
import { SubSocket } from "@kv-epp/kv-events";
import type { Logger } from "pino";
import { AGG_TOPIC, AggDecodeError, decodeAggMessage, type AggMessage, type PeerLoads } from "@kv-epp/routing";

/** A peer's replica-agg endpoint; `id` names it in logs and state (its endpoint). */
export type AggPeer = { id: string; endpoint: string };

export type DropReason = "timeout" | "disconnected" | "removed";

export type SubscriberEvents = {
  received(m: AggMessage, bytes: number): void;
  sequence(kind: "gap" | "duplicate", n: number): void;
  dropped(reason: DropReason, requests: number): void;
  malformed(): void;
};

type Link = { sub: SubSocket; connected: boolean; warnedMalformed: boolean; removed: boolean };

export class AggSubscribers {
  private readonly links = new Map<string, Link>();
  private readonly timer: ReturnType<typeof setInterval>;

  constructor(
    private readonly opts: {
      state: PeerLoads;
      timeoutMs: number;
      log: Logger;
      events: SubscriberEvents;
      now?: () => number;
      /** Reconnect backoff cap (default 1000 ms): a restarted peer is followed again soon. */
      reconnectMaxMs?: number;
    },
  ) {
    // Sweeping at a quarter of the timeout bounds how late a silent peer is dropped.
    this.timer = setInterval(() => this.sweep(), Math.max(10, Math.floor(opts.timeoutMs / 4)));
    this.timer.unref?.();
  }

  reconcile(desired: readonly AggPeer[]): void {
    const want = new Map(desired.map((s) => [s.id, s]));
    for (const id of [...this.links.keys()]) if (!want.has(id)) this.remove(id);
    for (const s of desired) if (!this.links.has(s.id)) this.add(s);
  }

  /** Peers with a live session. */
  get connected(): number {
    let n = 0;
    for (const l of this.links.values()) if (l.connected) n++;
    return n;
  }

  get known(): number {
    return this.links.size;
  }

  async close(): Promise<void> {
    clearInterval(this.timer);
    for (const l of this.links.values()) l.removed = true; // shutting down: no "connection lost" per peer
    const subs = [...this.links.values()].map((l) => l.sub);
    this.links.clear();
    await Promise.allSettled(subs.map((s) => s.close()));
  }

  private now(): number {
    return (this.opts.now ?? Date.now)();
  }

  private add(s: AggPeer): void {
    const { state, log, events } = this.opts;
    const sub = new SubSocket({ logger: log, reconnectMaxMs: this.opts.reconnectMaxMs ?? 1000 });
    const link: Link = { sub, connected: false, warnedMalformed: false, removed: false };
    this.links.set(s.id, link);
    state.add(s.id);
    sub.subscribe(AGG_TOPIC);
    sub.onPeer((up) => {
      link.connected = up;
      if (link.removed) return; // its own drop was counted as "removed"
      if (up) {
        log.info({ peer: s.id }, "replica-agg: connected to peer");
        return;
      }
      const n = state.drop(s.id);
      events.dropped("disconnected", n);
      log.warn({ peer: s.id, requests: n }, "replica-agg: peer connection lost, its load dropped");
    });
    sub.onMessage((frames) => {
      const payload = frames[1];
      let m: AggMessage;
      try {
        if (frames.length !== 2 || !payload) throw new AggDecodeError(`expected 2 frames, got ${frames.length}`);
        m = decodeAggMessage(payload);
      } catch (err) {
        events.malformed();
        if (!link.warnedMalformed) log.warn({ peer: s.id, err: String(err) }, "replica-agg: malformed message skipped");
        link.warnedMalformed = true;
        return;
      }
      events.received(m, payload.length);
      const r = state.receive(s.id, m, this.now());
      switch (r.kind) {
        case "self":
          return;
        case "duplicate":
          events.sequence("duplicate", 1);
          return;
        case "applied":
          if (r.via === "gap") {
            events.sequence("gap", r.missed);
            log.warn({ peer: s.id, seq: m.seq, missed: r.missed }, "replica-agg: sequence gap, peer load approximate until its next snapshot");
          } else if (r.via === "restart") {
            log.info({ peer: s.id, replica: m.replica, previous: r.previous }, "replica-agg: peer restarted, its load starts from zero");
          } else if (r.via === "baseline") {
            log.info({ peer: s.id, replica: m.replica, seq: m.seq }, "replica-agg: following peer");
          }
      }
    });
    sub.connect(s.endpoint);
    log.info({ peer: s.id, endpoint: s.endpoint }, "replica-agg: peer added");
  }

  private remove(id: string): void {
    const link = this.links.get(id)!;
    this.links.delete(id);
    link.removed = true;
    const n = this.opts.state.remove(id);
    void link.sub.close();
    this.opts.events.dropped("removed", n);
    this.opts.log.info({ peer: id, requests: n }, "replica-agg: peer removed, its load dropped");
  }

  private sweep(): void {
    for (const d of this.opts.state.sweep(this.now(), this.opts.timeoutMs)) {
      this.opts.events.dropped("timeout", d.requests);
      this.opts.log.warn({ peer: d.peer, requests: d.requests, ms: d.silentMs }, "replica-agg: peer silent past the timeout, its load dropped");
    }
  }
}
