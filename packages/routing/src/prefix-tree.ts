// The in-flight prefixes' keys as a radix tree (pending.ts keeps the entries, their bounds and their
// expiry; this answers the longest match per worker). Key i of an entry names its blocks 0..i, so two
// entries agree on every key before the last one they share: a node stands for a run of keys that
// every entry below it shares, an edge is compared by a binary search over it, and a query walks only
// the branch points on its own path. Each node counts the entries below it per worker, so a lookup
// costs the nodes on that path (log of their edges' lengths each) and the workers below them, never
// the entries: 2000 requests in flight behind one system prompt are one branch point, where a scan of
// the entries sharing a first block read all 2000. Adding and removing an entry costs the branch points
// on its path too, not its keys: a node per key (a map of every prefix key) cost 4x the CPU of the
// whole pick to add and remove 832-block prompts.
import type { PrefixKeys } from "./pending.ts";

type Node = {
  /** Keys from the root to this node's end: the edge into it covers keys [parent.depth, depth). */
  depth: number;
  /**
   * The keys of an entry below (every one agrees up to `depth`). A live entry's: one that leaves hands
   * the node another's, so a node never keeps a gone request's keys alive.
   */
  keys: PrefixKeys;
  parent: Node | undefined;
  /** The key its parent holds it under: its keys[parent.depth]. */
  edge: number;
  children: Map<number, Node>;
  /** Entries below (ending here or further), per worker key; a worker with none has no key. */
  workers: Map<string, number>;
  /** Entries below, over all workers. */
  count: number;
  /** Entries whose keys end here. */
  ending: Set<PrefixEntry>;
};

/** An entry in the tree: a request's keys pending on a worker. */
export type PrefixEntry = { readonly workerKey: string; readonly keys: PrefixKeys; node: Node };

const node = (depth: number, keys: PrefixKeys, parent: Node | undefined, edge: number): Node => ({
  depth,
  keys,
  parent,
  edge,
  children: new Map(),
  workers: new Map(),
  count: 0,
  ending: new Set(),
});

/** The largest m in [lo, hi] with a[m - 1] === b[m - 1], given that a[lo - 1] === b[lo - 1]: shared keys are a prefix of both. */
function sharedEnd(a: PrefixKeys, b: PrefixKeys, lo: number, hi: number): number {
  while (lo < hi) {
    const mid = (lo + hi + 1) >>> 1;
    if (a[mid - 1] === b[mid - 1]) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

export class PrefixTree {
  private readonly root = node(0, new Float64Array(0), undefined, 0);

  /** Adds `keys` (non-empty) as pending on `workerKey`. */
  add(workerKey: string, keys: PrefixKeys): PrefixEntry {
    let at = this.root;
    let d = 0;
    while (d < keys.length) {
      const child = at.children.get(keys[d]!);
      if (!child) {
        const leaf = node(keys.length, keys, at, keys[d]!);
        at.children.set(leaf.edge, leaf);
        at = leaf;
        break;
      }
      const m = sharedEnd(child.keys, keys, d + 1, Math.min(child.depth, keys.length));
      if (m < child.depth) {
        // The entry leaves the edge inside it: a branch point where it does.
        const mid = node(m, child.keys, at, child.edge);
        mid.workers = new Map(child.workers);
        mid.count = child.count;
        at.children.set(mid.edge, mid);
        child.parent = mid;
        child.edge = child.keys[m]!;
        mid.children.set(child.edge, child);
        at = mid;
      } else at = child;
      d = m;
    }
    const e: PrefixEntry = { workerKey, keys, node: at };
    at.ending.add(e);
    for (let n: Node = at; n !== this.root; n = n.parent!) {
      n.count++;
      n.workers.set(workerKey, (n.workers.get(workerKey) ?? 0) + 1);
    }
    return e;
  }

  remove(e: PrefixEntry): void {
    e.node.ending.delete(e);
    for (let n: Node = e.node; n !== this.root; ) {
      const parent = n.parent!;
      n.count--;
      const left = n.workers.get(e.workerKey)! - 1;
      if (left === 0) n.workers.delete(e.workerKey);
      else n.workers.set(e.workerKey, left);
      if (n.count === 0) parent.children.delete(n.edge);
      else {
        // Below here every child already holds a live entry's keys.
        if (n.keys === e.keys) n.keys = first(n.ending)?.keys ?? first(n.children.values())!.keys;
        if (n.ending.size === 0 && n.children.size === 1) {
          // No longer a branch point: its one child takes its edge as well.
          const only = first(n.children.values())!;
          only.parent = parent;
          only.edge = n.edge;
          parent.children.set(n.edge, only);
        }
      }
      n = parent;
    }
  }

  /** Fills `out` (empty) with each worker key's longest shared prefix of `keys` (only those with >= 1). */
  longestInto(keys: PrefixKeys, out: Map<string, number>): void {
    let at = this.root;
    let d = 0;
    while (d < keys.length) {
      const child = at.children.get(keys[d]!);
      if (!child) return;
      const m = sharedEnd(child.keys, keys, d + 1, Math.min(child.depth, keys.length));
      // Every entry below shares the first m keys; those that share more are below the next node.
      for (const w of child.workers.keys()) out.set(w, m);
      if (m < child.depth) return;
      at = child;
      d = m;
    }
  }
}

function first<T>(it: Iterable<T>): T | undefined {
  for (const x of it) return x;
  return undefined;
}
