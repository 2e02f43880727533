// A plain TypeScript model of the index: the oracle for the property tests and the benchmark baseline.
// It favours obviousness over speed; its semantics are the specification the WASM index must match.
import {
  workerKey, type ApplyOutcome, type BatchOutcome, type DumpEvent, type IndexEvent, type MatchResult,
  type StoredBlock, type WorkerRef,
} from "../src/types.ts";

type Node = {
  tokensHash: bigint;
  parent: Node | null;
  children: Map<bigint, Node>;
  /** workerKey → that worker's external hash for this block */
  holders: Map<string, bigint>;
};

type WorkerState = { ref: WorkerRef; byExternal: Map<bigint, Node> };

export class ReferenceIndex {
  private readonly root: Node = { tokensHash: 0n, parent: null, children: new Map(), holders: new Map() };
  private readonly workerStates = new Map<string, WorkerState>();
  private nodeCount = 0;
  private residencyCount = 0;
  private rejectedCount = 0;
  private unknownCount = 0;

  static create(_opts: { blockSize: number }): ReferenceIndex {
    return new ReferenceIndex();
  }

  private state(w: WorkerRef): WorkerState {
    const key = workerKey(w);
    let s = this.workerStates.get(key);
    if (!s) {
      s = { ref: { workerId: w.workerId, dpRank: w.dpRank }, byExternal: new Map() };
      this.workerStates.set(key, s);
    }
    return s;
  }

  applyStored(w: WorkerRef, parent: bigint | null, blocks: StoredBlock[]): ApplyOutcome {
    const s = this.state(w);
    const key = workerKey(w);
    let cur = this.root;
    if (parent !== null) {
      const p = s.byExternal.get(parent);
      if (!p) {
        this.rejectedCount++;
        return { kind: "rejected", reason: "unknown-parent", blocks: 0 };
      }
      cur = p;
    }
    let added = 0;
    for (const b of blocks) {
      const held = s.byExternal.get(b.externalHash);
      const child = cur.children.get(b.tokensHash);
      if (held || child?.holders.has(key)) {
        if (held && held === child) { cur = child; continue; } // idempotent re-store
        this.rejectedCount++;
        return { kind: "rejected", reason: "hash-conflict", blocks: added };
      }
      let next = child;
      if (!next) {
        next = { tokensHash: b.tokensHash, parent: cur, children: new Map(), holders: new Map() };
        cur.children.set(b.tokensHash, next);
        this.nodeCount++;
      }
      next.holders.set(key, b.externalHash);
      s.byExternal.set(b.externalHash, next);
      this.residencyCount++;
      added++;
      cur = next;
    }
    return { kind: "applied", blocks: added, unknown: 0 };
  }

  applyRemoved(w: WorkerRef, hashes: bigint[]): ApplyOutcome {
    const s = this.state(w);
    let dropped = 0;
    let unknown = 0;
    for (const h of hashes) {
      const node = s.byExternal.get(h);
      if (!node) { unknown++; this.unknownCount++; continue; }
      dropped += this.drop(s, workerKey(w), node);
    }
    return { kind: "applied", blocks: dropped, unknown };
  }

  /** Drops the worker from `node` and from every descendant it holds through it (prefix semantics). */
  private drop(s: WorkerState, key: string, node: Node): number {
    let dropped = 0;
    for (const child of [...node.children.values()]) {
      if (child.holders.has(key)) dropped += this.drop(s, key, child);
    }
    s.byExternal.delete(node.holders.get(key)!);
    node.holders.delete(key);
    this.residencyCount--;
    if (node.holders.size === 0) {
      node.parent!.children.delete(node.tokensHash);
      this.nodeCount--;
    }
    return dropped + 1;
  }

  clearWorker(w: WorkerRef): void {
    this.clear(w);
  }

  private clear(w: WorkerRef): number {
    const key = workerKey(w);
    const s = this.workerStates.get(key);
    if (!s) return 0;
    let dropped = 0;
    for (const child of [...this.root.children.values()]) {
      if (child.holders.has(key)) dropped += this.drop(s, key, child);
    }
    return dropped;
  }

  removeWorker(w: WorkerRef): void {
    this.clearWorker(w);
    this.workerStates.delete(workerKey(w));
  }

  applyBatch(events: IndexEvent[]): BatchOutcome {
    const out: BatchOutcome = { events: events.length, blocks: 0, unknown: 0, rejected: 0 };
    for (const e of events) {
      if (e.kind === "cleared") { out.blocks += this.clear(e.worker); continue; }
      const r = e.kind === "stored"
        ? this.applyStored(e.worker, e.parentHash, e.blocks)
        : this.applyRemoved(e.worker, e.hashes);
      out.blocks += r.blocks;
      if (r.kind === "applied") out.unknown += r.unknown;
      else out.rejected++;
    }
    return out;
  }

  findMatches(tokensHashes: BigUint64Array): MatchResult {
    const scores = new Map<string, number>();
    let cur = this.root;
    for (let depth = 0; depth < tokensHashes.length; depth++) {
      const next = cur.children.get(tokensHashes[depth]!);
      if (!next) break;
      // holders of a child are always holders of its parent, so the deepest node a worker is in is its score
      for (const key of next.holders.keys()) scores.set(key, depth + 1);
      cur = next;
    }
    const treeSizes = new Map<string, number>();
    for (const key of scores.keys()) treeSizes.set(key, this.workerStates.get(key)!.byExternal.size);
    return { scores, treeSizes };
  }

  *dump(): Iterable<DumpEvent> {
    for (const [key, s] of this.workerStates) {
      yield* this.dumpFrom(s.ref, key, this.root, null);
    }
  }

  private *dumpFrom(ref: WorkerRef, key: string, from: Node, parentHash: bigint | null): Iterable<DumpEvent> {
    for (const start of from.children.values()) {
      if (!start.holders.has(key)) continue;
      // extend one event along a single-child chain; branch points start new events
      const blocks: StoredBlock[] = [];
      let node = start;
      for (;;) {
        blocks.push({ externalHash: node.holders.get(key)!, tokensHash: node.tokensHash });
        const held = [...node.children.values()].filter((c) => c.holders.has(key));
        if (held.length !== 1) break;
        node = held[0]!;
      }
      yield { worker: ref, parentHash, blocks };
      yield* this.dumpFrom(ref, key, node, blocks[blocks.length - 1]!.externalHash);
    }
  }

  stats() {
    return {
      blocks: this.nodeCount,
      residencies: this.residencyCount,
      workers: this.workerStates.size,
      bytes: 0,
      bytesInUse: 0,
      rejected: this.rejectedCount,
      unknownRemovals: this.unknownCount,
    };
  }

  workers(): WorkerRef[] {
    return [...this.workerStates.values()].map((s) => s.ref);
  }

  treeSize(w: WorkerRef): number {
    return this.workerStates.get(workerKey(w))?.byExternal.size ?? 0;
  }
}
