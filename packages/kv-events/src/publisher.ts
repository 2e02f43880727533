// What a vLLM worker does with its KV events: a PUB socket sending [topic, seq (8 B BE), payload]
// with seq from 0, +1 per batch, and optionally a ROUTER answering replay requests from a
// bounded buffer of the most recent batches.
import { encodeBatch, type EncodeOptions } from "./codec/encode.ts";
import type { KvEventBatch } from "./codec/types.ts";
import { childLogger, type Logger } from "./logger.ts";
import { END_SEQ, encodeSeq, parseReplayRequest } from "./replay.ts";
import type { SocketOptions } from "./zmtp/base.ts";
import { PubSocket } from "./zmtp/pub.ts";
import { RouterSocket } from "./zmtp/router.ts";

export type PublisherOptions = {
  /** PUB endpoint, e.g. "tcp://*:5557" (port 0 picks a free port; see .endpoint). */
  endpoint: string;
  /** The PUB connects to `endpoint` instead of binding it, as vLLM's does when its endpoint is not a wildcard. */
  connect?: boolean;
  replayEndpoint?: string;
  topic?: string;
  /** Batches kept for replay (vLLM's buffer_steps; default 10000). */
  replayBuffer?: number;
  /** Replies as ["", topic, seq, payload] (newer vLLM, default) or ["", seq, payload]. */
  replayWithTopic?: boolean;
  /** Default payload encoding for publish(). */
  encoding?: EncodeOptions["encoding"];
  hashMode?: EncodeOptions["hashMode"];
  socket?: SocketOptions;
  logger?: Logger;
};

export type PublishOptions = EncodeOptions & {
  /** Fault injection: keep the batch for replay but do not send it (a message lost on the wire). */
  drop?: boolean;
};

type Buffered = { seq: bigint; payload: Uint8Array };

export class KvEventPublisher {
  private seq = 0n;
  private readonly ring: (Buffered | undefined)[];
  private ringNext = 0;
  private readonly topic: Buffer;
  private readonly log: Logger;
  /** Replay requests answered, and malformed ones ignored. */
  readonly replayCounters = { requests: 0, malformed: 0, batchesSent: 0 };

  private constructor(
    private readonly opts: PublisherOptions,
    private readonly pub: PubSocket,
    private readonly router: RouterSocket | undefined,
    /** The bound PUB endpoint (port resolved), or the one it connects to. */
    readonly endpoint: string,
    readonly replayEndpoint: string | undefined,
  ) {
    this.topic = Buffer.from(opts.topic ?? "", "utf8");
    this.ring = new Array(opts.replayBuffer ?? 10_000);
    this.log = childLogger(opts.logger, { component: "kv-publisher" });
    router?.onMessage((frames) => this.serveReplay(frames));
  }

  static async bind(opts: PublisherOptions): Promise<KvEventPublisher> {
    const pub = new PubSocket({ logger: opts.logger, ...opts.socket });
    let endpoint = opts.endpoint;
    if (opts.connect) pub.connect(endpoint);
    else endpoint = await pub.bind(endpoint);
    let router: RouterSocket | undefined;
    let replayEndpoint: string | undefined;
    if (opts.replayEndpoint) {
      router = new RouterSocket({ logger: opts.logger, ...opts.socket });
      try {
        replayEndpoint = await router.bind(opts.replayEndpoint);
      } catch (e) {
        await pub.close();
        throw e;
      }
    }
    return new KvEventPublisher(opts, pub, router, endpoint, replayEndpoint);
  }

  /** The seq the next publish() will use. */
  get nextSeq(): bigint {
    return this.seq;
  }

  get subscriberCount(): number {
    return this.pub.subscriberCount;
  }

  /** Subscribers whose subscription covers this publisher's topic: what it publishes now reaches them. */
  get subscribedCount(): number {
    return this.pub.subscribedTo(this.topic);
  }

  get counters() {
    return this.pub.counters;
  }

  /** Encodes and publishes one batch; returns its seq. */
  publish(batch: KvEventBatch, opts?: PublishOptions): bigint {
    return this.publishPayload(
      encodeBatch(batch, { encoding: opts?.encoding ?? this.opts.encoding, hashMode: opts?.hashMode ?? this.opts.hashMode }),
      opts,
    );
  }

  /** Publishes an already-encoded payload (any bytes: tests use this for malformed input). */
  publishPayload(payload: Uint8Array, opts?: { drop?: boolean }): bigint {
    const seq = this.seq++;
    if (!opts?.drop) this.pub.send([this.topic, encodeSeq(seq), payload]);
    if (this.ring.length > 0) {
      this.ring[this.ringNext] = { seq, payload };
      this.ringNext = (this.ringNext + 1) % this.ring.length;
    }
    return seq;
  }

  /**
   * Fault injection: burns `count` seq numbers that are never published nor kept for replay,
   * so listeners see a gap no replay can cover.
   */
  skipSeq(count: number): void {
    this.seq += BigInt(count);
  }

  async close(): Promise<void> {
    await Promise.all([this.pub.close(), this.router?.close()]);
  }

  private serveReplay(frames: Buffer[]): void {
    const req = parseReplayRequest(frames);
    if (!req || !this.router) {
      // Counted and ignored; logged the first time only (a misbehaving client would flood the log).
      if (this.replayCounters.malformed++ === 0) this.log.warn({ bytes: frames.reduce((n, f) => n + f.length, 0) }, "malformed replay request ignored");
      return;
    }
    this.replayCounters.requests++;
    const withTopic = this.opts.replayWithTopic ?? true;
    const empty = Buffer.alloc(0);
    const n = this.ring.length;
    let sent = 0;
    for (let i = 0; i < n; i++) {
      const b = this.ring[(this.ringNext + i) % n];
      if (!b || b.seq < req.start) continue;
      const seqB = encodeSeq(b.seq);
      this.router.send(withTopic ? [req.id, empty, this.topic, seqB, b.payload] : [req.id, empty, seqB, b.payload]);
      sent++;
    }
    this.router.send(withTopic ? [req.id, empty, this.topic, END_SEQ, empty] : [req.id, empty, END_SEQ, empty]);
    this.replayCounters.batchesSent += sent;
    this.log.debug({ seq: req.start.toString(), events: sent }, "replay served");
  }
}
