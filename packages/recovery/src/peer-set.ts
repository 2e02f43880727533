import type { Peer } from "./types.ts";

// The peer model of docs/CONTRACTS.md §8 rules 4-5 (a peer: another EPP replica to recover from). Level-triggered: `update()` receives the whole current
// eligible set every time and reconciles toward it, so no event needs to be seen to stay right.
// - The eligible *set* (sorted ids) is what change detection compares: reshuffling never counts as a change.
// - Priorities are random and scoped to a cycle: a peer gets one when it enters pending (cycle start or join).
// - One peer is active at a time; updates never touch it, so an in-flight dump may finish after its peer left.
// - A failed peer goes to `tried` for the rest of the cycle; a peer that leaves is forgotten from `tried`,
//   so if it comes back (restarted, now serving) it is newly eligible again.
// - A peer whose attempts failed `maxFailures` times in a row is set aside: no later cycle tries it, and it
//   no longer counts as a source (a peer that says "serving" and then serves broken dumps must not keep
//   this replica waiting). A failure that would repeat as is (the peer's dump exceeds this replica's budget)
//   sets it aside at once. Leaving forgets that too: a peer that comes back gets a fresh start.

type Pending = { peer: Peer; priority: number };

/** What `fail()` concluded about the peer. */
export type FailureRecord = { peer: Peer; failures: number; setAside: boolean };

export class PeerSet {
  private eligible = new Map<string, Peer>();
  private setKey = "";
  private readonly pending = new Map<string, Pending>();
  private readonly tried = new Set<string>();
  private activePeer: Peer | null = null;
  /** Before the first cycle, updates only record the eligible set: priorities are drawn per cycle. */
  private inCycle = false;
  /** Consecutive failed attempts per peer id (eligible peers only). */
  private readonly failures = new Map<string, number>();
  private readonly setAside = new Set<string>();

  /** `maxFailures`: consecutive failures that set a peer aside (0: never). */
  constructor(
    private readonly random: () => number = Math.random,
    private readonly maxFailures = 0,
  ) {}

  /** Reconciles with the current eligible peers; returns true when the set of peers really changed. */
  update(peers: readonly Peer[]): boolean {
    const next = new Map<string, Peer>();
    for (const p of peers) next.set(p.id, p);
    const key = [...next.keys()].sort().join("\n");
    const changed = key !== this.setKey;
    for (const id of [...this.pending.keys()]) if (!next.has(id)) this.pending.delete(id);
    for (const id of [...this.tried]) if (!next.has(id)) this.tried.delete(id);
    for (const id of [...this.failures.keys()]) if (!next.has(id)) this.failures.delete(id);
    for (const id of [...this.setAside]) if (!next.has(id)) this.setAside.delete(id);
    for (const [id, peer] of next) {
      const pending = this.pending.get(id);
      if (pending !== undefined) pending.peer = peer;
      else if (this.inCycle && id !== this.activePeer?.id && !this.tried.has(id) && !this.setAside.has(id)) this.pending.set(id, { peer, priority: this.random() });
    }
    this.eligible = next;
    this.setKey = key;
    return changed;
  }

  /** Starts a fresh cycle: nothing tried, every eligible peer pending with a newly drawn priority. */
  newCycle(): void {
    this.inCycle = true;
    this.tried.clear();
    this.pending.clear();
    for (const [id, peer] of this.eligible) if (id !== this.activePeer?.id && !this.setAside.has(id)) this.pending.set(id, { peer, priority: this.random() });
  }

  /** Takes the pending peer with the lowest priority as the active one (null when none is pending). */
  next(): Peer | null {
    if (this.activePeer !== null) throw new Error("an attempt is already active");
    let best: Pending | null = null;
    for (const p of this.pending.values()) if (best === null || p.priority < best.priority || (p.priority === best.priority && p.peer.id < best.peer.id)) best = p;
    if (best === null) return null;
    this.pending.delete(best.peer.id);
    this.activePeer = best.peer;
    return best.peer;
  }

  /**
   * Ends the active attempt as failed: the peer is tried for this cycle (if it is still eligible).
   * `final`: the failure would repeat as is, the peer is set aside now (when setting aside is on).
   */
  fail(final = false): FailureRecord | null {
    const p = this.activePeer;
    this.activePeer = null;
    if (p === null || !this.eligible.has(p.id)) return null;
    this.tried.add(p.id);
    const failures = (this.failures.get(p.id) ?? 0) + 1;
    this.failures.set(p.id, failures);
    const setAside = this.maxFailures > 0 && (final || failures >= this.maxFailures);
    if (setAside) this.setAside.add(p.id);
    return { peer: p, failures, setAside };
  }

  get active(): Peer | null {
    return this.activePeer;
  }
  get eligibleCount(): number {
    return this.eligible.size;
  }
  /** Eligible peers not set aside: the sources still worth waiting for. */
  get usableCount(): number {
    return this.eligible.size - this.setAside.size;
  }
  setAsideIds(): string[] {
    return [...this.setAside].sort();
  }
  /** Pending peers, in the order they would be tried. */
  pendingIds(): string[] {
    return [...this.pending.values()].sort((a, b) => a.priority - b.priority || (a.peer.id < b.peer.id ? -1 : 1)).map((p) => p.peer.id);
  }
  triedIds(): string[] {
    return [...this.tried].sort();
  }
  /** Nothing pending and nothing in flight: the cycle is over. */
  get exhausted(): boolean {
    return this.pending.size === 0 && this.activePeer === null;
  }
}
