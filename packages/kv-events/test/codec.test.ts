// Codec: golden bytes (what msgspec emits for vLLM's structs, assembled by hand from the
// msgpack spec), decode of every optional-field variant, and property-based round trips.
import { describe, expect, test } from "bun:test";
import fc from "fast-check";
import { decodeGeneric } from "../src/codec/decode.ts";
import { decodeBatch, encodeBatch, foldHashBytes, hashToDigest, KvDecodeError, type KvEvent, type KvEventBatch } from "../src/index.ts";

const hex = (...parts: string[]) => Buffer.from(parts.join("").replace(/\s+/g, ""), "hex");
const str = (s: string) => (0xa0 | s.length).toString(16) + Buffer.from(s).toString("hex");

const BATCH: KvEventBatch = {
  ts: 1700000000.5,
  events: [
    { type: "BlockStored", blockHashes: [1n, 2n ** 64n - 1n], parentBlockHash: null, tokenIds: [1, 2, 300], blockSize: 16, loraId: null, medium: "GPU" },
    { type: "BlockRemoved", blockHashes: [7n], medium: null },
    { type: "AllBlocksCleared" },
  ],
  dataParallelRank: 0,
};

// msgspec array_like=True, omit_defaults=True (trailing None defaults dropped).
const ARRAY_GOLDEN = hex(
  "93", "cb 41d954fc40200000", // [ts, events, data_parallel_rank]
  "93", // 3 events
  "97", str("BlockStored"), "92 01 cf ffffffffffffffff", "c0", "93 01 02 cd012c", "10", "c0", str("GPU"),
  "93", str("BlockRemoved"), "91 07", "c0",
  "91", str("AllBlocksCleared"),
  "00",
);

// Newer vLLM: tagged maps, "type" first, fields without defaults always present.
const MAP_GOLDEN = hex(
  "83", str("ts"), "cb 41d954fc40200000", str("events"), "93",
  "88", str("type"), str("BlockStored"), str("block_hashes"), "92 01 cf ffffffffffffffff",
  str("parent_block_hash"), "c0", str("token_ids"), "93 01 02 cd012c", str("block_size"), "10",
  str("lora_id"), "c0", str("medium"), str("GPU"), str("lora_name"), "c0",
  "83", str("type"), str("BlockRemoved"), str("block_hashes"), "91 07", str("medium"), "c0",
  "81", str("type"), str("AllBlocksCleared"),
  str("data_parallel_rank"), "00",
);

describe("golden bytes", () => {
  test("the array encoding matches msgspec's array_like bytes, both ways", () => {
    expect(Buffer.from(encodeBatch(BATCH)).toString("hex")).toBe(ARRAY_GOLDEN.toString("hex"));
    expect(decodeBatch(ARRAY_GOLDEN)).toEqual(BATCH);
  });

  test("the map encoding matches newer vLLM's tagged-map bytes, both ways", () => {
    expect(Buffer.from(encodeBatch(BATCH, { encoding: "map" })).toString("hex")).toBe(MAP_GOLDEN.toString("hex"));
    const { events, ...rest } = decodeBatch(MAP_GOLDEN);
    expect(rest).toEqual({ ts: BATCH.ts, dataParallelRank: 0 });
    expect(events[0]).toEqual({ ...(BATCH.events[0] as object), loraName: null } as KvEvent);
    expect(events.slice(1)).toEqual(BATCH.events.slice(1));
  });

  test("bytes hashes are 32-byte bin values folding to the low 64 bits big-endian", () => {
    const b: KvEventBatch = { ts: 1.5, events: [{ type: "BlockRemoved", blockHashes: [0x0102030405060708n], medium: "CPU" }], dataParallelRank: null };
    const bytes = Buffer.from(encodeBatch(b, { hashMode: "bytes" }));
    const digest = Buffer.from(hashToDigest(0x0102030405060708n));
    expect(bytes.toString("hex")).toBe(hex("92 cb 3ff8000000000000 91 93", str("BlockRemoved"), "91 c4 20", digest.toString("hex"), str("CPU")).toString("hex"));
    expect(digest.subarray(24).toString("hex")).toBe("0102030405060708");
    expect(decodeBatch(bytes)).toEqual(b);
  });
});

describe("decoding variants", () => {
  test("array BlockStored with every trailing field (lora_name, extra_keys, group_idx, spec kind/window)", () => {
    const p = hex("92 cb 3ff0000000000000 91",
      "9c", str("BlockStored"), "91 05", "cf 8000000000000000", "90", "10", "03", str("CPU"),
      str("lora-a"), "91 91 a1 78", "02", str("sliding"), "cd 1000");
    expect(decodeBatch(p).events[0]).toEqual({
      type: "BlockStored", blockHashes: [5n], parentBlockHash: 2n ** 63n, tokenIds: [], blockSize: 16, loraId: 3, medium: "CPU",
      loraName: "lora-a", extraKeys: [["x"]], groupIdx: 2, kvCacheSpecKind: "sliding", kvCacheSpecSlidingWindow: 4096,
    });
  });

  test("oldest array BlockStored without lora_id/medium, BlockRemoved without medium, and no dp rank", () => {
    const p = hex("92 cb 3ff0000000000000 92", "95", str("BlockStored"), "91 05", "c0", "91 01", "10", "92", str("BlockRemoved"), "91 05");
    expect(decodeBatch(p)).toEqual({
      ts: 1, dataParallelRank: null,
      events: [
        { type: "BlockStored", blockHashes: [5n], parentBlockHash: null, tokenIds: [1], blockSize: 16, loraId: null, medium: null },
        { type: "BlockRemoved", blockHashes: [5n], medium: null },
      ],
    });
  });

  test("negative int hashes (older vLLM's Python hash()) fold to u64", () => {
    const p = hex("92 cb 3ff0000000000000 91 93", str("BlockRemoved"), "92 ff d3 8000000000000000", "c0");
    expect((decodeBatch(p).events[0] as { blockHashes: bigint[] }).blockHashes).toEqual([2n ** 64n - 1n, 2n ** 63n]);
  });

  test("short bytes hashes are read as a big-endian integer", () => {
    expect(foldHashBytes(Uint8Array.of(1, 0))).toBe(256n);
    expect(foldHashBytes(Uint8Array.of(0xaa, 0xbb, 1, 2, 3, 4, 5, 6, 7, 8))).toBe(0x0102030405060708n);
  });

  test("unknown tags and malformed events are skipped and counted; the rest of the batch survives", () => {
    const stats = { skippedEvents: 0 };
    const p = hex("92 cb 3ff0000000000000 94",
      "92", str("Mystery"), "01",
      "93", str("BlockRemoved"), "a1 78", "c0", // hashes not a list
      "81", str("type"), str("AllBlocksCleared"),
      "07");
    expect(decodeBatch(p, stats).events).toEqual([{ type: "AllBlocksCleared" }]);
    expect(stats.skippedEvents).toBe(3);
  });

  test("malformed batches throw KvDecodeError", () => {
    for (const p of [hex("c1"), hex("07"), hex("92 a1 78 90"), hex("92 cb 3ff0000000000000 07"), hex("93 cb 3ff0000000000000 90 a1 78"), hex("92 cb 3ff0")]) {
      expect(() => decodeBatch(p)).toThrow(KvDecodeError);
    }
  });
});

const u64 = fc.bigInt({ min: 0n, max: 2n ** 64n - 1n });
const medium = fc.constantFrom(null, "GPU", "CPU", "STORAGE");
const event: fc.Arbitrary<KvEvent> = fc.oneof(
  fc.record({
    type: fc.constant("BlockStored" as const),
    blockHashes: fc.array(u64, { maxLength: 20 }),
    parentBlockHash: fc.option(u64, { nil: null }),
    tokenIds: fc.array(fc.integer({ min: 0, max: 2 ** 32 - 1 }), { maxLength: 64 }),
    blockSize: fc.integer({ min: 1, max: 1024 }),
    loraId: fc.option(fc.integer({ min: 0, max: 1000 }), { nil: null }),
    medium,
  }),
  fc.record({ type: fc.constant("BlockRemoved" as const), blockHashes: fc.array(u64, { maxLength: 20 }), medium }),
  fc.constant({ type: "AllBlocksCleared" as const }),
);
const batch: fc.Arbitrary<KvEventBatch> = fc.record({
  ts: fc.double({ noNaN: true, noDefaultInfinity: true }),
  events: fc.array(event, { maxLength: 8 }),
  dataParallelRank: fc.option(fc.integer({ min: 0, max: 1024 }), { nil: null }),
});

describe("round trips", () => {
  test("decode(encode(b)) == b for array and map encodings, int and bytes hashes", () => {
    fc.assert(
      fc.property(batch, fc.constantFrom("array" as const, "map" as const), fc.constantFrom("int" as const, "bytes" as const), (b, encoding, hashMode) => {
        const bytes = encodeBatch(b, { encoding, hashMode });
        const back = decodeBatch(bytes);
        expect(decodeGeneric(bytes)).toEqual(back); // the msgpackr path agrees with the fast path
        // The map form always carries lora_name (null when unset), as newer vLLM does.
        const expected = encoding === "map" ? { ...b, events: b.events.map((e) => (e.type === "BlockStored" ? { ...e, loraName: null } : e)) } : b;
        expect(back).toEqual(expected);
      }),
      { numRuns: 300 },
    );
  });
});
