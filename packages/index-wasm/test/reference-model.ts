// A plain TypeScript model of the index: the oracle for the property tests and the benchmark baseline.
// It favours obviousness over speed; its semantics are the specification the WASM index must match
// (../README.md, "Semantics"): per (worker, block) a copy count; removing a block's last copy keeps the
// blocks below it, and the removed block stays as a zero-copy record (its block hash still names the
// prefix) while its block has children.
import { workerKey } from "@kv-epp/protocol";
import type { BatchOutcome, DumpEvent, StoredBlock, WorkerRef } from "../src/types.ts";
import type { ApplyOutcome, IndexEvent, MatchResult } from "../src/helpers.ts";

type Holder = { ext: bigint; copies: number };
type Node = {
  tokensHash: bigint;
  parent: Node | null;
  children: Map<bigint, Node>;
  /** workerKey → that worker's record: block hash and copies (0: not held, kept for the blocks below) */
  holders: Map<string, Holder>;
};

type WorkerState = { ref: WorkerRef; byExternal: Map<bigint, Node>; held: number };

export class ReferenceIndex {
  private readonly root: Node = { tokensHash: 0n, parent: null, children: new Map(), holders: new Map() };
  private readonly workerStates = new Map<string, WorkerState>();
  private nodeCount = 0;
  private residencyCount = 0;
  private rejectedCount = 0;
  private unknownCount = 0;
  /** How often the copy and kept-descendant rules applied (tests check their generators reach them). */
  readonly observed = { extraCopy: 0, keptBelow: 0, storedAgain: 0 };

  static create(_opts: { blockSize: number }): ReferenceIndex {
    return new ReferenceIndex();
  }

  private state(w: WorkerRef): WorkerState {
    const key = workerKey(w);
    let s = this.workerStates.get(key);
    if (!s) {
      s = { ref: { workerId: w.workerId, dpRank: w.dpRank }, byExternal: new Map(), held: 0 };
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
      const copies = b.copies ?? 1;
      const held = s.byExternal.get(b.blockHash);
      const child = cur.children.get(b.tokensHash);
      if (held || child?.holders.has(key)) {
        if (held && held === child) {
          const h = child.holders.get(key)!;
          if (h.copies === 0 && copies > 0) { added++; s.held++; this.residencyCount++; this.observed.storedAgain++; }
          else if (copies > 0) this.observed.extraCopy++;
          h.copies += copies;
          cur = child;
          continue;
        }
        this.rejectedCount++;
        this.dropTrailingZeroCopies(s, key, cur);
        return { kind: "rejected", reason: "hash-conflict", blocks: added };
      }
      let next = child;
      if (!next) {
        next = { tokensHash: b.tokensHash, parent: cur, children: new Map(), holders: new Map() };
        cur.children.set(b.tokensHash, next);
        this.nodeCount++;
      }
      next.holders.set(key, { ext: b.blockHash, copies });
      s.byExternal.set(b.blockHash, next);
      if (copies > 0) { added++; s.held++; this.residencyCount++; }
      cur = next;
    }
    this.dropTrailingZeroCopies(s, key, cur);
    return { kind: "applied", blocks: added, unknown: 0 };
  }

  /** A zero-copy record is kept only for blocks below it: one an event left without children goes. */
  private dropTrailingZeroCopies(s: WorkerState, key: string, node: Node): void {
    while (node !== this.root && node.children.size === 0 && node.holders.get(key)?.copies === 0) {
      const parent = node.parent!;
      this.deleteRecord(s, key, node);
      this.prune(node);
      node = parent;
    }
  }

  applyRemoved(w: WorkerRef, hashes: bigint[]): ApplyOutcome {
    const s = this.state(w);
    const key = workerKey(w);
    let dropped = 0;
    let unknown = 0;
    for (const h of hashes) {
      const node = s.byExternal.get(h);
      const rec = node?.holders.get(key);
      if (!node || !rec || rec.copies === 0) { unknown++; this.unknownCount++; continue; }
      if (--rec.copies > 0) continue;
      dropped++;
      s.held--;
      this.residencyCount--;
      // the blocks below stay (vLLM keeps them: their hashes are unchanged); the record stays with them
      if (node.children.size === 0) {
        this.deleteRecord(s, key, node);
        this.prune(node);
      } else this.observed.keptBelow++;
    }
    return { kind: "applied", blocks: dropped, unknown };
  }

  private deleteRecord(s: WorkerState, key: string, node: Node): void {
    s.byExternal.delete(node.holders.get(key)!.ext);
    node.holders.delete(key);
  }

  /**
   * Frees a node nobody has a record at and that has no children; a parent left without children also
   * loses its zero-copy records (nothing below them any more), and may go in turn.
   */
  private prune(node: Node): void {
    while (node !== this.root && node.holders.size === 0 && node.children.size === 0) {
      const parent = node.parent!;
      parent.children.delete(node.tokensHash);
      this.nodeCount--;
      if (parent === this.root || parent.children.size > 0) return;
      for (const [k, h] of [...parent.holders]) {
        if (h.copies === 0) this.deleteRecord(this.workerStates.get(k)!, k, parent);
      }
      node = parent;
    }
  }

  clearWorker(w: WorkerRef): void {
    this.clear(w);
  }

  private clear(w: WorkerRef): number {
    const key = workerKey(w);
    const s = this.workerStates.get(key);
    if (!s) return 0;
    const dropped = s.held;
    const nodes = [...s.byExternal.values()];
    for (const n of nodes) this.deleteRecord(s, key, n);
    this.residencyCount -= dropped;
    s.held = 0;
    const depth = (n: Node) => { let d = 0; for (let p = n.parent; p; p = p.parent) d++; return d; };
    nodes.sort((a, b) => depth(b) - depth(a));
    for (const n of nodes) if (n.parent?.children.get(n.tokensHash) === n) this.prune(n);
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

  /** A worker's score is the number of leading query blocks it holds (at least one copy each). */
  findMatches(tokensHashes: BigUint64Array): MatchResult {
    const scores = new Map<string, number>();
    let alive: string[] | null = null;
    let cur = this.root;
    for (let depth = 0; depth < tokensHashes.length; depth++) {
      const next = cur.children.get(tokensHashes[depth]!);
      if (!next) break;
      const holding = [...next.holders].filter(([, h]) => h.copies > 0).map(([k]) => k);
      alive = alive === null ? holding : alive.filter((k) => holding.includes(k));
      if (alive.length === 0) break;
      for (const k of alive) scores.set(k, depth + 1);
      cur = next;
    }
    const treeSizes = new Map<string, number>();
    for (const key of scores.keys()) treeSizes.set(key, this.workerStates.get(key)!.held);
    return { scores, treeSizes };
  }

  /** Held blocks and the zero-copy records on their paths (copies omitted when 1), parents first. */
  *dump(): Iterable<DumpEvent> {
    for (const [key, s] of this.workerStates) {
      const needed = new Set<Node>();
      for (const n of s.byExternal.values()) {
        if (n.holders.get(key)!.copies === 0) continue;
        for (let p: Node | null = n; p && p !== this.root && !needed.has(p); p = p.parent) needed.add(p);
      }
      yield* this.dumpFrom(s.ref, key, this.root, null, needed);
    }
  }

  private *dumpFrom(ref: WorkerRef, key: string, from: Node, parentHash: bigint | null, needed: Set<Node>): Iterable<DumpEvent> {
    for (const start of from.children.values()) {
      if (!needed.has(start)) continue;
      // extend one event along a single-child chain; branch points start new events
      const blocks: StoredBlock[] = [];
      let node = start;
      for (;;) {
        const h = node.holders.get(key)!;
        blocks.push(h.copies === 1 ? { blockHash: h.ext, tokensHash: node.tokensHash } : { blockHash: h.ext, tokensHash: node.tokensHash, copies: h.copies });
        const below = [...node.children.values()].filter((c) => needed.has(c));
        if (below.length !== 1) break;
        node = below[0]!;
      }
      yield { worker: ref, parentHash, blocks };
      yield* this.dumpFrom(ref, key, node, blocks[blocks.length - 1]!.blockHash, needed);
    }
  }

  stats() {
    return {
      blocks: this.nodeCount,
      residencies: this.residencyCount,
      workers: this.workerStates.size,
      bytes: 0,
      bytesInUse: 0,
      tableRebuilds: 0,
      rejected: this.rejectedCount,
      unknownRemovals: this.unknownCount,
    };
  }

  workers(): WorkerRef[] {
    return [...this.workerStates.values()].map((s) => s.ref);
  }

  treeSize(w: WorkerRef): number {
    return this.workerStates.get(workerKey(w))?.held ?? 0;
  }
}
