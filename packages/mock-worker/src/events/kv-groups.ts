import type { BlockRemoved, BlockStored, KvEvent } from "@kv-epp/kv-events";
import type { CacheEvent } from "../cache/prefix-cache.ts";

/**
 * vLLM's hybrid KV cache groups on the wire (`--kv-groups`): every cache change is published once per
 * group, tagged with group_idx, kind and window. All groups share the rank's block size (so one block
 * has one hash in every group, as in vLLM when groups have one block size). A sliding-window group
 * keeps only the blocks inside its window at the end of a stored run: its BlockStored names just
 * those (vLLM's mask) while token_ids still span the whole run, and its removals name only blocks it
 * stored. Per-group block sizes are not modelled.
 */
export type KvGroup = { kind: "full_attention" | "mla_attention" | "sliding_window"; blockSize: number; slidingWindow: number | null };

/** `kind:blockSize[:window],...`, e.g. `full_attention:16,sliding_window:16:128`. */
export function parseKvGroups(v: string): KvGroup[] {
  return v.split(",").map((spec) => {
    const [kind, size, window] = spec.trim().split(":");
    if (kind !== "full_attention" && kind !== "mla_attention" && kind !== "sliding_window") throw new Error(`unknown KV group kind ${JSON.stringify(kind)}`);
    const blockSize = Number(size);
    if (!Number.isInteger(blockSize) || blockSize <= 0) throw new Error(`KV group ${JSON.stringify(spec)}: block size must be a positive integer`);
    const slidingWindow = window === undefined ? null : Number(window);
    if ((kind === "sliding_window") !== (slidingWindow !== null) || (slidingWindow !== null && !(Number.isInteger(slidingWindow) && slidingWindow > 0)))
      throw new Error(`KV group ${JSON.stringify(spec)}: a sliding_window group, and only it, takes a positive window`);
    return { kind, blockSize, slidingWindow };
  });
}

/** Turns one rank's cache changes into per-group events, remembering what each masked group holds. */
export class GroupedEvents {
  /** Per sliding-window group: copies of each hash it stored. */
  private readonly held: Map<bigint, number>[];

  constructor(private readonly groups: readonly KvGroup[]) {
    this.held = groups.map(() => new Map());
  }

  expand(ch: CacheEvent, base: (ch: CacheEvent) => KvEvent): KvEvent[] {
    const ev = base(ch);
    return this.groups.flatMap((g, groupIdx): KvEvent[] => {
      const held = this.held[groupIdx]!;
      if (ev.type === "AllBlocksCleared") {
        held.clear();
        return groupIdx === 0 ? [ev] : []; // one reset clears every group
      }
      if (ev.type === "BlockRemoved") {
        const hashes = g.slidingWindow === null ? ev.blockHashes : ev.blockHashes.filter((h) => take(held, h));
        return hashes.length > 0 ? [{ ...ev, blockHashes: hashes, groupIdx } satisfies BlockRemoved] : [];
      }
      const meta = { groupIdx, kvCacheSpecKind: g.kind, ...(g.slidingWindow !== null ? { kvCacheSpecSlidingWindow: g.slidingWindow } : {}) };
      const window = g.slidingWindow;
      if (window === null) return [{ ...ev, ...meta } satisfies BlockStored];
      // Blocks that end within the window's reach of the run's last token are kept.
      const n = ev.blockHashes.length, end = n * g.blockSize;
      const first = ev.blockHashes.findIndex((_, i) => (i + 1) * g.blockSize > end - window);
      const kept = first < 0 ? [] : ev.blockHashes.slice(first);
      for (const h of kept) held.set(h, (held.get(h) ?? 0) + 1);
      return kept.length > 0 ? [{ ...ev, ...meta, blockHashes: kept, extraKeys: ev.extraKeys?.slice(n - kept.length) }] : [];
    });
  }
}

function take(held: Map<bigint, number>, h: bigint): boolean {
  const n = held.get(h);
  if (!n) return false;
  if (n === 1) held.delete(h);
  else held.set(h, n - 1);
  return true;
}
