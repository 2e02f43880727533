import type { RankEngine } from "./engine/rank-engine.ts";
import type { EventStreamState, RankEventStream } from "./events/event-stream.ts";
import type { FaultRequest } from "./http/admin-routes.ts";

/** A rank as the admin switches see it: its engine (cache) and its event stream. */
export type RankParts = { engine: RankEngine; events: RankEventStream };

/** Applies fault switches and cache resets to one rank or all of them. */
export class Faults {
  constructor(private readonly ranks: readonly RankParts[]) {}

  get dpSize(): number {
    return this.ranks.length;
  }

  state(): EventStreamState[] {
    return this.ranks.map((r) => r.events.state());
  }

  async apply(req: FaultRequest): Promise<void> {
    const targets = req.rank === undefined ? this.ranks : [this.ranks[req.rank]!];
    for (const r of targets) {
      switch (req.action) {
        case "restart":
          await restart(r);
          break;
        case "skip":
          r.events.skip(req.count);
          break;
        case "pause":
          r.events.pause();
          break;
        case "resume":
          r.events.resume();
          break;
        case "drop-cache":
          // Behind the subscribers' back: the blocks go, no event says so (a drifted index).
          r.engine.cache.clear({ silent: true });
          break;
      }
    }
  }

  /** POST /reset_prefix_cache: every rank drops its blocks and publishes AllBlocksCleared. */
  resetPrefixCache(): void {
    for (const r of this.ranks) r.engine.cache.clear();
  }
}

// The cache is cleared silently before the rebind: the new stream starts at seq 0 over an empty cache,
// exactly as a restarted vLLM would.
async function restart(r: RankParts): Promise<void> {
  r.engine.cache.clear({ silent: true });
  await r.events.restart();
}
