import type { KvEvent } from "@kv-epp/kv-events";
import type { CacheEvent } from "../cache/prefix-cache.ts";
import { addCopy, takeCopy } from "./copies.ts";

/**
 * SGLang's KV events under EAGLE-family speculative decoding (`--spec-bigram`: EAGLE, EAGLE3, NEXTN/MTP):
 * its radix keys are bigrams, position j naming (t[j], t[j+1]), so a page's token_ids are those tuples
 * (mem_cache/events.py record_store) and a position is cached only with the token after it. A stored
 * run's last block is published only when its request has a token after it; one that ends the prompt
 * is not (SGLang's key is one position shorter than the prompt): it is left out of the event and out of
 * the removals that follow. The mock's own cache still holds it (see the README).
 */
export class BigramEvents {
  /** Hashes stored but never announced, with their copies. */
  private readonly unannounced = new Map<bigint, number>();

  constructor(private readonly blockSize: number) {}

  of(ch: CacheEvent, ev: KvEvent): KvEvent | null {
    if (ev.type === "AllBlocksCleared") {
      this.unannounced.clear();
      return ev;
    }
    if (ev.type === "BlockRemoved") {
      const hashes = ev.blockHashes.filter((h) => !takeCopy(this.unannounced, h));
      return hashes.length > 0 ? { ...ev, blockHashes: hashes } : null;
    }
    const c = ch.kind === "stored" ? ch.context : undefined;
    if (!c) throw new Error("--spec-bigram needs the cache's run context (PrefixCacheSim runContext)");
    const end = c.chain.length * this.blockSize;
    if (end < c.tokens.length) return { ...ev, bigramNextTokenId: c.tokens[end]! };
    const last = ev.blockHashes.at(-1)!;
    addCopy(this.unannounced, last);
    const n = ev.blockHashes.length - 1;
    if (n === 0) return null;
    return {
      ...ev,
      blockHashes: ev.blockHashes.slice(0, n),
      tokenIds: ev.tokenIds.slice(0, n * this.blockSize),
      ...(ev.extraKeys ? { extraKeys: ev.extraKeys.slice(0, n) } : {}),
      bigramNextTokenId: c.tokens[end - this.blockSize]!,
    };
  }
}
