// Property: the EPP's overlap equals vLLM's true hit after every step. The reference is the mock
// worker's cache (vLLM's identity: parent-chained hashes under a NONE_HASH of each rank's own, so hashes
// spread over the whole u64 range, LoRA names and salts in the extra keys, copies that are never
// deduplicated, evictions), its changes published as vLLM's events
// (per KV group when the rank has groups, a main group's blocks up to twice the hash block, with or
// without vLLM's partial prefix-cache entries inside its blocks), through
// the wire encoder and decoder into live ingestion;
// the probe is hashed as the picker hashes a request. Then the same for a replica recovered from a dump.
import { expect, test } from "bun:test";
import fc from "fast-check";
import { computeBlockHashes, requestBlockExtras } from "@kv-epp/index-wasm";
import { findMatches } from "@kv-epp/index-wasm/helpers";
import { decodeBatch, encodeBatch, type EventEncoding } from "@kv-epp/kv-events";
import { parseKvGroups, PrefixCacheSim, RankEvents, type Lease, type RequestIdentity } from "@kv-epp/mock-worker";
import { workerKey, type WorkerRef } from "@kv-epp/protocol";
import { dumpBodyParser, dumpChunks } from "@kv-epp/recovery";
import { createMetrics } from "../metrics.ts";
import { Indexers } from "./indexers.ts";

const BS = 4;
const MODEL = "m";
const KEY = "m:default";
const ADAPTERS = ["sql", "chat"];
const RANKS: WorkerRef[] = [{ workerId: "a", dpRank: 0 }, { workerId: "a", dpRank: 1 }, { workerId: "b", dpRank: 0 }];

type Req = { stem: number; body: number; length: number; model: string | undefined; salt: string | undefined };
type Step = { rank: number; req: Req; hold: boolean; probes: Req[] };

const req: fc.Arbitrary<Req> = fc.record({
  stem: fc.integer({ min: 0, max: 2 }),
  body: fc.integer({ min: 0, max: 3 }),
  // whole-block prompts (a repeat stores a second copy of the last block) and partial tails
  length: fc.oneof(fc.constantFrom(BS, 2 * BS, 3 * BS, 4 * BS), fc.integer({ min: 1, max: 5 * BS })),
  model: fc.constantFrom(undefined, MODEL, ...ADAPTERS),
  salt: fc.constantFrom(undefined, undefined, "tenant-a", "tenant-b"),
});
const step: fc.Arbitrary<Step> = fc.record({
  rank: fc.integer({ min: 0, max: RANKS.length - 1 }),
  req,
  hold: fc.boolean(),
  probes: fc.array(req, { minLength: 1, maxLength: 2 }),
});
const run = fc.record({
  encoding: fc.constantFrom<EventEncoding>("vllm", "vllm-map", "vllm-array"),
  // no groups (one untagged group), full attention beside a sliding window (vLLM's mask on the latter),
  // or full attention with blocks twice the hash block (its own block size, hashes and extra keys)
  groups: fc.constantFrom(
    "", `full_attention:${BS},sliding_window:${BS}:${2 * BS}`, `sliding_window:${BS}:${BS},full_attention:${BS}`,
    `sliding_window:${BS}:${BS},full_attention:${2 * BS}`,
  ),
  // with a main group of larger blocks, vLLM's partial prefix-cache entries (--prefix-match-unit)
  partialEntries: fc.boolean(),
  steps: fc.array(step, { minLength: 5, maxLength: 40 }),
});

/** A prompt: a shared stem, then a body few prompts share, cut at `length`. */
function tokens(r: Req): Uint32Array {
  const out = new Uint32Array(r.length);
  for (let i = 0; i < r.length; i++) out[i] = i < 2 * BS ? 1000 * r.stem + i : 100_000 + 1000 * r.body + i;
  return out;
}

const identityOf = (r: Req): RequestIdentity => ({ loraName: r.model && ADAPTERS.includes(r.model) ? r.model : null, cacheSalt: r.salt ?? null });

/** The overlap the EPP reports for the request at each rank, hashed as the picker hashes it. */
function overlaps(ixs: Indexers, r: Req): number[] {
  const resolved = ixs.models.resolve(r.model)!;
  const t = tokens(r);
  const bs = resolved.indexer.blockSize;
  const n = Math.floor(t.length / bs);
  if (n === 0) return RANKS.map(() => 0);
  const extras = resolved.loraName || r.salt ? requestBlockExtras(n, bs, { loraName: resolved.loraName, cacheSalt: r.salt }) : undefined;
  const scores = findMatches(resolved.indexer.index, computeBlockHashes(t, bs, extras)).scores;
  return RANKS.map((w) => scores.get(workerKey(w)) ?? 0);
}

/**
 * One Indexers per main block size for every run, its ranks removed between runs: each KvIndex is a
 * WebAssembly instance, whose linear memory JSC frees only by a full collection, and a fresh pair per
 * run took over a minute beside the whole suite's heap.
 */
function emptied(pool: Map<number, Indexers>, blockSize: number): Indexers {
  let ixs = pool.get(blockSize);
  if (!ixs) {
    ixs = new Indexers(createMetrics());
    ixs.models.register(MODEL, "default", blockSize);
    for (const a of ADAPTERS) ixs.models.registerAdapter(a, MODEL);
    pool.set(blockSize, ixs);
  }
  for (const w of RANKS) ixs.removeWorker(w);
  return ixs;
}
const live = new Map<number, Indexers>();
const joiners = new Map<number, Indexers>();

test("after every step the EPP's overlap per rank equals the rank's true hit, with copies, groups, adapters and salts; and after a recovery", () => {
  let highHashes = 0;
  const reached = { copies: 0, removals: 0, partialEntries: 0 };
  fc.assert(
    fc.property(run, ({ encoding, groups, partialEntries, steps }) => {
      const kvGroups = groups === "" ? [] : parseKvGroups(groups);
      // Hash blocks per main-group block: the main group holds its block m while hash block (m+1)k-1 is
      // cached (vLLM's hash at the group block's last hash-block boundary).
      const k = (kvGroups.find((g) => g.kind === "full_attention")?.blockSize ?? BS) / BS;
      const ixs = emptied(live, k * BS);
      const caches = RANKS.map((w) => {
        const cache = new PrefixCacheSim({ blockSize: BS, capacityBlocks: 10, hashSeed: "random", runContext: k > 1 });
        const events = new RankEvents(BS, encoding, kvGroups, { partialEntries: partialEntries && k > 1 });
        let seq = 0n;
        cache.subscribe((changes) => {
          const batch = decodeBatch(encodeBatch({ ts: 1, events: events.of(changes), dataParallelRank: w.dpRank }, { encoding }));
          for (const e of batch.events) {
            if (e.type === "BlockStored") highHashes += e.blockHashes.filter((h) => h >= 1n << 63n).length;
            if (e.type === "BlockStored" && e.kvCacheSpecKind === "full_attention" && e.blockSize < k * BS) reached.partialEntries++;
            else if (e.type === "BlockRemoved") reached.removals++;
          }
          ixs.live.apply(KEY, w, { kind: "batch", seq: seq++, batch });
        });
        return cache;
      });
      const truth = (r: Req) =>
        caches.map((c) => {
          const ids = c.blockIds(tokens(r), identityOf(r));
          const resident = c.residentHashes();
          let m = 0;
          while ((m + 1) * k - 1 < ids.length && resident.has(ids[(m + 1) * k - 1]!.hash)) m++;
          return m;
        });
      const held: { cache: PrefixCacheSim; lease: Lease }[] = [];
      for (const [i, s] of steps.entries()) {
        const cache = caches[s.rank]!;
        const got = cache.acquire(tokens(s.req), { ...identityOf(s.req), loraId: s.req.model ? ADAPTERS.indexOf(s.req.model) + 1 || null : null });
        // A running request keeps its blocks from eviction; most end at once.
        held.push({ cache, lease: got.lease });
        while (held.length > (s.hold ? 2 : 0)) {
          const h = held.shift()!;
          h.cache.release(h.lease);
        }
        for (const p of [s.req, ...s.probes]) expect({ step: i, p, overlap: overlaps(ixs, p) }).toEqual({ step: i, p, overlap: truth(p) });
        if ([...cache.copies().values()].some((n) => n > 1)) reached.copies++;
      }
      // A replica recovering from this one's dump scores every identity alike.
      const joiner = emptied(joiners, k * BS);
      const staging = joiner.recovery.begin();
      const parser = dumpBodyParser(staging, "json");
      parser.push(Buffer.concat([...dumpChunks(ixs.recovery)]));
      parser.end();
      staging.commit();
      for (const s of steps) for (const p of [s.req, ...s.probes]) expect({ recovered: true, p, overlap: overlaps(joiner, p) }).toEqual({ recovered: true, p, overlap: truth(p) });
    }),
    { numRuns: 30, seed: 16 },
  );
  // The workload reached what it is for: hashes from the whole u64 range (the upper half included),
  // second copies and evictions. (A block outliving its parent does not arise here: vLLM frees a
  // request's blocks tail first and a hit touches the parent too; the index's rule for it is checked in
  // index-wasm's property test.)
  expect(highHashes).toBeGreaterThan(100);
  expect(reached.copies).toBeGreaterThan(4);
  expect(reached.removals).toBeGreaterThan(50);
  expect(reached.partialEntries).toBeGreaterThan(10);
}, 60_000);
