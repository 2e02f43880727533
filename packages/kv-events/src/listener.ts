// One listener per worker rank: subscribes to the worker's PUB, decodes batches, tracks seq
// and hands an ordered stream of signals to a sink (docs/CONTRACTS.md §4 consumer rules):
//  - the first message sets the baseline;
//  - a gap replays from the gap over the replay endpoint when one is configured, and falls back
//    to a reset ("gap-unrecovered") when the replay does not cover it;
//  - seq going backwards means the publisher restarted: reset ("restarted");
//  - the first batch ever, arriving on a connection that replaced an earlier one, may come from another
//    publisher process than the one subscribed to (nothing to compare it with): reset ("reconnected");
//  - the first batch of a listener attached before it ever connected is marked (connectedAfterAttach):
//    nothing on that connection predates what the sink held at attach;
//  - malformed messages are counted and skipped; a batch that cannot be decoded is a hole in the stream like
//    a gap (its stores and removes are lost): replayed by its seq when possible, else a reset ("gap-unrecovered").
// Signals produced before a sink is attached are buffered (bounded; overflow → reset "overflow"),
// so a consumer can subscribe first and attach after recovering a snapshot.
import { DEFAULT_KV_MAX_MESSAGE_SIZE } from "./batch-bound.ts";
import { decodeBatch } from "./codec/decode.ts";
import type { DecodeStats, DropReason, KvEventBatch } from "./codec/types.ts";
import { childLogger, type Logger } from "./logger.ts";
import { decodeSeqFrame, encodeSeq, parseReplayReply, topicEpoch } from "./replay.ts";
import type { SocketOptions } from "./zmtp/base.ts";
import { DealerSocket } from "./zmtp/dealer.ts";
import { SubSocket } from "./zmtp/sub.ts";
import type { Heartbeat } from "./zmtp/connection.ts";

export type ResetReason = "restarted" | "reconnected" | "gap-unrecovered" | "overflow";

export type ListenerSignal =
  /**
   * `epoch`: the publisher's lifetime id the batch came under, when its publisher sends one (a replayed batch
   * without its own takes the live stream's). `connectedAfterAttach`: the first batch of a listener whose
   * first connection came up after its sink was attached. A publisher sends a subscriber only what it
   * publishes once connected, so this stream holds nothing from before the sink's view was taken: a seq at
   * or below that view's is another process's.
   */
  | { kind: "batch"; seq: bigint; batch: KvEventBatch; epoch?: string; connectedAfterAttach?: true }
  | { kind: "reset"; reason: ResetReason };

export type ListenerOptions = {
  workerId: string;
  dpRank: number;
  endpoint: string;
  /**
   * Bind `endpoint` and let the publisher connect (vLLM connects its PUB instead of binding when its
   * endpoint is not a wildcard), instead of dialing it. See bound().
   */
  bind?: boolean;
  replayEndpoint?: string;
  topic?: string;
  /** Signals held while no sink is attached (default 50000). */
  maxBuffered?: number;
  /** How long a replay may take before the gap counts as unrecovered (default 2000 ms). */
  replayTimeoutMs?: number;
  socket?: SocketOptions;
  logger?: Logger;
  /** Told of each malformed message skipped (also counted in `counters.decodeErrors`). */
  onMalformed?: (kind: MalformedKind) => void;
  /** Told of events dropped from a batch that is otherwise applied, by reason (also in `counters`). */
  onDropped?: (reason: DropReason, events: number) => void;
  /** Told of fields (map keys, array positions) the decoder skipped as unknown: a newer producer (also in `counters.unknownFields`). */
  onUnknownFields?: (fields: number) => void;
};

/**
 * frames: not [topic, seq, payload] with an 8- or 24-byte seq, or a topic whose epoch marker has a bad epoch; payload:
 * not an event batch; replay: a bad replay reply.
 */
export type MalformedKind = "frames" | "payload" | "replay";

export type ListenerCounters = DecodeStats & {
  messages: number;
  batches: number;
  events: number;
  blocks: number;
  bytes: number;
  gaps: number;
  replays: number;
  replayedBatches: number;
  replayFailures: number;
  restarts: number;
  resets: number;
  overflows: number;
  decodeErrors: number;
  /** Exceptions thrown by the attached sink (counted, not propagated). */
  sinkErrors: number;
};

/**
 * `epoch`: the publisher's lifetime id when its seq frame or topic carries one (replay.ts: decodeSeqFrame, topicEpoch),
 * else null.
 * `first`: held during a replay as the first message of a new connection (it may come from another process).
 */
type Held = { seq: bigint; epoch: string | null; payload: Buffer; first?: true };

type SeqState =
  | { kind: "fresh" }
  | { kind: "live"; next: bigint }
  /**
   * Covers [from, to): a gap up to the first held message, or one batch that could not be decoded.
   * `check`: the batch before the gap, as applied; a replay asked from its seq must return it unchanged,
   * or the publisher is another process than before (a restart that got past our seq while we reconnected).
   */
  | { kind: "replaying"; from: bigint; to: bigint; held: Held[]; got: Held[]; timer: ReturnType<typeof setTimeout>; check?: Held };

const MAX_HELD = 100_000;

/** A listener's heartbeat for a PING interval: the publisher is dropped after three silent intervals. */
export function listenerHeartbeat(intervalMs: number): Heartbeat {
  return { intervalMs, timeoutMs: 3 * intervalMs };
}

/**
 * A publisher that went away without closing the connection is found within ~20 s (PING every 5 s,
 * closed after 15 s of silence): the listener redials, and the seq gap on the new connection goes
 * through replay or a reset.
 */
export const LISTENER_HEARTBEAT = listenerHeartbeat(5000);

export class KvEventListener {
  readonly counters: ListenerCounters = {
    messages: 0, batches: 0, events: 0, blocks: 0, bytes: 0, gaps: 0, replays: 0, replayedBatches: 0,
    replayFailures: 0, restarts: 0, resets: 0, overflows: 0, decodeErrors: 0, sinkErrors: 0, skippedEvents: 0, unknownTypes: 0,
    malformedEvents: 0, unknownFields: 0,
  };
  private state: SeqState = { kind: "fresh" };
  private sub: SubSocket | undefined;
  private dealer: DealerSocket | undefined;
  private sink: ((s: ListenerSignal) => void) | undefined;
  private buffered: ListenerSignal[] = [];
  private closed = false;
  /** The last batch delivered, and whether a connection came up since: see onSequenced. */
  private last: Held | undefined;
  private reconnected = false;
  /** Connections that came up so far (a second one may be to another publisher process). */
  private connections = 0;
  private binding: Promise<string> | undefined;
  private streamEpoch: string | null = null;
  /** Attached before any connection came up: the first batch delivered is marked (connectedAfterAttach). */
  private markFirstBatch = false;
  /** Causes already logged: a publisher sending garbage would flood the log. */
  private readonly logged = new Set<string>();
  private readonly log: Logger;

  constructor(readonly opts: ListenerOptions) {
    this.log = childLogger(opts.logger, { component: "kv-listener", worker: opts.workerId, rank: opts.dpRank });
  }

  get connected(): boolean {
    return (this.sub?.peerCount ?? 0) > 0;
  }

  /** The seq expected next, or null before the baseline message. */
  get nextSeq(): bigint | null {
    return this.state.kind === "live" ? this.state.next : this.state.kind === "replaying" ? this.state.from : null;
  }

  /** Signals waiting for a sink. */
  get bufferedCount(): number {
    return this.buffered.length;
  }

  /** Socket-level counters of the subscription (reconnects, protocol errors, oversize...). */
  get socketCounters() {
    return this.sub?.counters;
  }

  /** A KV batch can be far larger than a generic socket's default (batch-bound.ts). */
  private get maxMessageSize(): number {
    return this.opts.socket?.maxMessageSize ?? DEFAULT_KV_MAX_MESSAGE_SIZE;
  }

  start(): void {
    if (this.sub || this.closed) return;
    const sub = new SubSocket({ logger: this.opts.logger, heartbeat: LISTENER_HEARTBEAT, ...this.opts.socket, maxMessageSize: this.maxMessageSize });
    sub.onMessage((frames) => this.onMessage(frames));
    sub.onPeer((up, peer) => {
      if (up) {
        this.reconnected = true;
        this.connections++;
      }
      this.log.info({ peer }, up ? "publisher connected" : "publisher disconnected");
    });
    sub.subscribe(this.opts.topic ?? "");
    this.sub = sub;
    if (!this.opts.bind) {
      sub.connect(this.opts.endpoint);
      return;
    }
    this.binding = sub.bind(this.opts.endpoint);
    this.binding.then(
      (ep) => this.log.info({ endpoint: ep }, "bound for a publisher to connect"),
      (err) => this.log.error({ endpoint: this.opts.endpoint, err: String(err) }, "cannot bind the KV event endpoint: no publisher can connect"),
    );
  }

  /** In bind mode, the endpoint bound (port 0 resolved); rejects when the bind failed. */
  bound(): Promise<string> {
    return this.binding ?? Promise.reject(new Error("the listener does not bind (or has not started)"));
  }

  /** Attaches the consumer; buffered signals are delivered first, in order. */
  attach(sink: (s: ListenerSignal) => void): void {
    this.sink = sink;
    this.markFirstBatch = this.connections === 0;
    const pending = this.buffered;
    this.buffered = [];
    // Through emit: a sink that throws on one signal is counted and the rest still arrive.
    for (const s of pending) this.emit(s);
  }

  async close(): Promise<void> {
    this.closed = true;
    if (this.state.kind === "replaying") clearTimeout(this.state.timer);
    await Promise.all([this.sub?.close(), this.dealer?.close()]);
  }

  private onMessage(frames: Buffer[]): void {
    this.counters.messages++;
    // [topic, seq, payload]; tolerate a missing topic frame ([seq, payload]).
    const n = frames.length;
    const f = n === 3 || n === 2 ? decodeSeqFrame(frames[n - 2]!) : undefined;
    if (f === undefined) return this.malformed("frames", `${n} frames, or a seq frame that is neither 8 nor 24 bytes`);
    // The epoch rides in the seq frame (vLLM's 24-byte form) or in the topic (SGLang's).
    const epoch = f.epoch ?? (n === 3 ? topicEpoch(frames[0]!) : null);
    if (epoch === undefined) return this.malformed("frames", "a topic whose epoch marker has an empty, overlong or non-UTF-8 epoch");
    const payload = frames[n - 1]!;
    this.counters.bytes += payload.length;
    this.onSequenced({ seq: f.seq, epoch, payload });
  }

  /** The publisher's epoch (its lifetime id) when its frames carry one; null: they do not (vLLM today, SGLang without snapshots). */
  get epoch(): string | null {
    return this.streamEpoch;
  }

  private onSequenced(m: Held): void {
    const knownEpoch = this.streamEpoch;
    if (m.epoch !== null && this.epochChanged(m)) {
      // Another publisher process: what we hold is gone, whatever its seq says. No replay can tell more.
      this.counters.restarts++;
      this.log.warn({ seq: m.seq.toString(), epoch: m.epoch }, "publisher restarted (new epoch)");
      this.reset("restarted");
      this.reconnected = false;
      return this.deliver(m);
    }
    const st = this.state;
    // Only the first message of a new connection can come from another publisher process; under the
    // epoch already followed, it is not.
    const firstOfConnection = this.reconnected && !(m.epoch !== null && m.epoch === knownEpoch);
    this.reconnected = false;
    switch (st.kind) {
      case "fresh":
        // Subscribed, then the connection went before any batch came: the publisher may have restarted
        // meanwhile (vLLM has no incarnation id), so a view of its stream from before (a peer's recovered
        // cursor) cannot be matched against this seq here. The reset says so, and the consumer decides: a
        // view without an epoch goes at the reset; one with an epoch waits for the batch that follows it,
        // this one, and stays under the same epoch, else goes.
        if (firstOfConnection && this.connections > 1) {
          this.log.warn({ seq: m.seq.toString(), epoch: m.epoch, connections: this.connections }, "first batch after a reconnect: publisher possibly restarted, the consumer decides by this batch's epoch");
          this.reset("reconnected");
        }
        return this.deliver(m);
      case "replaying":
        if (st.held.length >= MAX_HELD) {
          // Given up on the replay; this message then goes the normal way, after the held ones.
          this.finishReplay(false);
          return this.resequence(firstOfConnection ? { ...m, first: true } : m);
        }
        st.held.push(firstOfConnection ? { ...m, first: true } : m);
        return;
      case "live":
        if (m.seq === st.next) {
          // A new connection that resumes exactly where we stopped may still be another process: a restarted
          // publisher that had already published as many batches as we had seen. With a replay endpoint the
          // batch applied last tells them apart (the same process replays it byte for byte); without one
          // this stays ambiguous and the batch is taken as the next (vLLM has no incarnation id).
          if (firstOfConnection && this.last && this.opts.replayEndpoint && !this.closed) return this.startReplay(this.last.seq, m.seq, m, this.last);
          return this.deliver(m);
        }
        if (m.seq < st.next) {
          this.counters.restarts++;
          this.log.warn({ seq: m.seq.toString() }, "publisher restarted (seq went backwards)");
          this.reset("restarted");
          return this.deliver(m);
        }
        this.counters.gaps++;
        this.log.warn({ seq: st.next.toString(), events: Number(m.seq - st.next) }, "seq gap");
        // vLLM has no publisher incarnation id: after a reconnect, a restarted publisher that already got
        // past our seq looks like a gap, and its own replay buffer would "cover" it. Asking from the batch we
        // applied last tells them apart: the same process replays it byte for byte, a new one does not.
        if (this.opts.replayEndpoint && !this.closed) return this.startReplay(firstOfConnection && this.last ? this.last.seq : st.next, m.seq, m, firstOfConnection ? this.last : undefined);
        this.reset("gap-unrecovered");
        return this.deliver(m);
    }
  }

  /** Records `m`'s epoch; true when a stream was followed under another one (dropping a replay under way). */
  private epochChanged(m: Held): boolean {
    const before = this.streamEpoch;
    this.streamEpoch = m.epoch;
    if (before === null || before === m.epoch || this.state.kind === "fresh") return false;
    if (this.state.kind === "replaying") clearTimeout(this.state.timer);
    this.state = { kind: "fresh" };
    return true;
  }

  /** `replayed`: `m` came from a replay, so a batch that cannot be decoded is not asked for again. */
  private deliver(m: Held, replayed = false): void {
    this.state = { kind: "live", next: m.seq + 1n };
    this.last = m;
    let batch: KvEventBatch;
    const c = this.counters;
    const [unknownTypes, malformedEvents, unknownFields] = [c.unknownTypes, c.malformedEvents, c.unknownFields];
    try {
      batch = decodeBatch(m.payload, c);
    } catch (e) {
      this.malformed("payload", String(e), m.seq);
      return this.lost(m.seq, replayed);
    }
    if (c.unknownTypes !== unknownTypes) this.tell(() => this.opts.onDropped?.("unknown_type", c.unknownTypes - unknownTypes));
    if (c.malformedEvents !== malformedEvents) this.tell(() => this.opts.onDropped?.("malformed", c.malformedEvents - malformedEvents));
    if (c.unknownFields !== unknownFields) this.tell(() => this.opts.onUnknownFields?.(c.unknownFields - unknownFields));
    this.counters.batches++;
    this.counters.events += batch.events.length;
    for (const e of batch.events) if (e.type === "BlockStored") this.counters.blocks += e.blockHashes.length;
    const epoch = m.epoch ?? (replayed ? this.streamEpoch : null);
    const s = { kind: "batch" as const, seq: m.seq, batch, ...(epoch !== null && { epoch }) };
    if (this.markFirstBatch) {
      this.markFirstBatch = false;
      return this.emit({ ...s, connectedAfterAttach: true });
    }
    this.emit(s);
  }

  /**
   * A batch that arrived but could not be decoded: its stores and removes never reach the view, a hole as
   * a gap is. Asked again by its seq (the replay path of gaps); when that cannot be done, or it comes back
   * undecodable too, the rank resets as for a gap nobody could fill.
   */
  private lost(seq: bigint, replayed: boolean): void {
    this.counters.gaps++;
    if (!replayed && this.opts.replayEndpoint && !this.closed) return this.startReplay(seq, seq + 1n);
    this.warnOnce("lost", { seq: seq.toString() }, "a KV-event batch could not be decoded nor replayed: rank reset");
    this.reset("gap-unrecovered");
  }

  /** Calls a counting hook; a counter's failure is not the message's: the subscription goes on. */
  private tell(hook: () => void): void {
    try {
      hook();
    } catch {
      // counted by the caller; nothing to undo here
    }
  }

  /** Counted and skipped, never fatal; the first of each kind is logged. */
  private malformed(kind: MalformedKind, why: string, seq?: bigint): void {
    this.tell(() => this.opts.onMalformed?.(kind));
    this.counters.decodeErrors++;
    this.warnOnce(kind, { kind, err: why, seq: seq?.toString() }, "malformed KV-event message skipped");
  }

  private warnOnce(cause: string, fields: object, msg: string): void {
    if (this.logged.has(cause)) return;
    this.logged.add(cause);
    this.log.warn(fields, msg);
  }

  private reset(reason: ResetReason): void {
    this.counters.resets++;
    this.emit({ kind: "reset", reason });
  }

  private emit(s: ListenerSignal): void {
    if (this.sink) {
      try {
        return this.sink(s);
      } catch (e) {
        // The consumer's bug must not take the subscription down; count it and log the first.
        if (this.counters.sinkErrors++ === 0) this.log.error({ err: String(e) }, "KV-event sink threw");
        return;
      }
    }
    if (this.buffered.length >= (this.opts.maxBuffered ?? 50_000)) {
      // The consumer would miss these batches: it must drop this worker's blocks instead.
      this.counters.overflows++;
      this.buffered = [{ kind: "reset", reason: "overflow" }];
      if (s.kind === "reset") return;
    }
    this.buffered.push(s);
  }

  /** Asks for [from, to); `trigger`, the live message that showed the gap, waits behind the answer. */
  private startReplay(from: bigint, to: bigint, trigger?: Held, check?: Held): void {
    this.counters.replays++;
    if (!this.dealer) {
      this.dealer = new DealerSocket({ logger: this.opts.logger, ...this.opts.socket, maxMessageSize: this.maxMessageSize });
      this.dealer.onMessage((frames) => this.onReplayReply(frames));
      this.dealer.connect(this.opts.replayEndpoint!);
    }
    const timer = setTimeout(() => this.finishReplay(false), this.opts.replayTimeoutMs ?? 2000);
    timer.unref?.();
    this.state = { kind: "replaying", from, to, held: trigger ? [trigger] : [], got: [], timer, check };
    this.dealer.send([Buffer.alloc(0), encodeSeq(from)]);
  }

  private onReplayReply(frames: Buffer[]): void {
    const st = this.state;
    if (st.kind !== "replaying") return; // a late answer to an abandoned replay
    const r = parseReplayReply(frames);
    if (!r) return this.malformed("replay", "replay reply");
    if (r.kind === "end") return this.finishReplay(true);
    // Only the gap, in increasing order: what is kept is bounded by the gap however much is sent.
    const last = st.got.at(-1)?.seq;
    if (r.seq >= st.from && r.seq < st.to && (last === undefined || r.seq > last)) st.got.push({ seq: r.seq, epoch: r.epoch, payload: r.payload });
  }

  /** A held message through the normal path, as the first of its connection when it came as one. */
  private resequence(h: Held): void {
    if (h.first) this.reconnected = true;
    this.onSequenced(h);
  }

  /** Applies what the replay returned, then the messages held meanwhile. */
  private finishReplay(answered: boolean): void {
    const st = this.state;
    if (st.kind !== "replaying") return;
    clearTimeout(st.timer);
    const got = st.got;
    // Covered = the replay holds every seq of the hole.
    let covered = answered && got.length === Number(st.to - st.from);
    for (let i = 0; covered && i < got.length; i++) if (got[i]!.seq !== st.from + BigInt(i)) covered = false;
    const held = st.held;
    if (covered && st.check) {
      const same = got[0]!.payload.equals(st.check.payload);
      got.shift(); // already applied
      if (!same) {
        // Another publisher process: what we hold is gone, its stream starts over for us here.
        this.counters.restarts++;
        this.log.warn({ seq: st.check.seq.toString() }, "publisher restarted (a replayed batch differs from the one applied)");
        this.reset("restarted");
        this.state = { kind: "fresh" };
        // The stream starts over here: a held message's mark as a connection's first has told what it could.
        for (const h of held) this.onSequenced(h);
        return;
      }
    }
    if (covered) {
      this.counters.replayedBatches += got.length;
      // With a check, its batch (seq `from`) was applied already and shifted out above.
      this.state = { kind: "live", next: st.check ? st.from + 1n : st.from };
      for (const g of got) this.deliver(g, true);
    } else {
      if (!answered) {
        // Drop the session: a late answer to this request must not be read as the next one's.
        void this.dealer?.close();
        this.dealer = undefined;
      }
      this.counters.replayFailures++;
      this.log.warn({ seq: st.from.toString(), events: got.length }, "replay did not cover the gap");
      this.reset("gap-unrecovered");
      this.state = { kind: "fresh" };
    }
    // Held messages go through the normal path (a further gap among them replays again).
    for (let i = 0; i < held.length; i++) {
      const now = this.state as SeqState;
      if (now.kind === "replaying") {
        now.held.push(...held.slice(i));
        return;
      }
      // Held messages came live, in increasing order: one below what the replay delivered means the
      // publisher restarted meanwhile, which onSequenced reports as such.
      this.resequence(held[i]!);
    }
  }
}
