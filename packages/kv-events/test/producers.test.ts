// Producer shapes newer than test/fixtures/: each payload is what the producer's msgspec structs write
// (built by msgpackr in their field order, see msgspec-golden.ts), decoded on both paths and, where
// encodeBatch can emit the shape, written byte for byte by our encoder too.
import { describe, expect, test } from "bun:test";
import { decodeGeneric } from "../src/codec/decode.ts";
import { decodeFast } from "../src/codec/fast-decode.ts";
import { decodeBatch, encodeBatch, newDecodeStats, type KvEvent, type KvEventBatch } from "../src/index.ts";
import { msgspecBytes } from "./msgspec-golden.ts";

describe("SGLang under EAGLE speculative decoding (bigram radix keys)", () => {
  // SGLang main, python/sglang/srt/mem_cache/events.py KVCacheEventRecorder.record_store: with
  // `node.key.is_bigram` (EAGLE, EAGLE3, NEXTN/MTP) each page's token_ids are `(raw[j], raw[j+1])` tuples,
  // block_size is the number of tuples, and enqueue() coalesces a chain's pages into one event. The
  // batch is SGLang's array_like EventBatch `[ts, events, attn_dp_rank]`, events tagged maps
  // (sglang-map): type, block_hashes, parent_block_hash, token_ids, block_size, lora_id, then medium.
  // Raw tokens 10..14 in pages of 2: two blocks, tuples (10,11) (11,12) | (12,13) (13,14).
  const payload = msgspecBytes([
    1.25,
    [
      {
        type: "BlockStored", block_hashes: [0xa1, 0xa2], parent_block_hash: null,
        token_ids: [[10, 11], [11, 12], [12, 13], [13, 14]], block_size: 2, lora_id: null, medium: "GPU",
      },
      { type: "BlockRemoved", block_hashes: [0xa2], medium: "GPU" },
    ],
    0,
  ]);
  const batch: KvEventBatch = {
    ts: 1.25,
    dataParallelRank: 0,
    events: [
      { type: "BlockStored", blockHashes: [0xa1n, 0xa2n], parentBlockHash: null, tokenIds: [10, 11, 12, 13], blockSize: 2, loraId: null, medium: "GPU", bigramNextTokenId: 14 },
      { type: "BlockRemoved", blockHashes: [0xa2n], medium: "GPU" },
    ],
  };

  test("bigram token_ids decode to the plain tokens, one per position, on both paths", () => {
    expect(decodeFast(payload)?.batch).toEqual(batch);
    expect(decodeGeneric(payload)).toEqual(batch);
  });

  test("the sglang-map encoder writes the same bytes (what the mock worker publishes in --spec-bigram mode)", () => {
    expect(Buffer.from(encodeBatch(batch, { encoding: "sglang-map" })).toString("hex")).toBe(payload.toString("hex"));
    const arrayForm = encodeBatch(batch, { encoding: "sglang" });
    expect(decodeBatch(arrayForm)).toEqual(batch);
  });

  test("pairs that do not chain are a malformed event: dropped and counted, the batch survives", () => {
    const broken = msgspecBytes([
      1.25,
      [
        { type: "BlockStored", block_hashes: [1], parent_block_hash: null, token_ids: [[10, 11], [12, 13]], block_size: 2, lora_id: null },
        { type: "AllBlocksCleared" },
      ],
      0,
    ]);
    const stats = newDecodeStats();
    expect(decodeBatch(broken, stats).events).toEqual([{ type: "AllBlocksCleared" }]);
    expect(stats).toEqual({ skippedEvents: 1, unknownTypes: 0, malformedEvents: 1, unknownFields: 0 });
  });
});

describe("SGLang main: an adapter by lora_name, a salt, HiCache's host tier (mem_cache/events.py)", () => {
  // KVCacheEventRecorder.record_store: lora_id is never filled; an adapter SGLang can name
  // (KvEventLoraNames, keyed by the request's extra_key) goes in lora_name, the salt in cache_salt, both
  // only when set (omit_defaults); medium is always written (StorageMedium.GPU, or CPU_PINNED for
  // HiRadixCache's write-through to host memory). lora_name is written last here: the struct declaring it
  // was not among the sources read, so that position is assumed (decoders read map keys by name).
  const stored = { type: "BlockStored", block_hashes: [0x21, 0x22], parent_block_hash: null, token_ids: [1, 2, 3, 4], block_size: 2, lora_id: null };
  const payload = msgspecBytes([
    4.5,
    [
      { ...stored, medium: "GPU", cache_salt: "tenant-a", lora_name: "sql-lora" },
      { ...stored, medium: "CPU_PINNED", cache_salt: "tenant-a", lora_name: "sql-lora" },
      { type: "BlockRemoved", block_hashes: [0x22], medium: "GPU" },
    ],
    0,
  ]);
  const event = (medium: string): KvEvent => ({
    type: "BlockStored", blockHashes: [0x21n, 0x22n], parentBlockHash: null, tokenIds: [1, 2, 3, 4], blockSize: 2, loraId: null, medium, cacheSalt: "tenant-a", loraName: "sql-lora",
  });
  const batch: KvEventBatch = {
    ts: 4.5,
    dataParallelRank: 0,
    events: [event("GPU"), event("CPU_PINNED"), { type: "BlockRemoved", blockHashes: [0x22n], medium: "GPU" }],
  };

  test("decodes on both paths, and is what the sglang-map encoder (the mock worker's) writes", () => {
    expect(decodeFast(payload)?.batch).toEqual(batch);
    expect(decodeGeneric(payload)).toEqual(batch);
    expect(Buffer.from(encodeBatch(batch, { encoding: "sglang-map" })).toString("hex")).toBe(payload.toString("hex"));
  });
});

describe("vLLM partial prefix-cache entries (hybrid models with --prefix-match-unit)", () => {
  // vLLM main after #45939/#46384, vllm/v1/core/block_pool.py BlockPool.cache_partial_block: a prompt
  // whose tail ends inside a physical block (B tokens) registers the prefix-chain hash at that boundary
  // (a multiple of the match unit u) and publishes BlockStored(block_hashes=[hash at num_tokens],
  // parent_block_hash=hash at num_tokens - u, token_ids=the last u tokens, block_size=u, lora_id, medium
  // "GPU", lora_name, extra_keys=[keys of that span], group_idx). Nothing else marks it: it is a
  // BlockStored whose block_size is the match unit, not the group's block size. Map event in vLLM's
  // declaration order (omit_defaults: unset defaults left out). u = 4, B = 8 here; the full block before
  // it was published with block_size 8.
  const payload = msgspecBytes([
    2.5,
    [
      {
        type: "BlockStored", block_hashes: [0x11], parent_block_hash: null, token_ids: [1, 2, 3, 4, 5, 6, 7, 8], block_size: 8,
        lora_id: null, medium: "GPU", lora_name: null, extra_keys: [null], group_idx: 0, kv_cache_spec_kind: "full_attention",
      },
      {
        type: "BlockStored", block_hashes: [0x13], parent_block_hash: 0x11, token_ids: [9, 10, 11, 12], block_size: 4,
        lora_id: null, medium: "GPU", lora_name: null, extra_keys: [null], group_idx: 0, kv_cache_spec_kind: "full_attention",
      },
    ],
    0,
  ]);

  test("decodes as a one-block BlockStored of the match unit's size (telling it apart is the consumer's: it knows the group's block size)", () => {
    const b = decodeBatch(payload);
    expect(Buffer.from(encodeBatch(b)).toString("hex")).toBe(payload.toString("hex"));
    expect(b.events[1]).toMatchObject({ blockHashes: [0x13n], parentBlockHash: 0x11n, tokenIds: [9, 10, 11, 12], blockSize: 4, groupIdx: 0 });
  });
});

describe("vLLM KV offload ownership (vLLM #52067, merged)", () => {
  // vllm/distributed/kv_events.py after #52067: `ownership: str | None = None` follows `locality` on
  // BlockStored and BlockRemoved (the secondary offloading tier that published the event); omit_defaults
  // writes it only when set. A CPU-tier store and removal from such a tier:
  const payload = msgspecBytes([
    3.5,
    [
      {
        type: "BlockStored", block_hashes: [7], parent_block_hash: null, token_ids: [1, 2], block_size: 2, lora_id: null,
        medium: "CPU", lora_name: null, locality: "LOCAL", ownership: "lmcache",
      },
      { type: "BlockRemoved", block_hashes: [7], medium: "CPU", locality: "LOCAL", ownership: "lmcache" },
    ],
    1,
  ]);
  const batch: KvEventBatch = {
    ts: 3.5,
    dataParallelRank: 1,
    events: [
      { type: "BlockStored", blockHashes: [7n], parentBlockHash: null, tokenIds: [1, 2], blockSize: 2, loraId: null, medium: "CPU", loraName: null, locality: "LOCAL", ownership: "lmcache" },
      { type: "BlockRemoved", blockHashes: [7n], medium: "CPU", locality: "LOCAL", ownership: "lmcache" },
    ],
  };

  test("decodes on both paths, and is what the vllm encoder writes", () => {
    expect(decodeFast(payload)?.batch).toEqual(batch);
    expect(decodeGeneric(payload)).toEqual(batch);
    expect(Buffer.from(encodeBatch(batch)).toString("hex")).toBe(payload.toString("hex"));
  });
});

describe("vLLM domain-tagged extra keys (#44706, #51899, #48352: open, not merged)", () => {
  // The open PRs label each extra key with its source: `("lora", name)`, `("cache_salt", salt)`, and
  // (#48352) `("lora_identity", digest)` after the name. msgspec writes a Python tuple as an array, so
  // extra_keys stays `list[tuple | None]` on the wire and the BlockStored struct is unchanged.
  const payload = msgspecBytes([
    2.5,
    [{
      type: "BlockStored", block_hashes: [0x51, 0x52], parent_block_hash: null, token_ids: [1, 2, 3, 4, 5, 6, 7, 8], block_size: 4,
      lora_id: 3, medium: "GPU", lora_name: "sql",
      extra_keys: [[["lora", "sql"], ["lora_identity", "9f2c"], ["cache_salt", "t1"]], [["lora", "sql"], ["lora_identity", "9f2c"]]],
    }],
    0,
  ]);
  const batch: KvEventBatch = {
    ts: 2.5,
    dataParallelRank: 0,
    events: [{
      type: "BlockStored", blockHashes: [0x51n, 0x52n], parentBlockHash: null, tokenIds: [1, 2, 3, 4, 5, 6, 7, 8], blockSize: 4,
      loraId: 3, medium: "GPU", loraName: "sql",
      extraKeys: [[["lora", "sql"], ["lora_identity", "9f2c"], ["cache_salt", "t1"]], [["lora", "sql"], ["lora_identity", "9f2c"]]],
    }],
  };

  test("decodes on both paths with the labels kept (identity is the EPP's), and is what the vllm encoder writes", () => {
    // fixarray(2) fixstr(4) "lora" fixstr(3) "sql": the tuple ("lora", "sql")
    expect(payload.toString("hex")).toContain("92a46c6f7261a373716c");
    expect(decodeFast(payload)?.batch).toEqual(batch);
    expect(decodeGeneric(payload)).toEqual(batch);
    expect(Buffer.from(encodeBatch(batch)).toString("hex")).toBe(payload.toString("hex"));
  });
});

describe("TensorRT-LLM streaming KV events (TensorRT-LLM #17023, merged)", () => {
  // tensorrt_llm/_torch/pyexecutor/kv_cache_events.py: EventBatch array_like [ts, events,
  // data_parallel_rank]; events tagged maps without array_like. BlockStored writes type, block_hashes,
  // parent_block_hash, token_ids, block_size, lora_id, medium ("GPU"), lora_name (always None there, no
  // default so always written), then mm_keys when multimodal decoding is on: per block a list of
  // MultimodalKey structs (tag "mm_key": hash as hex, start_offset, uuid omitted when None).
  // BlockRemoved writes type, block_hashes, medium.
  const payload = msgspecBytes([
    4.75,
    [
      {
        type: "BlockStored", block_hashes: [0x31, 0x32], parent_block_hash: null, token_ids: [9, 9, 9, 9, 5, 6, 7, 8], block_size: 4, lora_id: null,
        medium: "GPU", lora_name: null, mm_keys: [[{ type: "mm_key", hash: "ab12cd", start_offset: 0 }], []],
      },
      { type: "BlockRemoved", block_hashes: [0x32], medium: "GPU" },
    ],
    0,
  ]);

  test("decodes on both paths, mm_keys kept per block", () => {
    const want: KvEventBatch = {
      ts: 4.75,
      dataParallelRank: 0,
      events: [
        {
          type: "BlockStored", blockHashes: [0x31n, 0x32n], parentBlockHash: null, tokenIds: [9, 9, 9, 9, 5, 6, 7, 8], blockSize: 4, loraId: null,
          medium: "GPU", loraName: null, mmKeys: [[{ hash: "ab12cd", startOffset: 0, uuid: null }], []],
        },
        { type: "BlockRemoved", blockHashes: [0x32n], medium: "GPU" },
      ],
    };
    expect(decodeFast(payload)?.batch).toEqual(want);
    expect(decodeGeneric(payload)).toEqual(want);
  });
});

describe("what no producer here is known to send yet: skipped and counted, never a dropped batch", () => {
  test("an unknown event tag drops that event only; unknown fields are read past and counted", () => {
    const payload = msgspecBytes([
      5.25,
      [
        { type: "BlockMigrated", block_hashes: [1], destination: "cpu" },
        { type: "BlockStored", block_hashes: [2], parent_block_hash: null, token_ids: [1, 2], block_size: 2, lora_id: null, medium: "GPU", lora_name: null, skipped_token_ids: [0], future: { a: [1, 2] } },
      ],
      0,
      "trailing",
    ]);
    const stats = newDecodeStats();
    const b = decodeBatch(payload, stats);
    expect(b.events).toEqual([{ type: "BlockStored", blockHashes: [2n], parentBlockHash: null, tokenIds: [1, 2], blockSize: 2, loraId: null, medium: "GPU", loraName: null }]);
    expect(stats).toEqual({ skippedEvents: 1, unknownTypes: 1, malformedEvents: 0, unknownFields: 3 });
  });

  test("the fast path counts the unknown fields of a well-formed batch too", () => {
    const payload = msgspecBytes([5.25, [{ type: "BlockRemoved", block_hashes: [2], medium: "GPU", ownership_v2: 1 }], 0]);
    const stats = newDecodeStats();
    expect(decodeFast(payload)?.unknownFields).toBe(1);
    decodeBatch(payload, stats);
    expect(stats.unknownFields).toBe(1);
  });
});
