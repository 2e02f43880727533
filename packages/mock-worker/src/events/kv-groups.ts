import type { BlockRemoved, BlockStored, ExtraKeyValue, KvEvent } from "@kv-epp/kv-events";
import { blockExtraKeys } from "../cache/block-hash.ts";
import type { CacheEvent } from "../cache/prefix-cache.ts";
import { addCopy, takeCopy } from "./copies.ts";
import { PartialEntries } from "./partial-entries.ts";

/**
 * vLLM's hybrid KV cache groups on the wire (`--kv-groups`): every cache change is published once per
 * group, tagged with group_idx, kind and window, each group with its own block size. vLLM hashes every
 * request at one granularity (hash_block_size, here `--block-size`); a group whose blocks are k times
 * larger publishes, for each of its blocks, the hash at the block's last hash-block boundary (that hash
 * already chains the whole prefix: vLLM's BlockHashListWithBlockSize), with token_ids spanning its own
 * blocks, block_size its own, and each block's extra keys built over its own span. A group block is stored when its last hash block is, and removed when
 * that hash block is evicted. A sliding-window group keeps only the blocks inside its window at the end
 * of a stored run: its BlockStored names just those (vLLM's mask) while token_ids still span the whole
 * run, and its removals name only blocks it stored.
 */
export type KvGroup = { kind: "full_attention" | "mla_attention" | "sliding_window"; blockSize: number; slidingWindow: number | null };

/** `kind:blockSize[:window],...`, e.g. `full_attention:32,sliding_window:16:128`. */
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

/** Turns one rank's cache changes into per-group events, remembering what each masked or regrouped group holds. */
export class GroupedEvents {
  /** Per group that does not publish every hash block (masked or larger blocks): copies of each hash it stored. */
  private readonly held: Map<bigint, number>[];

  /** vLLM's partial prefix-cache entries, when published (`--partial-entries`). */
  private readonly partial: PartialEntries | undefined;

  constructor(
    private readonly groups: readonly KvGroup[],
    /** The cache's block, vLLM's hash_block_size: every group's block size is a multiple of it. */
    private readonly hashBlockSize: number,
    partialEntries = false,
  ) {
    this.held = groups.map(() => new Map());
    this.partial = partialEntries ? new PartialEntries(hashBlockSize) : undefined;
  }

  expand(ch: CacheEvent, base: (ch: CacheEvent) => KvEvent): KvEvent[] {
    const ev = base(ch);
    return this.groups.flatMap((g, groupIdx): KvEvent[] => {
      const held = this.held[groupIdx]!;
      const tracked = g.slidingWindow !== null || g.blockSize !== this.hashBlockSize;
      if (ev.type === "AllBlocksCleared") {
        held.clear();
        this.partial?.clear();
        return groupIdx === 0 ? [ev] : []; // one reset clears every group
      }
      if (ev.type === "BlockRemoved") {
        const hashes = tracked ? ev.blockHashes.filter((h) => takeCopy(held, h)) : ev.blockHashes;
        for (const h of hashes) this.partial?.evicted(groupIdx, h);
        return hashes.length > 0 ? [{ ...ev, blockHashes: hashes, groupIdx } satisfies BlockRemoved] : [];
      }
      const stored = g.blockSize === this.hashBlockSize ? ev : ch.kind === "stored" ? this.regroup(ch, ev, g.blockSize) : null;
      if (!this.partial || ch.kind !== "stored") return this.groupStore(stored, groupIdx, g, held, tracked);
      // Promotion first (vLLM removes the partial hash before caching the full block), the run's own entry last.
      const promoted = this.partial.promoted(ch, stored, groupIdx, g, held);
      const full = this.groupStore(stored, groupIdx, g, held, tracked);
      const entry = this.partial.entry(ch, ev, groupIdx, g, held);
      return [...(promoted ? [promoted] : []), ...full, ...(entry ? [entry] : [])];
    });
  }

  /** A group's store of `stored` (the run in its own blocks), its window's mask applied. */
  private groupStore(stored: BlockStored | null, groupIdx: number, g: KvGroup, held: Map<bigint, number>, tracked: boolean): KvEvent[] {
    if (!stored) return [];
    const meta = { groupIdx, kvCacheSpecKind: g.kind, ...(g.slidingWindow !== null ? { kvCacheSpecSlidingWindow: g.slidingWindow } : {}) };
    const window = g.slidingWindow;
    let kept = stored.blockHashes;
    let extraKeys = stored.extraKeys;
    if (window !== null) {
      // Blocks that end within the window's reach of the run's last token are kept.
      const n = stored.blockHashes.length, end = n * g.blockSize;
      const first = stored.blockHashes.findIndex((_, i) => (i + 1) * g.blockSize > end - window);
      kept = first < 0 ? [] : stored.blockHashes.slice(first);
      extraKeys = stored.extraKeys?.slice(n - kept.length);
    }
    if (tracked) for (const h of kept) addCopy(held, h);
    if (kept.length === 0) return [];
    return [{ ...stored, ...meta, blockHashes: kept, ...(extraKeys !== undefined ? { extraKeys } : {}) } satisfies BlockStored];
  }

  /** The run as a group of `blockSize`-token blocks sees it: the group blocks whose last hash block it stored. */
  private regroup(ch: Extract<CacheEvent, { kind: "stored" }>, ev: BlockStored, blockSize: number): BlockStored | null {
    const c = ch.context;
    if (!c) throw new Error("a KV group with larger blocks needs the cache's run context (PrefixCacheSim runContext)");
    const k = blockSize / this.hashBlockSize;
    const first = Math.max(0, Math.ceil((c.start + 1) / k) - 1);
    const last = Math.floor(c.chain.length / k) - 1;
    if (last < first) return null;
    const hashes: bigint[] = [];
    const extraKeys: (ExtraKeyValue[] | null)[] = [];
    for (let m = first; m <= last; m++) {
      hashes.push(c.chain[(m + 1) * k - 1]!.hash);
      // vLLM builds a group block's extra keys over the group block's own span (the LoRA name once,
      // media offsets from its first token), not by joining its hash blocks' tuples.
      extraKeys.push(blockExtraKeys(c.identity, m * blockSize, (m + 1) * blockSize));
    }
    return {
      ...ev,
      blockHashes: hashes,
      parentBlockHash: first > 0 ? c.chain[first * k - 1]!.hash : null,
      tokenIds: Array.from(c.tokens.subarray(first * blockSize, (last + 1) * blockSize)),
      blockSize,
      ...(ev.extraKeys !== undefined ? { extraKeys } : {}),
    };
  }
}
