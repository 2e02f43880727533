// Replicas that share their load over replica-agg still decide at the same instant on the same view:
// requests arriving together at two replicas are each routed before either hears of the other's pick,
// so both send theirs to the same idle worker and leave another idle (a herd). Each replica therefore
// has a home share of the workers (the workers sorted by key, dealt out to the replicas sorted by id)
// and its latency cost charges a worker outside it a share of the request's own prefill time
// (LatencyModel.costMs): the peer whose home it is may be sending one of its own there at the same
// instant. Near-equal candidates split by replica, while a cached prefix or a shorter queue elsewhere
// still outweighs the charge. With no peers heard of, every worker is home. bench:trace (conversation
// trace, two replicas, replica-agg lag 1 ms): without it the predicted TTFT of a pick on an idle
// worker was 272 ms against 701 ms simulated (343 ms with one router); packages/epp/README.md
// "Home share".

/** This replica's id and the ids of the peers it currently follows (replica-agg). */
export type ReplicaSet = { readonly self: string; readonly peers: readonly string[] };

/**
 * The home share of `self` among `replicas` replicas: worker i of the sorted keys is home to the
 * replica at position i mod n of the sorted ids, so shares are disjoint, cover every worker, and differ
 * in size by at most one.
 */
export function homeShare(workerKeys: readonly string[], replicas: ReplicaSet): Set<string> {
  const ids = [...new Set([replicas.self, ...replicas.peers])].sort();
  const me = ids.indexOf(replicas.self);
  const keys = [...new Set(workerKeys)].sort();
  return new Set(keys.filter((_, i) => i % ids.length === me));
}

/** Which candidates lie outside this replica's home share, recomputed only when the workers or the replicas change. */
export class AwayWorkers {
  private keys: string[] = [];
  private replicas: ReplicaSet = { self: "", peers: [] };
  private away: (workerKey: string) => boolean = never;

  /** Whether a worker key is outside the home share; never when alone. */
  of(workers: readonly { readonly key: string }[], replicas: ReplicaSet | undefined): (workerKey: string) => boolean {
    if (!replicas || replicas.peers.length === 0) return never;
    if (!this.unchanged(workers, replicas)) {
      this.keys = workers.map((w) => w.key);
      this.replicas = { self: replicas.self, peers: [...replicas.peers] };
      const home = homeShare(this.keys, replicas);
      this.away = (k) => !home.has(k);
    }
    return this.away;
  }

  private unchanged(workers: readonly { readonly key: string }[], r: ReplicaSet): boolean {
    const k = this.keys;
    const p = this.replicas.peers;
    if (k.length !== workers.length || p.length !== r.peers.length || this.replicas.self !== r.self) return false;
    for (let i = 0; i < k.length; i++) if (k[i] !== workers[i]!.key) return false;
    for (let i = 0; i < p.length; i++) if (p[i] !== r.peers[i]) return false;
    return true;
  }
}

const never = () => false;
