import { afterEach, describe, expect, test } from "bun:test";
import { DealerSocket, decodeBatch, decodeSeq, encodeSeq, END_SEQ, type BlockStored } from "@kv-epp/kv-events";
import { chainBlockIds, startMockWorker, type CacheTruth, type MockWorker, type MockWorkerOptions } from "../src/index.ts";
import { waitFor, LOOPBACK } from "@kv-epp/testkit";
import { post, residentFromEvents, subscribe, syncSubscribers, type Received } from "./support.ts";

const BS = 4;
const ids = (from: number, n: number) => Array.from({ length: n }, (_, i) => from + i);
const hashesOf = (tokens: number[]) => chainBlockIds(Uint32Array.from(tokens), BS).map((b) => b.hash);
const stored = (ms: Received[]) => ms.flatMap((m) => m.batch.events).filter((e): e is BlockStored => e.type === "BlockStored");

const cleanup: (() => Promise<unknown>)[] = [];
afterEach(async () => {
  for (const f of cleanup.splice(0).reverse()) await f().catch(() => {});
});

async function worker(opts: MockWorkerOptions): Promise<MockWorker> {
  const w = await startMockWorker({ listen: `${LOOPBACK}.2.1`, port: 0, kvEvents: `tcp://${LOOPBACK}.2.1:0`, speed: 0, blockSize: BS, logLevel: "silent", ...opts });
  cleanup.push(() => w.close());
  return w;
}

async function subscribed(w: MockWorker) {
  const subs = w.ranks.map((r) => subscribe(r.kvEvents));
  for (const s of subs) cleanup.push(() => s.close());
  await syncSubscribers(w.url, subs);
  return subs;
}

async function complete(w: MockWorker, prompt: number[], headers: Record<string, string> = {}) {
  // One token: produced by the prefill step, so no decode block takes a slot (and evicts) in these runs.
  const res = await post(`${w.url}/v1/completions`, { prompt, max_tokens: 1 }, headers);
  expect(res.status).toBe(200);
  return (await res.json()) as { usage: { prompt_tokens: number; prompt_tokens_details: { cached_tokens: number } | null } };
}

describe("KV events", () => {
  test("stored events match the simulated cache and a repeated prompt stores nothing new", async () => {
    const w = await worker({ capacityBlocks: 1000 });
    const [sub] = await subscribed(w);
    const prompt = ids(0, 22); // 5 full blocks + 2 tokens

    expect((await complete(w, prompt)).usage.prompt_tokens_details?.cached_tokens ?? 0).toBe(0);
    await waitFor(() => sub!.messages.length === 1, { message: "the first BlockStored" });
    const first = sub!.messages[0]!.batch;
    expect(first.dataParallelRank).toBe(0); // newer vLLM tags every batch, rank 0 without DP
    expect(first.events).toEqual([
      { type: "BlockStored", blockHashes: hashesOf(prompt), parentBlockHash: null, tokenIds: prompt.slice(0, 20), blockSize: BS, loraId: null, medium: "GPU", loraName: null, extraKeys: [null, null, null, null, null] },
    ]);

    expect((await complete(w, prompt)).usage.prompt_tokens_details?.cached_tokens ?? 0).toBe(20);
    const longer = [...prompt.slice(0, 20), ...ids(500, 8)];
    expect((await complete(w, longer)).usage.prompt_tokens_details?.cached_tokens ?? 0).toBe(20);
    await waitFor(() => sub!.messages.length === 2, { message: "the second BlockStored" });
    const all = hashesOf(longer);
    expect(sub!.messages[1]!.batch.events).toEqual([
      { type: "BlockStored", blockHashes: all.slice(5), parentBlockHash: all[4]!, tokenIds: ids(500, 8), blockSize: BS, loraId: null, medium: "GPU", loraName: null, extraKeys: [null, null] },
    ]);
    // The repeat published nothing; every block was stored exactly once, in contiguous seqs.
    expect(stored(sub!.messages).flatMap((e) => e.blockHashes)).toEqual(all);
    expect(sub!.messages[1]!.seq).toBe(sub!.messages[0]!.seq + 1n);
    expect(residentFromEvents(sub!.messages)).toEqual(w.ranks[0]!.cache.residentHashes());
  });

  test("eviction under a tiny capacity publishes BlockRemoved for exactly the evicted blocks", async () => {
    const w = await worker({ capacityBlocks: 4 });
    const [sub] = await subscribed(w);
    const cache = w.ranks[0]!.cache;
    await complete(w, ids(0, 8));
    await complete(w, ids(100, 8));
    await waitFor(() => sub!.messages.length === 2, { message: "two stores" });
    const before = cache.residentHashes();
    await complete(w, ids(200, 12)); // 3 blocks into a full cache of 4
    const after = cache.residentHashes();
    const evicted = [...before].filter((h) => !after.has(h));
    expect(evicted.length).toBe(3);
    await waitFor(() => sub!.messages.length === 3, { message: "the eviction batch" });
    const batch = sub!.messages[2]!.batch.events;
    const [a, b] = [hashesOf(ids(0, 8)), hashesOf(ids(100, 8))];
    // Least recently used first, and within a released prompt its tail first (vLLM's free order).
    expect(batch[0]).toEqual({ type: "BlockRemoved", blockHashes: [a[1]!, a[0]!, b[1]!], medium: "GPU" });
    expect(new Set(evicted)).toEqual(new Set([a[1]!, a[0]!, b[1]!]));
    expect(batch[1]!.type).toBe("BlockStored");
    // Applying every batch from the sync point reproduces the cache exactly.
    expect(residentFromEvents(sub!.messages)).toEqual(after);
  });

  test("DP ranks publish on their own ports with data_parallel_rank set, and replay per rank", async () => {
    const w = await worker({ listen: `${LOOPBACK}.2.2`, kvEvents: `tcp://${LOOPBACK}.2.2:5557`, replay: `tcp://${LOOPBACK}.2.2:5567`, dpSize: 2, capacityBlocks: 100 });
    expect(w.ranks.map((r) => [r.kvEvents, r.replay])).toEqual([
      [`tcp://${LOOPBACK}.2.2:5557`, `tcp://${LOOPBACK}.2.2:5567`],
      [`tcp://${LOOPBACK}.2.2:5558`, `tcp://${LOOPBACK}.2.2:5568`],
    ]);
    const [sub0, sub1] = await subscribed(w);
    await complete(w, ids(0, 8), { "x-data-parallel-rank": "1" });
    await waitFor(() => sub1!.messages.length === 1, { message: "rank 1's store" });
    expect(sub1!.messages[0]!.batch.dataParallelRank).toBe(1);
    expect(w.ranks[1]!.cache.residentHashes()).toEqual(new Set(hashesOf(ids(0, 8))));
    expect(w.ranks[0]!.cache.usedBlocks).toBe(0);
    await complete(w, ids(50, 4), { "x-data-parallel-rank": "0" });
    await waitFor(() => sub0!.messages.length === 1, { message: "rank 0's store" });
    expect(sub0!.messages[0]!.batch.dataParallelRank).toBe(0);
    expect(sub1!.messages.length).toBe(1);
    // Without the header, idle ranks take turns.
    await complete(w, ids(900, 4));
    await complete(w, ids(900, 4));
    await waitFor(() => sub0!.messages.length === 2 && sub1!.messages.length === 2, { message: "one store per rank" });

    // Replay from rank 1's ROUTER: every buffered batch from seq 0, then the end marker.
    const dealer = new DealerSocket();
    cleanup.push(() => dealer.close());
    const replies: Buffer[][] = [];
    dealer.onMessage((f) => replies.push(f));
    dealer.connect(w.ranks[1]!.replay!);
    dealer.send([Buffer.alloc(0), encodeSeq(0n)]);
    await waitFor(() => replies.some((f) => f[2]!.equals(END_SEQ)), { message: "the replay end marker" });
    const replayed = replies.filter((f) => !f[2]!.equals(END_SEQ)).map((f) => ({ seq: decodeSeq(f[2]!)!, batch: decodeBatch(f[3]!) }));
    const live = new Map(sub1!.messages.map((m) => [m.seq, m.batch]));
    for (const [seq, batch] of live) expect(replayed.find((r) => r.seq === seq)?.batch).toEqual(batch);
    expect(replayed.every((r) => r.batch.dataParallelRank === 1)).toBe(true);
  });

  test("map encoding with bytes hashes decodes to the same blocks", async () => {
    const w = await worker({ eventEncoding: "vllm-map", hashMode: "bytes", topic: "kv@mock", capacityBlocks: 100 });
    const sub = subscribe(w.ranks[0]!.kvEvents, "kv@");
    cleanup.push(() => sub.close());
    await syncSubscribers(w.url, [sub]);
    await complete(w, ids(7, 12));
    await waitFor(() => sub.messages.length === 1, { message: "a map-encoded store" });
    const m = sub.messages[0]!;
    expect(m.topic).toBe("kv@mock");
    expect(m.payload[0]! & 0xf0).toBe(0x80); // a msgpack fixmap: {ts, events}
    expect(m.payload.includes(Buffer.from([0xc4, 32]))).toBe(true); // bin8 of 32 bytes: a digest
    expect((m.batch.events[0] as BlockStored).blockHashes).toEqual(hashesOf(ids(7, 12)));
  });

  test("fault switches: skipped seqs leave a gap, paused changes are never sent, a restart starts seq at 0 with an empty cache", async () => {
    const w = await worker({ capacityBlocks: 100 });
    const [sub] = await subscribed(w);
    const admin = (body: object) => post(`${w.url}/admin/faults`, body).then(async (r) => ({ status: r.status, body: (await r.json()) as any }));

    await complete(w, ids(0, 4));
    await waitFor(() => sub!.messages.length === 1, { message: "a store" });
    const s0 = sub!.messages[0]!.seq;
    expect((await admin({ action: "skip", count: 1000 })).body.ranks[0].nextSeq).toBe(String(s0 + 1001n));
    await complete(w, ids(10, 4));
    await waitFor(() => sub!.messages.length === 2, { message: "a store after the gap" });
    expect(sub!.messages[1]!.seq).toBe(s0 + 1001n);

    expect((await admin({ action: "pause" })).body.ranks[0].paused).toBe(true);
    await complete(w, ids(20, 4)); // cached, never published
    expect(w.ranks[0]!.cache.residentHashes().has(hashesOf(ids(20, 4))[0]!)).toBe(true);
    await admin({ action: "resume" });
    await complete(w, ids(30, 4));
    await waitFor(() => sub!.messages.length === 3, { message: "a store after resuming" });
    expect(sub!.messages[2]!.seq).toBe(s0 + 1002n);
    expect((sub!.messages[2]!.batch.events[0] as BlockStored).blockHashes).toEqual(hashesOf(ids(30, 4)));

    const restarted = await admin({ action: "restart" });
    expect(restarted.body.ranks[0]).toMatchObject({ nextSeq: "0", restarts: 1, paused: false });
    expect(w.ranks[0]!.cache.usedBlocks).toBe(0);
    // The subscriber reconnects by itself; what it sees next restarted from 0.
    sub!.messages.length = 0;
    await syncSubscribers(w.url, [sub!]);
    expect((await complete(w, ids(0, 4))).usage.prompt_tokens_details?.cached_tokens ?? 0).toBe(0);
    await waitFor(() => sub!.messages.length === 1, { message: "a store after the restart" });
    expect(sub!.messages[0]!.seq).toBeLessThan(1000n);

    expect((await admin({ action: "skip", count: 0 })).status).toBe(400);
    expect((await admin({ action: "pause", rank: 3 })).status).toBe(400);
  });

  test("GET /admin/cache is the cache the published events build, with parents, tokens and copies, at the seq it names", async () => {
    const w = await worker({ capacityBlocks: 6, dpSize: 2 });
    const subs = await subscribed(w);
    // Stores, a shared prefix, and evictions on rank 0; one store on rank 1.
    await complete(w, ids(0, 8), { "x-data-parallel-rank": "0" });
    await complete(w, [...ids(0, 8), ...ids(50, 4)], { "x-data-parallel-rank": "0" });
    await complete(w, ids(100, 16), { "x-data-parallel-rank": "0" });
    await complete(w, ids(200, 4), { "x-data-parallel-rank": "1" });
    const truth = (await (await fetch(`${w.url}/admin/cache`)).json()) as CacheTruth;
    expect(truth.block_size).toBe(BS);
    expect(truth.ranks.map((r) => r.rank)).toEqual([0, 1]);
    for (const r of truth.ranks) {
      const sub = subs[r.rank]!;
      await waitFor(() => sub.messages.at(-1)?.seq === BigInt(r.next_seq) - 1n, { message: "the last batch before the truth was read" });
      expect(new Set(r.blocks.map((b) => BigInt(b.block_hash)))).toEqual(residentFromEvents(sub.messages));
      expect(r.blocks.every((b) => b.copies === 1)).toBe(true);
    }
    // Exact u64 strings, parent links and token ids as the chain hashes them.
    const rank0 = truth.ranks[0]!.blocks;
    expect(rank0.length).toBe(6);
    const chain = hashesOf(ids(100, 16));
    expect(rank0.filter((b) => chain.includes(BigInt(b.block_hash))).map((b) => [b.parent_hash, b.token_ids])).toEqual(
      chain.map((_, i) => [i === 0 ? null : chain[i - 1]!.toString(), ids(100 + 4 * i, 4)]),
    );
    expect(truth.ranks[1]!.blocks).toEqual([{ block_hash: hashesOf(ids(200, 4))[0]!.toString(), parent_hash: null, token_ids: ids(200, 4), extra_keys: null, copies: 1 }]);
  });

  test("POST /reset_prefix_cache publishes AllBlocksCleared and empties the cache", async () => {
    const w = await worker({ capacityBlocks: 100 });
    const [sub] = await subscribed(w);
    await complete(w, ids(0, 8));
    expect((await post(`${w.url}/reset_prefix_cache`, {})).status).toBe(200);
    await waitFor(() => sub!.messages.length === 2, { message: "the clear" });
    expect(sub!.messages[1]!.batch.events).toEqual([{ type: "AllBlocksCleared" }]);
    expect(w.ranks[0]!.cache.usedBlocks).toBe(0);
    expect((await complete(w, ids(0, 8))).usage.prompt_tokens_details?.cached_tokens ?? 0).toBe(0);
  });
});
