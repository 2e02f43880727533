import { KvEventPublisher, type EventEncoding, type ExtraKeyValue, type KvEvent } from "@kv-epp/kv-events";
import type { Logger } from "pino";
import type { CacheEvent } from "../cache/prefix-cache.ts";
import { engineKind } from "../config.ts";
import { GroupedEvents, type KvGroup } from "./kv-groups.ts";
import { BigramEvents } from "./spec-bigram.ts";

/**
 * Wire variants of newer engines: vLLM's partial prefix-cache entries, SGLang's EAGLE bigram token_ids,
 * and extra keys labelled by source as open vLLM PRs (#44706, #51899; not merged) would publish them.
 */
export type WireVariants = { partialEntries?: boolean; specBigram?: boolean; taggedExtraKeys?: boolean };

/**
 * The one place the mock worker touches the KV-event wire: turns a rank's cache changes into vLLM
 * KVEventBatches and publishes them on that rank's PUB socket (topic, 8-byte BE seq, msgpack payload)
 * with an optional replay ROUTER, and carries the fault switches tests use to break the stream.
 * `data_parallel_rank` is always set (0 without DP), as newer vLLM publishers do.
 */

export type EventStreamOptions = {
  rank: number;
  endpoint: string;
  /** The PUB connects to `endpoint` (an EPP that binds it) instead of binding it. */
  connect?: boolean;
  replayEndpoint?: string;
  replayBuffer: number;
  topic: string;
  encoding: EventEncoding;
  hashMode: "int" | "bytes";
  blockSize: number;
  /** Hybrid KV cache groups (`--kv-groups`): every change published once per group; absent: one untagged group. */
  kvGroups?: readonly KvGroup[];
  wire?: WireVariants;
  log: Logger;
  onPublished?: (events: number) => void;
  onError?: () => void;
};

export type EventStreamState = {
  rank: number;
  endpoint: string;
  replayEndpoint: string | null;
  /** Seq the next published batch will carry. */
  nextSeq: string;
  paused: boolean;
  restarts: number;
};

/**
 * A rank's cache changes as the events it publishes, without the socket: each change as vLLM's event,
 * once per KV group when the rank has groups (tests feed an index with them directly).
 */
export class RankEvents {
  private readonly grouped: GroupedEvents | undefined;
  private readonly bigram: BigramEvents | undefined;

  constructor(
    private readonly blockSize: number,
    encoding: EventEncoding,
    kvGroups?: readonly KvGroup[],
    wire: WireVariants = {},
  ) {
    this.grouped = kvGroups && kvGroups.length > 0 ? new GroupedEvents(kvGroups, blockSize, wire.partialEntries) : undefined;
    this.bigram = wire.specBigram ? new BigramEvents(blockSize) : undefined;
    this.tagged = wire.taggedExtraKeys === true;
    this.sglang = engineKind({ eventEncoding: encoding }) === "sglang";
  }

  private readonly tagged: boolean;
  private readonly sglang: boolean;

  of(changes: CacheEvent[]): KvEvent[] {
    const base = (ch: CacheEvent) => this.event(ch);
    if (this.bigram) return changes.flatMap((ch) => this.bigram!.of(ch, base(ch)) ?? []);
    return this.grouped ? changes.flatMap((ch) => this.grouped!.expand(ch, base)) : changes.map(base);
  }

  private event(ch: CacheEvent): KvEvent {
    switch (ch.kind) {
      case "stored":
        return {
          type: "BlockStored", blockHashes: ch.hashes, parentBlockHash: ch.parent, tokenIds: ch.tokenIds,
          // SGLang never fills lora_id; it names an adapter by lora_name (mem_cache/events.py KvEventLoraNames),
          // which only its map form carries.
          blockSize: this.blockSize, loraId: this.sglang ? null : ch.loraId, medium: "GPU", loraName: ch.loraName,
          extraKeys: this.tagged ? ch.extraKeys.map((k) => tagged(k, ch.loraName)) : ch.extraKeys,
          // SGLang has no extra_keys: its salt travels as a field of its own (vLLM's is in extra_keys).
          ...(ch.cacheSalt !== undefined && this.sglang ? { cacheSalt: ch.cacheSalt } : {}),
        };
      case "removed":
        return { type: "BlockRemoved", blockHashes: ch.hashes, medium: "GPU" };
      case "cleared":
        return { type: "AllBlocksCleared" };
    }
  }
}

/**
 * A block's extra keys with their sources named: the LoRA name leads the tuple when the request has an
 * adapter (blockExtraKeys' order), every other string is the salt, pairs are media.
 */
function tagged(keys: ExtraKeyValue[] | null, loraName: string | null): ExtraKeyValue[] | null {
  return keys && keys.map((k, i) => (typeof k !== "string" ? k : i === 0 && loraName ? ["lora", k] : ["cache_salt", k]));
}

export class RankEventStream {
  private paused = false;
  /** True while the sockets are rebound: changes made then are lost, as during a real restart. */
  private restarting = false;
  private restarts = 0;

  private readonly events: RankEvents;

  private constructor(
    private readonly opts: EventStreamOptions,
    private publisher: KvEventPublisher,
  ) {
    this.events = new RankEvents(opts.blockSize, opts.encoding, opts.kvGroups, opts.wire);
  }

  static async open(opts: EventStreamOptions): Promise<RankEventStream> {
    return new RankEventStream(opts, await bindPublisher(opts));
  }

  get endpoint(): string {
    return this.publisher.endpoint;
  }

  get replayEndpoint(): string | null {
    return this.publisher.replayEndpoint ?? null;
  }

  state(): EventStreamState {
    return {
      rank: this.opts.rank,
      endpoint: this.endpoint,
      replayEndpoint: this.replayEndpoint,
      nextSeq: this.publisher.nextSeq.toString(),
      paused: this.paused,
      restarts: this.restarts,
    };
  }

  /** Publishes one batch for one cache change. Never throws: a failed send is counted and logged. */
  publish(changes: CacheEvent[]): void {
    if (this.paused || this.restarting) return;
    const events = this.events.of(changes);
    try {
      const seq = this.publisher.publish({ ts: Date.now() / 1000, events, dataParallelRank: this.opts.rank });
      this.opts.onPublished?.(events.length);
      this.opts.log.trace({ seq: seq.toString(), events: events.length }, "published");
    } catch (e) {
      this.opts.onError?.();
      this.opts.log.warn({ err: e, events: events.length }, "KV-event publish failed");
    }
  }

  /** Fault: stop publishing; cache changes made meanwhile are never sent (no seq is used for them). */
  pause(): void {
    this.paused = true;
  }

  resume(): void {
    this.paused = false;
  }

  /** Fault: the next `count` seq numbers are never sent, so subscribers see a gap. */
  skip(count: number): void {
    this.publisher.skipSeq(count);
  }

  /**
   * Fault: what a worker restart looks like on the wire. The sockets are closed and bound again, and
   * seq starts from 0; the caller clears the cache without publishing AllBlocksCleared (a restarted
   * engine does not know what it held).
   */
  async restart(): Promise<void> {
    // Rebind on the ports actually bound before, so an ephemeral (port 0) endpoint keeps its address.
    const endpoint = this.endpoint;
    const replayEndpoint = this.replayEndpoint ?? undefined;
    this.restarting = true;
    try {
      await this.publisher.close();
      this.publisher = await bindPublisher({ ...this.opts, endpoint, replayEndpoint });
      this.restarts++;
    } finally {
      this.restarting = false;
    }
  }

  close(): Promise<void> {
    return this.publisher.close();
  }
}

function bindPublisher(o: EventStreamOptions): Promise<KvEventPublisher> {
  return KvEventPublisher.bind({
    endpoint: o.endpoint, connect: o.connect, replayEndpoint: o.replayEndpoint, topic: o.topic, replayBuffer: o.replayBuffer,
    encoding: o.encoding, hashMode: o.hashMode, logger: o.log,
  });
}
