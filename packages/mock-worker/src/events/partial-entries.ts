import type { BlockRemoved, BlockStored } from "@kv-epp/kv-events";
import { blockExtraKeys } from "../cache/block-hash.ts";
import type { CacheEvent } from "../cache/prefix-cache.ts";
import { addCopy, takeCopy } from "./copies.ts";
import type { KvGroup } from "./kv-groups.ts";

/**
 * vLLM's partial prefix-cache entries (`--partial-entries`: a hybrid model served with
 * --prefix-match-unit, vLLM #45939/#46384), for a main group whose blocks are k > 1 hash blocks. A
 * stored run that ends inside one of the group's blocks registers the hash at its end, and vLLM's
 * BlockPool.cache_partial_block publishes it: BlockStored([hash at the end], parent = the hash one unit
 * earlier, token_ids = the last unit's tokens, block_size = the unit, the group's idx and kind). When
 * the group block later completes, the entry is promoted: BlockRemoved of the partial hash, then the
 * full block's store; an evicted hash block takes its partial entry with it (the caller's held map).
 */
export class PartialEntries {
  /** Partial hashes registered per group, with their copies. */
  private readonly partials = new Map<number, Map<bigint, number>>();

  constructor(private readonly hashBlockSize: number) {}

  /** Removal of the partial entries the full blocks of `stored` promote (null: none). */
  promoted(ch: Extract<CacheEvent, { kind: "stored" }>, stored: BlockStored | null, groupIdx: number, g: KvGroup, held: Map<bigint, number>): BlockRemoved | null {
    const mine = this.partials.get(groupIdx);
    const c = ch.context;
    if (!stored || !mine || mine.size === 0 || !c) return null;
    const k = g.blockSize / this.hashBlockSize;
    const last = Math.floor(c.chain.length / k) - 1;
    const first = last - stored.blockHashes.length + 1;
    const hashes: bigint[] = [];
    for (let j = first * k; j < (last + 1) * k - 1; j++) {
      const h = c.chain[j]!.hash;
      if (takeCopy(mine, h)) {
        takeCopy(held, h);
        hashes.push(h);
      }
    }
    return hashes.length > 0 ? { type: "BlockRemoved", blockHashes: hashes, medium: "GPU", groupIdx } : null;
  }

  /** The run's partial entry in group `groupIdx` (null: the run ends on one of the group's block boundaries). */
  entry(ch: Extract<CacheEvent, { kind: "stored" }>, base: BlockStored, groupIdx: number, g: KvGroup, held: Map<bigint, number>): BlockStored | null {
    const c = ch.context;
    const u = this.hashBlockSize;
    const k = g.blockSize / u;
    if (!c || k <= 1 || g.kind === "sliding_window") return null;
    const n = c.chain.length;
    if (n % k === 0) return null;
    const hash = c.chain[n - 1]!.hash;
    addCopy(held, hash);
    let mine = this.partials.get(groupIdx);
    if (!mine) this.partials.set(groupIdx, (mine = new Map()));
    addCopy(mine, hash);
    return {
      ...base,
      blockHashes: [hash],
      parentBlockHash: n > 1 ? c.chain[n - 2]!.hash : null,
      tokenIds: Array.from(c.tokens.subarray((n - 1) * u, n * u)),
      blockSize: u,
      ...(base.extraKeys !== undefined ? { extraKeys: [blockExtraKeys(c.identity, (n - 1) * u, n * u)] } : {}),
      groupIdx,
      kvCacheSpecKind: g.kind,
    };
  }

  /** An evicted hash that was a partial entry no longer is one. */
  evicted(groupIdx: number, h: bigint): void {
    const mine = this.partials.get(groupIdx);
    if (mine) takeCopy(mine, h);
  }

  clear(): void {
    this.partials.clear();
  }
}
