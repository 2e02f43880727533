// vLLM's hybrid KV cache groups as a worker rank's events reveal them (BlockStored carries group_idx,
// kv_cache_spec_kind and kv_cache_spec_sliding_window; BlockRemoved only group_idx), and which of
// them the index follows.
//
// Only a main attention group is indexed (full attention, MLA): a prefix is a hit only when its full
// attention KV is cached. A sliding-window (or Mamba, chunked-local) group publishes the same block
// hashes for the blocks it keeps, while its token_ids span the whole range (vLLM's mask): pairing
// those hashes with tokens from the head would store wrong content, and its removals name blocks full
// attention still holds. So its stores and removals are skipped and counted.
//
// Several main groups (layers of one kind split by page size, or full attention plus MLA): the
// first one seen storing is the rank's indexed group (vLLM caches a step's blocks group by group in
// group_idx order, so it is the lowest); the others store the same hashes for
// the same blocks (vLLM caches and frees a request's blocks in every group together), so following
// one of them is following all, and indexing more would count every block twice. Their events are
// skipped and counted as extra_main_group.

import type { BlockRemoved, BlockStored } from "@kv-epp/kv-events";

export type GroupSpec = { kind: string | null; blockSize: number; slidingWindow: number | null };

/** Kinds whose blocks decide a prefix hit. An absent kind is a vLLM from before groups: one group. */
export function isMainKind(kind: string | null | undefined): boolean {
  return kind == null || kind === "full_attention" || kind === "mla_attention" || kind === "sink_full_attention";
}

export type GroupVerdict = "index" | "non_main_group" | "extra_main_group";

/** One worker rank's groups, learned from its stores. */
export class RankGroups {
  readonly groups = new Map<number, GroupSpec>();
  /** The group the index follows, once a main group has stored. */
  main: number | null = null;

  /** `partial`: a partial prefix-cache entry (partial-entry.ts), whose size is not its group's. */
  stored(e: BlockStored, partial = false): GroupVerdict {
    const g = e.groupIdx;
    if (g == null) return "index";
    if (!partial && (!this.groups.has(g) || e.blockSize > 0))
      this.groups.set(g, { kind: e.kvCacheSpecKind ?? null, blockSize: e.blockSize, slidingWindow: e.kvCacheSpecSlidingWindow ?? null });
    if (!isMainKind(e.kvCacheSpecKind)) return "non_main_group";
    this.main ??= g;
    return g === this.main ? "index" : "extra_main_group";
  }

  /** The block size a group's full stores use, once one was seen (null: group_idx absent or not seen yet). */
  blockSize(g: number | null | undefined): number | null {
    const s = g == null ? undefined : this.groups.get(g);
    return s && s.blockSize > 0 ? s.blockSize : null;
  }

  /** A removal applies to the group it names only; before that group is known, unless it is known not to be main. */
  removed(e: BlockRemoved): GroupVerdict {
    const g = e.groupIdx;
    if (g == null) return "index";
    const known = this.groups.get(g);
    if (this.main !== null) {
      if (g === this.main) return "index";
      return known && isMainKind(known.kind) ? "extra_main_group" : "non_main_group";
    }
    return known && !isMainKind(known.kind) ? "non_main_group" : "index";
  }

  toJSON(): { main: number | null; groups: { group_idx: number; kind: string | null; block_size: number; sliding_window: number | null }[] } {
    return {
      main: this.main,
      groups: [...this.groups].sort(([a], [b]) => a - b).map(([g, s]) => ({ group_idx: g, kind: s.kind, block_size: s.blockSize, sliding_window: s.slidingWindow })),
    };
  }
}
