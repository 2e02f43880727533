// The exact recovery handoff, for every worker rank (README "Exact recovery handoff"): the cursor each
// rank's blocks are dumped with, the peer cursors a recovered dump brings, and the joiner's rule applied
// to each rank's live stream afterwards. The seam to the rest of the EPP is narrow: it wraps the
// indexers' DumpSource and DumpTarget, and it is the sink the listeners deliver to.
import { parseWorkerKey, type StreamCursor, workerKey, type WorkerRef } from "@kv-epp/protocol";
import { replayRange, type ListenerSignal, type SocketOptions } from "@kv-epp/kv-events";
import type { DumpModel, DumpSource, DumpStaging, DumpTarget } from "@kv-epp/recovery";
import type { Logger } from "pino";
import { Counter, type Registry } from "prom-client";
import { HANDOFF_OUTCOMES, NO_CURSOR, RankStream, type HandoffOutcome, type RankIndex } from "./rank-stream.ts";

/** What the handoff needs from the indexers: the live model's dump (with a snapshot hook) and its index. */
export type HandoffIndex = {
  models(opts: { onSnapshot: (key: string, w: WorkerRef) => void }): Iterable<DumpModel>;
  /** The workers the live model's index holds blocks for. */
  workers(): WorkerRef[];
  rank(w: WorkerRef): RankIndex;
};

export type HandoffOptions = {
  /** The `"<model>:<tenant>"` key the workers' live events feed: the one model whose dump carries cursors. */
  liveKey: string;
  index: HandoffIndex;
  /** The rank's replay endpoint, when it has one. */
  replayEndpoint: (w: WorkerRef) => string | undefined;
  /** Whether the rank is in this replica's worker set (a peer's other ranks are pruned, not taken over). */
  known: (w: WorkerRef) => boolean;
  replayTimeoutMs?: number;
  socket?: SocketOptions;
  registry: Registry;
  log: Logger;
};

export type HandoffSummary = Record<HandoffOutcome | "pending", number>;

export class StreamHandoff {
  private readonly ranks = new Map<string, RankStream>();
  private readonly outcomes: Counter<"outcome">;
  private readonly droppedBlocks: Counter;

  constructor(private readonly opts: HandoffOptions) {
    this.outcomes = new Counter({
      name: "dynamo_epp_kv_handoff_total",
      help: "worker ranks taken over from a recovered dump, by how the handoff to the live stream ended: exact, replayed (hole filled by replay), dropped (hole not replayable: blocks dropped), reset, unknown (peer had no complete view), overlap (peer without cursors)",
      labelNames: ["outcome"],
      registers: [opts.registry],
    });
    for (const o of HANDOFF_OUTCOMES) this.outcomes.inc({ outcome: o }, 0);
    this.droppedBlocks = new Counter({
      name: "dynamo_epp_kv_handoff_dropped_blocks_total",
      help: "recovered blocks dropped because the handoff could not make them exact (unreplayable hole, reset, peer without a complete view)",
      registers: [opts.registry],
    });
  }

  /** The listeners' sink: every signal of a rank goes through its stream to the index. */
  signal(w: WorkerRef, s: ListenerSignal): void {
    this.rank(w).onSignal(s);
  }

  /** The rank left the worker set (its listener closed): a new listener starts over. */
  forget(w: WorkerRef): void {
    const k = workerKey(w);
    this.ranks.get(k)?.close();
    this.ranks.delete(k);
  }

  /** The index dropped a rank's blocks (or every rank's: null) outside the stream: those views are incomplete. */
  viewLost(key: string, w: WorkerRef | null): void {
    if (key !== this.opts.liveKey) return;
    if (w === null) for (const r of this.ranks.values()) r.viewLost();
    else this.ranks.get(workerKey(w))?.viewLost();
  }

  get(w: WorkerRef): RankStream | undefined {
    return this.ranks.get(workerKey(w));
  }

  summary(): HandoffSummary {
    const out = Object.fromEntries([...HANDOFF_OUTCOMES, "pending"].map((o) => [o, 0])) as HandoffSummary;
    for (const r of this.ranks.values()) if (r.handoff !== null) out[r.handoff]++;
    return out;
  }

  /** The indexers' dump, with each rank's cursor read in the step its blocks are (live model only). */
  source(): DumpSource {
    const { liveKey, index } = this.opts;
    const handoff = this;
    return {
      *models() {
        const snapped = new Map<string, StreamCursor>();
        for (const m of index.models({ onSnapshot: (key, w) => key === liveKey && snapped.set(workerKey(w), handoff.cursorOf(w)) })) {
          if (m.key !== liveKey) {
            yield m;
            continue;
          }
          let atStart = new Map<string, StreamCursor>();
          let held = new Set<string>();
          // In the same step as the index takes its list of workers (the first pull of its dump).
          const begin = () => {
            atStart = new Map([...handoff.ranks].map(([k, r]) => [k, r.streamCursor()]));
            held = new Set(index.workers().map(workerKey));
          };
          const json = m.eventsJson;
          const binary = m.eventsBinary;
          yield {
            ...m,
            events: startingWith(begin, m.events),
            eventsJson: json && ((chunkBytes: number) => startingWith(begin, json(chunkBytes))),
            eventsBinary: binary && ((chunkBytes: number) => startingWith(begin, binary(chunkBytes))),
            cursors: () => {
              const out: StreamCursor[] = [];
              for (const k of new Set([...atStart.keys(), ...snapped.keys(), ...held])) {
                const s = snapped.get(k);
                if (s) out.push(s);
                else if (held.has(k)) out.push(incomplete(k)); // removed before the dump reached it
                else out.push(atStart.get(k)!); // no blocks when the dump began: its cursor then is theirs
              }
              return out;
            },
          };
        }
      },
    };
  }

  /** The indexers' staging, which hands the peer's cursors for the live model to the ranks on commit. */
  target(inner: DumpTarget): DumpTarget {
    return {
      begin: (): DumpStaging => {
        const s = inner.begin();
        let cursors: StreamCursor[] | null = null;
        return {
          // The recovery bounds (unserved models skipped, the budget) are the inner staging's.
          accepts: (key) => s.accepts(key),
          model: (key, blockSize, sizes) => s.model(key, blockSize, sizes),
          events: (key, worker, run) => s.events(key, worker, run),
          extras: (key, extras) => {
            if (key === this.opts.liveKey && extras.cursors) cursors = extras.cursors;
            s.extras(key, extras);
          },
          stagedBytes: () => s.stagedBytes(),
          commit: () => {
            s.commit();
            this.adopt(cursors);
          },
          abort: () => s.abort(),
        };
      },
    };
  }

  private adopt(cursors: StreamCursor[] | null): void {
    const held = this.opts.index.workers();
    if (cursors === null) {
      // A peer from before cursors: its blocks stay, and the buffered events go on top (overlap).
      for (const w of held) if (this.opts.known(w)) this.rank(w).overlap();
      if (held.length > 0) this.opts.log.warn({ ranks: held.length }, "recovered dump has no stream cursors (older peer): blocks kept, buffered events applied on top, views not known complete");
      return;
    }
    const taken = new Set<string>();
    for (const c of cursors) {
      const w = { workerId: c.workerId, dpRank: c.dpRank };
      if (c.seq === null || !this.opts.known(w)) continue;
      taken.add(workerKey(w));
      // An incomplete view is taken over too: every way a view becomes incomplete (a gap nobody could
      // replay, a restart, a stream caught after its start) drops what it held or never had it, so it
      // holds only blocks the worker holds. Dropping it would make recovery from a replica that started
      // after its workers, the usual case, carry nothing; it is continued exactly and stays incomplete.
      this.rank(w).adopt({ seq: c.seq, baseline: c.baseline, complete: c.complete, epoch: c.epoch });
    }
    // Blocks without a position in the rank's stream cannot be continued exactly.
    for (const w of held) if (!taken.has(workerKey(w)) && this.opts.known(w)) this.rank(w).unknownToPeer();
  }

  private cursorOf(w: WorkerRef): StreamCursor {
    return this.ranks.get(workerKey(w))?.streamCursor() ?? { workerId: w.workerId, dpRank: w.dpRank, ...NO_CURSOR };
  }

  private rank(w: WorkerRef): RankStream {
    const k = workerKey(w);
    let r = this.ranks.get(k);
    if (!r) {
      const endpoint = this.opts.replayEndpoint(w);
      const timeoutMs = this.opts.replayTimeoutMs;
      r = new RankStream({
        worker: { workerId: w.workerId, dpRank: w.dpRank },
        index: this.opts.index.rank(w),
        replay: endpoint ? (from, to) => replayRange({ endpoint, from, to, timeoutMs, socket: this.opts.socket }) : null,
        log: this.opts.log,
        onOutcome: (outcome, dropped) => {
          this.outcomes.inc({ outcome });
          if (dropped > 0) this.droppedBlocks.inc(dropped);
        },
      });
      this.ranks.set(k, r);
    }
    return r;
  }
}

function* startingWith<T>(begin: () => void, inner: Iterable<T>): Generator<T> {
  begin();
  yield* inner;
}

function incomplete(key: string): StreamCursor {
  return { ...parseWorkerKey(key), ...NO_CURSOR };
}
