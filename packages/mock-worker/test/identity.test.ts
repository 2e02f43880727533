// What names a block besides its tokens, end to end over HTTP and the KV-event wire: a LoRA adapter
// named in `model`, `cache_salt`, image parts of a chat; and global DP ranks (vLLM's start rank).
import { afterEach, describe, expect, test } from "bun:test";
import type { BlockStored } from "@kv-epp/kv-events";
import { chainBlockIds, startMockWorker, type MockWorker, type MockWorkerOptions } from "../src/index.ts";
import { MEDIA_TOKEN_ID, MEDIA_TOKENS } from "../src/http/openai-routes.ts";
import { waitFor, LOOPBACK } from "@kv-epp/testkit";
import { post, subscribe, syncSubscribers, type Received } from "./support.ts";

const BS = 4;
const ids = (from: number, n: number) => Array.from({ length: n }, (_, i) => from + i);
const stored = (ms: Received[]) => ms.flatMap((m) => m.batch.events).filter((e): e is BlockStored => e.type === "BlockStored");

const cleanup: (() => Promise<unknown>)[] = [];
afterEach(async () => {
  for (const f of cleanup.splice(0).reverse()) await f().catch(() => {});
});

async function worker(opts: MockWorkerOptions = {}): Promise<{ w: MockWorker; subs: ReturnType<typeof subscribe>[] }> {
  const w = await startMockWorker({ listen: `${LOOPBACK}.2.1`, port: 0, kvEvents: `tcp://${LOOPBACK}.2.1:0`, speed: 0, blockSize: BS, logLevel: "silent", capacityBlocks: 200, ...opts });
  cleanup.push(() => w.close());
  const subs = w.ranks.map((r) => subscribe(r.kvEvents));
  for (const s of subs) cleanup.push(async () => s.close());
  await syncSubscribers(w.url, subs);
  return { w, subs };
}

async function cached(w: MockWorker, path: string, body: object, headers: Record<string, string> = {}): Promise<number> {
  const res = await post(`${w.url}${path}`, { max_tokens: 1, ...body }, headers);
  expect(res.status).toBe(200);
  // vLLM writes prompt_tokens_details: null when nothing was cached.
  return ((await res.json()) as { usage: { prompt_tokens_details: { cached_tokens: number } | null } }).usage.prompt_tokens_details?.cached_tokens ?? 0;
}

describe("block identity", () => {
  test("a LoRA adapter named in `model` stores blocks under its name (lora_name, lora_id, extra_keys); the base model does not hit them", async () => {
    const { w, subs } = await worker({ loraModules: ["sql-lora", "chat-lora"] });
    const prompt = ids(0, 10);
    expect(await cached(w, "/v1/completions", { model: "chat-lora", prompt })).toBe(0);
    await waitFor(() => stored(subs[0]!.messages).length === 1, { message: "the adapter's BlockStored" });
    const ev = stored(subs[0]!.messages)[0]!;
    expect(ev).toMatchObject({ loraName: "chat-lora", loraId: 2, extraKeys: [["chat-lora"], ["chat-lora"]] });
    expect(ev.blockHashes).toEqual(chainBlockIds(Uint32Array.from(prompt), BS, { loraName: "chat-lora" }).map((b) => b.hash));
    expect(await cached(w, "/v1/completions", { prompt })).toBe(0);
    expect(await cached(w, "/v1/completions", { model: "chat-lora", prompt })).toBe(8);
    const models = (await (await fetch(`${w.url}/v1/models`)).json()) as { data: { id: string; parent: string | null }[] };
    expect(models.data.map((m) => [m.id, m.parent])).toEqual([["Qwen/Qwen3-0.6B", null], ["sql-lora", "Qwen/Qwen3-0.6B"], ["chat-lora", "Qwen/Qwen3-0.6B"]]);
  });

  test("cache_salt goes into block 0's extra keys: other salts and no salt share nothing", async () => {
    const { w, subs } = await worker();
    const prompt = ids(100, 9);
    expect(await cached(w, "/v1/completions", { prompt, cache_salt: "tenant-a" })).toBe(0);
    await waitFor(() => stored(subs[0]!.messages).length === 1, { message: "the salted BlockStored" });
    expect(stored(subs[0]!.messages)[0]!.extraKeys).toEqual([["tenant-a"], null]);
    expect(await cached(w, "/v1/completions", { prompt, cache_salt: "tenant-b" })).toBe(0);
    expect(await cached(w, "/v1/completions", { prompt })).toBe(0);
    expect(await cached(w, "/v1/completions", { prompt, cache_salt: "tenant-a" })).toBe(8);
  });

  for (const eventEncoding of ["sglang-map", "sglang"] as const)
    test(`with --event-encoding ${eventEncoding}, a salted request's stores carry its cache_salt (SGLang has no extra_keys)`, async () => {
      const { w, subs } = await worker({ eventEncoding });
      const prompt = ids(200, 9);
      expect(await cached(w, "/v1/completions", { prompt: prompt.slice(0, 4), cache_salt: "tenant-a" })).toBe(0);
      expect(await cached(w, "/v1/completions", { prompt, cache_salt: "tenant-a" })).toBe(4); // block 0 is a hit, block 1 a store continuing it
      await waitFor(() => stored(subs[0]!.messages).length === 2, { message: "the salted BlockStored events" });
      const [root, next] = stored(subs[0]!.messages);
      expect(root).toMatchObject({ parentBlockHash: null, cacheSalt: "tenant-a" });
      expect(next).toMatchObject({ cacheSalt: "tenant-a" });
      expect(root!.extraKeys).toBeUndefined();
      expect(await cached(w, "/v1/completions", { prompt: ids(300, 5) })).toBe(0);
      await waitFor(() => stored(subs[0]!.messages).length === 3, { message: "the unsalted BlockStored" });
      expect(stored(subs[0]!.messages)[2]!.cacheSalt).toBeUndefined();
    });

  test("with an SGLang --event-encoding, an adapter's stores carry no lora_id (SGLang never fills it); the map form names the adapter in lora_name", async () => {
    for (const [eventEncoding, loraName] of [["sglang-map", "chat-lora"], ["sglang", undefined]] as const) {
      const { w, subs } = await worker({ eventEncoding, loraModules: ["chat-lora"] });
      await cached(w, "/v1/completions", { model: "chat-lora", prompt: ids(400, 5) });
      await waitFor(() => stored(subs[0]!.messages).length === 1, { message: `the adapter's BlockStored (${eventEncoding})` });
      const ev = stored(subs[0]!.messages)[0]!;
      expect(ev.loraId).toBeNull();
      expect(ev.loraName).toBe(loraName);
      expect(ev.extraKeys).toBeUndefined();
      await w.close();
    }
  });

  test("an image part becomes placeholder tokens whose blocks carry (identifier, offset); another image shares only the blocks before it", async () => {
    const { w, subs } = await worker({ blockSize: BS });
    const chat = (url: string) => ({
      messages: [{ role: "user", content: [{ type: "text", text: "Please look at this picture carefully:" }, { type: "image_url", image_url: { url } }, { type: "text", text: "What is it?" }] }],
    });
    await cached(w, "/v1/chat/completions", chat("https://example.com/a.png"));
    await waitFor(() => stored(subs[0]!.messages).length === 1, { message: "the chat's BlockStored" });
    const ev = stored(subs[0]!.messages)[0]!;
    const first = ev.tokenIds.indexOf(MEDIA_TOKEN_ID);
    expect(first).toBeGreaterThan(0);
    expect(ev.tokenIds.filter((t) => t === MEDIA_TOKEN_ID).length).toBe(MEDIA_TOKENS);
    const keyed = ev.extraKeys!.map((k, i) => [i, k] as const).filter(([, k]) => k !== null);
    expect(keyed[0]![0]).toBe(Math.floor(first / BS));
    const [id, offset] = keyed[0]![1]![0] as [string, number];
    expect(id).toMatch(/^[0-9a-f]{64}$/);
    expect(offset).toBe(first - keyed[0]![0] * BS);
    // The same chat with another image: a hit up to the block before the first placeholder only.
    expect(await cached(w, "/v1/chat/completions", chat("https://example.com/b.png"))).toBe(Math.floor(first / BS) * BS);
  });
});

describe("global DP ranks", () => {
  test("a worker starting at global rank 2 publishes ranks 2 and 3 on port + 2 and + 3, and x-data-parallel-rank names global ranks", async () => {
    const { w, subs } = await worker({ dpSize: 2, dataParallelStartRank: 2, kvEvents: `tcp://${LOOPBACK}.2.1:25710` });
    expect(w.ranks.map((r) => [r.rank, r.kvEvents])).toEqual([[2, `tcp://${LOOPBACK}.2.1:25712`], [3, `tcp://${LOOPBACK}.2.1:25713`]]);
    await cached(w, "/v1/completions", { prompt: ids(0, 4) }, { "x-data-parallel-rank": "3" });
    await waitFor(() => subs[1]!.messages.length === 1, { message: "rank 3's batch" });
    expect(subs[1]!.messages[0]!.batch.dataParallelRank).toBe(3);
    expect(subs[0]!.messages.length).toBe(0);
    expect((await post(`${w.url}/v1/completions`, { prompt: [1], max_tokens: 1 }, { "x-data-parallel-rank": "1" })).status).toBe(400);
  });
});

describe("hybrid KV cache groups", () => {
  test("--kv-groups publishes every change per group; a sliding-window group names only the blocks in its window, with the whole run's tokens", async () => {
    // Five slots: a 17-token prompt's four full blocks and its partial fifth.
    const { w, subs } = await worker({ kvGroups: "full_attention:4,sliding_window:4:6" as never, capacityBlocks: 5 });
    expect(await cached(w, "/v1/completions", { prompt: ids(0, 17) })).toBe(0);
    await waitFor(() => subs[0]!.messages.length === 1, { message: "the grouped batch" });
    const [full, window] = subs[0]!.messages[0]!.batch.events as BlockStored[];
    const all = chainBlockIds(Uint32Array.from(ids(0, 17)), BS).map((b) => b.hash);
    expect(full).toMatchObject({ blockHashes: all, groupIdx: 0, kvCacheSpecKind: "full_attention", tokenIds: ids(0, 16) });
    expect(full!.kvCacheSpecSlidingWindow).toBeUndefined();
    // Window 6 over 16 tokens: blocks ending after token 10 (the last two of four) are kept.
    expect(window).toMatchObject({ blockHashes: all.slice(2), groupIdx: 1, kvCacheSpecKind: "sliding_window", kvCacheSpecSlidingWindow: 6, tokenIds: ids(0, 16) });
    // Evicting all four: the window group removes only what it stored.
    await cached(w, "/v1/completions", { prompt: ids(100, 17) });
    await waitFor(() => subs[0]!.messages.length === 2, { message: "the evicting batch" });
    const removed = subs[0]!.messages[1]!.batch.events.filter((e) => e.type === "BlockRemoved");
    expect(removed.map((e) => [(e as { groupIdx?: number }).groupIdx, new Set((e as { blockHashes: bigint[] }).blockHashes)])).toEqual([
      [0, new Set(all)],
      [1, new Set(all.slice(2))],
    ]);
  });

  test("a group block size that is not a multiple of --block-size (vLLM's hash block size) is refused at start", async () => {
    await expect(startMockWorker({ listen: `${LOOPBACK}.2.1`, port: 0, kvEvents: `tcp://${LOOPBACK}.2.1:0`, blockSize: 4, kvGroups: "full_attention:6" as never, logLevel: "silent" })).rejects.toThrow(/--kv-groups/);
  });

  test("a group with larger blocks publishes its own blocks: block_size its own, the hash at each block's last hash-block boundary, blocks that straddle runs included", async () => {
    // Nine slots: the 33-token prompt below needs them all.
    const { w, subs } = await worker({ kvGroups: "sliding_window:4:6,full_attention:8" as never, capacityBlocks: 9 });
    const all = chainBlockIds(Uint32Array.from(ids(0, 17)), BS).map((b) => b.hash);
    // 13 tokens: three hash blocks; the 8-token group has one full block (hash blocks 0 and 1).
    await cached(w, "/v1/completions", { prompt: ids(0, 13) });
    await waitFor(() => subs[0]!.messages.length === 1, { message: "the first run" });
    const [window1, full1] = subs[0]!.messages[0]!.batch.events as BlockStored[];
    expect(window1).toMatchObject({ groupIdx: 0, blockSize: 4, kvCacheSpecKind: "sliding_window" });
    expect(full1).toMatchObject({ groupIdx: 1, blockSize: 8, kvCacheSpecKind: "full_attention", blockHashes: [all[1]], parentBlockHash: null, tokenIds: ids(0, 8) });
    // 17 tokens: hash block 3 is new, and completes the group's second block (hash blocks 2 and 3).
    await cached(w, "/v1/completions", { prompt: ids(0, 17) });
    await waitFor(() => subs[0]!.messages.length === 2, { message: "the second run" });
    const full2 = (subs[0]!.messages[1]!.batch.events as BlockStored[]).find((e) => e.groupIdx === 1);
    expect(full2).toMatchObject({ blockSize: 8, blockHashes: [all[3]], parentBlockHash: all[1], tokenIds: ids(8, 8) });
    // Evicting everything: the larger group removes the hashes it published, once each.
    await cached(w, "/v1/completions", { prompt: ids(100, 33) });
    await waitFor(() => subs[0]!.messages.length === 3, { message: "the evicting batch" });
    const removed = subs[0]!.messages[2]!.batch.events.filter((e) => e.type === "BlockRemoved" && (e as { groupIdx?: number }).groupIdx === 1);
    expect(removed.flatMap((e) => (e as { blockHashes: bigint[] }).blockHashes).sort()).toEqual([all[1]!, all[3]!].sort());
  });

  test("a group block's extra keys are built over its own span, as vLLM builds them: the adapter once, the salt on block 0", async () => {
    const { w, subs } = await worker({ kvGroups: "sliding_window:4:6,full_attention:8" as never, capacityBlocks: 8, loraModules: ["sql-lora"] });
    await cached(w, "/v1/completions", { model: "sql-lora", cache_salt: "tenant-a", prompt: ids(0, 17) });
    await waitFor(() => subs[0]!.messages.length === 1, { message: "the grouped batch" });
    const [window, full] = subs[0]!.messages[0]!.batch.events as BlockStored[];
    // The 4-token group: per hash block (lora, then the salt on block 0); the window keeps the last two.
    expect(window!.extraKeys).toEqual([["sql-lora"], ["sql-lora"]]);
    // The 8-token group: two blocks, each spanning two hash blocks, the name once each.
    expect(full).toMatchObject({ blockSize: 8, extraKeys: [["sql-lora", "tenant-a"], ["sql-lora"]] });
  });
});
