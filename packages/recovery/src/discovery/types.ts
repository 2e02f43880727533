import type { Peer } from "../types.ts";

/**
 * A source of eligible (serving) recovery peers. Level-triggered: `onChange` only says "look again";
 * the consumer re-reads `peers()` and reconciles.
 */
export interface PeerDiscovery {
  /** Resolves once the initial state is known (first list, first probes). Idempotent. */
  start(): Promise<void>;
  /** The current eligible peers (never this replica itself). */
  peers(): Peer[];
  onChange(cb: () => void): () => void;
  stop(): Promise<void>;
  /** For logs: where peers come from. */
  readonly description: string;
}

/** Shared listener bookkeeping for discovery implementations. */
export class ChangeListeners {
  private readonly cbs = new Set<() => void>();
  add(cb: () => void): () => void {
    this.cbs.add(cb);
    return () => this.cbs.delete(cb);
  }
  emit(): void {
    for (const cb of [...this.cbs]) cb();
  }
}

export function sortedPeers(peers: Iterable<Peer>): Peer[] {
  const byId = new Map<string, Peer>();
  for (const p of peers) byId.set(p.id, p);
  return [...byId.values()].sort((a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0));
}
