import { describe, expect, test } from "bun:test";
import fc from "fast-check";
import { chainBlockIds, foldDigest } from "../src/cache/block-hash.ts";
import { PrefixCacheSim, type CacheEvent, type Lease } from "../src/cache/prefix-cache.ts";

const BS = 4;
const seq = (from: number, n: number) => Uint32Array.from({ length: n }, (_, i) => from + i);

/** Applies published events to copy counts, as a subscriber's index must (vLLM does not deduplicate). */
function follow(cache: PrefixCacheSim) {
  const held = new Map<bigint, number>();
  const log: CacheEvent[] = [];
  cache.subscribe((events) => {
    for (const e of events) {
      log.push(e);
      if (e.kind === "stored") {
        if (e.parent !== null) expect(held.has(e.parent)).toBe(true);
        for (const h of e.hashes) held.set(h, (held.get(h) ?? 0) + 1);
      } else if (e.kind === "removed") {
        for (const h of e.hashes) {
          const n = held.get(h) ?? 0;
          expect(n).toBeGreaterThan(0);
          if (n === 1) held.delete(h);
          else held.set(h, n - 1);
        }
      } else held.clear();
    }
  });
  return { held, log };
}

const plain = (e: { hashes: bigint[] }) => ({ extraKeys: e.hashes.map(() => null), loraName: null, loraId: null });

describe("block hashes", () => {
  test("each block's id names its whole prefix and int ids are the folded digest", () => {
    const a = chainBlockIds(Uint32Array.of(1, 2, 3, 4, 5, 6, 7, 8, 9), BS);
    const b = chainBlockIds(Uint32Array.of(9, 9, 9, 9, 5, 6, 7, 8), BS);
    expect(a.length).toBe(2); // the partial tail is not hashed
    expect(a[1]!.hash).not.toBe(b[1]!.hash); // same tokens, different parent
    for (const id of a) {
      expect(id.digest.length).toBe(32);
      expect(id.hash).toBe(foldDigest(id.digest));
      expect(id.hash).toBe(BigInt("0x" + Buffer.from(id.digest.subarray(24)).toString("hex")));
    }
    expect(chainBlockIds(Uint32Array.of(1, 2, 3, 4), BS)[0]!.hash).toBe(a[0]!.hash);
  });
});

describe("NONE_HASH (--hash-seed)", () => {
  const storedHashes = (cache: PrefixCacheSim, prompt: Uint32Array) => {
    const { log } = follow(cache);
    cache.acquire(prompt);
    return log.flatMap((e) => (e.kind === "stored" ? e.hashes : []));
  };
  const prompt = seq(1, 8);

  test("engines sharing PYTHONHASHSEED name a prefix alike; another seed, or none, names it otherwise", () => {
    const seeded = (hashSeed?: string) => storedHashes(new PrefixCacheSim({ blockSize: BS, capacityBlocks: 10, hashSeed }), prompt);
    expect(seeded("42")).toEqual(seeded("42"));
    expect(seeded("42")[0]).not.toBe(seeded("43")[0]!);
    expect(seeded("42")[0]).not.toBe(seeded()[0]!);
    expect(seeded()).toEqual(chainBlockIds(prompt, BS).map((b) => b.hash));
  });

  test("random: each engine draws its own, and a restarted one (a silent clear) a new one, while it matches its own blocks", () => {
    const a = new PrefixCacheSim({ blockSize: BS, capacityBlocks: 10, hashSeed: "random" });
    const b = new PrefixCacheSim({ blockSize: BS, capacityBlocks: 10, hashSeed: "random" });
    const before = storedHashes(a, prompt);
    expect(before[0]).not.toBe(storedHashes(b, prompt)[0]!);
    expect(a.peekHitBlocks(prompt)).toBe(2);
    a.clear(); // reset_prefix_cache: same process, same NONE_HASH
    expect(storedHashes(a, prompt)).toEqual(before);
    a.clear({ silent: true }); // a restart
    expect(storedHashes(a, prompt)[0]).not.toBe(before[0]!);
    expect(a.peekHitBlocks(prompt)).toBe(2);
  });
});

describe("PrefixCacheSim", () => {
  test("a repeated prompt hits its cached blocks and stores nothing new", () => {
    const cache = new PrefixCacheSim({ blockSize: BS, capacityBlocks: 100 });
    const { held, log } = follow(cache);
    const prompt = seq(100, 10); // two full blocks + 2 tokens
    const first = cache.acquire(prompt);
    expect(first.cachedTokens).toBe(0);
    const hashes = chainBlockIds(prompt, BS).map((i) => i.hash);
    expect(log).toEqual([{ kind: "stored", parent: null, hashes, tokenIds: Array.from(prompt.subarray(0, 8)), ...plain({ hashes }) }]);
    cache.release(first.lease);
    const second = cache.acquire(prompt);
    expect(second.cachedTokens).toBe(8);
    expect(second.storedBlocks).toBe(0);
    expect(log.length).toBe(1);
    expect(held).toEqual(cache.copies());
    expect(cache.hitTokens).toBe(8);
    expect(cache.queriedTokens).toBe(20);
  });

  test("a longer prompt stores only its new blocks, chained to the cached parent", () => {
    const cache = new PrefixCacheSim({ blockSize: BS, capacityBlocks: 100 });
    const { log } = follow(cache);
    cache.release(cache.acquire(seq(0, 8)).lease);
    const ids = chainBlockIds(seq(0, 16), BS);
    const acq = cache.acquire(seq(0, 16));
    expect(acq.hitBlocks).toBe(2);
    const hashes = [ids[2]!.hash, ids[3]!.hash];
    expect(log[1]).toEqual({ kind: "stored", parent: ids[1]!.hash, hashes, tokenIds: Array.from(seq(8, 8)), ...plain({ hashes }) });
  });

  test("eviction removes exactly the least recently used unreferenced blocks, tails first", () => {
    const cache = new PrefixCacheSim({ blockSize: BS, capacityBlocks: 4 });
    const { held, log } = follow(cache);
    const a = chainBlockIds(seq(0, 8), BS);
    cache.release(cache.acquire(seq(0, 8)).lease);
    cache.release(cache.acquire(seq(50, 8)).lease);
    const running = cache.acquire(seq(90, 8)); // needs 2 slots: a's blocks are the oldest
    const removed = log.filter((e) => e.kind === "removed");
    expect(removed).toEqual([{ kind: "removed", hashes: [a[1]!.hash, a[0]!.hash] }]);
    // Removals come before the stores that reuse the slots, in one batch.
    expect(log.at(-2)!.kind).toBe("removed");
    expect(log.at(-1)!.kind).toBe("stored");
    expect(held).toEqual(cache.copies());
    expect(cache.usedBlocks).toBe(4);
    // Referenced blocks are never evicted: with everything else evicted, only what fits is cached.
    const big = cache.acquire(seq(200, 16));
    expect(big.storedBlocks).toBe(2);
    for (const h of chainBlockIds(seq(90, 8), BS)) expect(cache.residentHashes().has(h.hash)).toBe(true);
    cache.release(running.lease);
    cache.release(big.lease);
    expect(held).toEqual(cache.copies());
  });

  test("usage is vLLM's kv_cache_usage_perc: the share of slots running requests reference, cached free blocks not counted", () => {
    const cache = new PrefixCacheSim({ blockSize: BS, capacityBlocks: 8 });
    expect(cache.usage).toBe(0);
    const a = cache.acquire(seq(0, 16)); // 4 blocks, all referenced while it runs
    expect(cache.usage).toBe(4 / 8);
    const b = cache.acquire(seq(0, 12)); // shares a's first 2 blocks (its third is recomputed: a copy)
    expect(cache.usage).toBe(5 / 8);
    cache.release(a.lease);
    // a's blocks stay cached (usedBlocks) but are evictable again: only b's are in use
    expect(cache.usedBlocks).toBe(5);
    expect(cache.usage).toBe(3 / 8);
    cache.release(b.lease);
    expect(cache.usage).toBe(0);
    expect(cache.usedBlocks).toBe(5);
  });

  test("a prompt of whole blocks sent again recomputes its last block and stores a second copy; evicting one copy keeps the other", () => {
    const cache = new PrefixCacheSim({ blockSize: BS, capacityBlocks: 5 });
    const { held, log } = follow(cache);
    const ids = chainBlockIds(seq(0, 8), BS);
    cache.release(cache.acquire(seq(0, 8)).lease);
    const again = cache.acquire(seq(0, 8));
    expect(again.hitBlocks).toBe(1); // vLLM computes at least the last token
    expect(log.at(-1)).toEqual({ kind: "stored", parent: ids[0]!.hash, hashes: [ids[1]!.hash], tokenIds: Array.from(seq(4, 4)), ...plain({ hashes: [0n] }) });
    expect(cache.copies().get(ids[1]!.hash)).toBe(2);
    expect(cache.usedBlocks).toBe(3);
    cache.release(again.lease);
    // Three new blocks need one slot: the LRU copy of block 1 goes, the other stays a hit.
    cache.release(cache.acquire(seq(100, 12)).lease);
    expect(log.at(-2)).toEqual({ kind: "removed", hashes: [ids[1]!.hash] });
    expect(cache.copies().get(ids[1]!.hash)).toBe(1);
    expect(cache.peekHitBlocks(seq(0, 8))).toBe(2);
    expect(held).toEqual(cache.copies());
  });

  test("LoRA name (every block), cache salt (block 0) and media (overlapping blocks) name other blocks than the same tokens", () => {
    const cache = new PrefixCacheSim({ blockSize: BS, capacityBlocks: 100 });
    const { log } = follow(cache);
    const prompt = seq(0, 12);
    const base = chainBlockIds(prompt, BS).map((b) => b.hash);
    const lora = chainBlockIds(prompt, BS, { loraName: "sql" });
    const salted = chainBlockIds(prompt, BS, { cacheSalt: "t1" });
    const media = chainBlockIds(prompt, BS, { media: [{ identifier: "img", offset: 6, length: 4 }] });
    expect(lora.map((b) => b.extraKeys)).toEqual([["sql"], ["sql"], ["sql"]]);
    expect(salted.map((b) => b.extraKeys)).toEqual([["t1"], null, null]);
    expect(media.map((b) => b.extraKeys)).toEqual([null, [["img", 2]], [["img", -2]]]);
    for (const other of [lora, salted]) for (let i = 0; i < 3; i++) expect(other[i]!.hash).not.toBe(base[i]!);
    expect(media[0]!.hash).toBe(base[0]!);
    expect(media[1]!.hash).not.toBe(base[1]!);
    cache.acquire(prompt, { loraName: "sql", loraId: 3 });
    expect(log.at(-1)).toMatchObject({ kind: "stored", hashes: lora.map((b) => b.hash), extraKeys: [["sql"], ["sql"], ["sql"]], loraName: "sql", loraId: 3 });
    expect(cache.peekHitBlocks(prompt)).toBe(0);
    expect(cache.peekHitBlocks(prompt, { loraName: "sql" })).toBe(3);
  });

  test("admitted, a prompt caches its blocks chunk by chunk as its steps are allocated, each chained to the last", () => {
    const cache = new PrefixCacheSim({ blockSize: BS, capacityBlocks: 100 });
    const { log } = follow(cache);
    const prompt = seq(0, 22); // five full blocks and 2 tokens
    const ids = chainBlockIds(prompt, BS).map((b) => b.hash);
    const acq = cache.admit(prompt);
    expect([acq.hitBlocks, acq.storedBlocks, log.length, cache.queriedTokens]).toEqual([0, 0, 0, 0]);
    expect(cache.allocate(acq.lease, 8)).toBe(true);
    expect(cache.queriedTokens).toBe(22); // counted once scheduled
    expect(cache.peekHitBlocks(prompt)).toBe(2);
    expect(cache.allocate(acq.lease, 11)).toBe(true); // a partial block: held, not cached
    expect([cache.peekHitBlocks(prompt), cache.usedBlocks]).toEqual([2, 3]);
    // A request admitted now hits what has been scheduled so far, no more.
    const sibling = cache.admit(prompt);
    expect(sibling.hitBlocks).toBe(2);
    expect(cache.allocate(acq.lease, 22)).toBe(true);
    expect(log.map((e) => (e.kind === "stored" ? [e.parent, e.hashes] : e.kind))).toEqual([
      [null, ids.slice(0, 2)],
      [ids[1]!, ids.slice(2)],
    ]);
    expect(acq.lease.rest).toBeUndefined(); // done: the tokens are let go
    // Decoding: one uncached block per block of generated tokens.
    expect(cache.allocate(acq.lease, 29)).toBe(true);
    expect(cache.usedBlocks).toBe(8);
    expect(cache.usage).toBe(0.08);
    cache.release(acq.lease);
    cache.release(sibling.lease);
    expect([cache.usedBlocks, cache.usage]).toEqual([5, 0]); // the cached five stay, evictable
    expect(cache.queriedTokens).toBe(22); // the sibling was never scheduled
  });

  test("allocation is all or nothing: a request that cannot get its blocks changes nothing; a clear leaves old leases holding nothing", () => {
    const cache = new PrefixCacheSim({ blockSize: BS, capacityBlocks: 4 });
    const { held } = follow(cache);
    const a = cache.admit(seq(0, 20)).lease;
    expect(cache.allocate(a, 8)).toBe(true);
    const other = cache.acquire(seq(500, 4)).lease; // a third slot, held
    expect(cache.allocate(a, 16)).toBe(false); // two more needed, one free
    expect([cache.usedBlocks, cache.peekHitBlocks(seq(0, 20))]).toEqual([3, 2]);
    cache.release(other); // its block becomes evictable: room for two
    expect(cache.allocate(a, 16)).toBe(true);
    expect(held).toEqual(cache.copies());
    expect(cache.usedBlocks).toBe(4);
    const b = cache.admit(seq(100, 20)).lease;
    expect(cache.allocate(b, 4)).toBe(false); // everything is a's
    cache.release(b);
    cache.clear();
    expect(cache.allocate(a, 20)).toBe(true); // from before the clear: let run, holding nothing
    expect(cache.usedBlocks).toBe(0);
    cache.release(a);
    expect(cache.usedBlocks).toBe(0);
  });

  test("clear publishes AllBlocksCleared, a silent clear publishes nothing", () => {
    const cache = new PrefixCacheSim({ blockSize: BS, capacityBlocks: 10 });
    const { log } = follow(cache);
    const lease = cache.acquire(seq(0, 8)).lease;
    cache.clear();
    expect(log.at(-1)).toEqual({ kind: "cleared" });
    expect(cache.usedBlocks).toBe(0);
    cache.release(lease); // a lease from before the clear is harmless
    cache.acquire(seq(0, 8));
    const n = log.length;
    cache.clear({ silent: true });
    expect(log.length).toBe(n);
  });

  test("published events always reproduce the cache's resident set (property)", () => {
    const prompt = fc.record({ stem: fc.integer({ min: 0, max: 3 }), len: fc.integer({ min: 0, max: 20 }) });
    const op = fc.oneof(
      fc.record({ kind: fc.constant("acquire" as const), prompt }),
      fc.record({ kind: fc.constant("admit" as const), prompt }),
      fc.record({ kind: fc.constant("compute" as const), pick: fc.nat(), tokens: fc.integer({ min: 1, max: 9 }) }),
      fc.record({ kind: fc.constant("release" as const), pick: fc.nat() }),
      fc.record({ kind: fc.constant("clear" as const), silent: fc.boolean() }),
    );
    fc.assert(
      fc.property(fc.integer({ min: 1, max: 8 }), fc.array(op, { maxLength: 60 }), (capacity, ops) => {
        const cache = new PrefixCacheSim({ blockSize: BS, capacityBlocks: capacity });
        const { held } = follow(cache);
        const leases: { lease: Lease; computed: number }[] = [];
        for (const o of ops) {
          const used = cache.usedBlocks;
          if (o.kind === "acquire") leases.push({ lease: cache.acquire(seq(o.prompt.stem * 1000, o.prompt.len)).lease, computed: o.prompt.len });
          else if (o.kind === "admit") {
            const acq = cache.admit(seq(o.prompt.stem * 1000, o.prompt.len));
            leases.push({ lease: acq.lease, computed: acq.cachedTokens });
            expect(cache.usedBlocks).toBe(used); // a lookup takes no slot
          } else if (o.kind === "clear") {
            cache.clear({ silent: o.silent });
            if (o.silent) held.clear(); // a restart: the subscriber resyncs from nothing
          } else if (leases.length > 0) {
            const at = o.pick % leases.length;
            if (o.kind === "release") cache.release(leases.splice(at, 1)[0]!.lease);
            else {
              const l = leases[at]!;
              if (cache.allocate(l.lease, l.computed + o.tokens)) l.computed += o.tokens;
              else expect(cache.usedBlocks).toBe(used); // refused: nothing changed
            }
          }
          expect(cache.usedBlocks).toBeLessThanOrEqual(capacity);
          expect(held).toEqual(cache.copies());
        }
      }),
      { numRuns: 300 },
    );
  });
});
