// Codec: bytes hashes, decode of every optional-field variant, and property-based round trips
// (the producers' golden payloads are in fixtures.test.ts).
import { describe, expect, test } from "bun:test";
import fc from "fast-check";
import { decodeGeneric } from "../src/codec/decode.ts";
import { decodeBatch, encodeBatch, EVENT_ENCODINGS, foldHashBytes, hashToDigest, KvDecodeError, newDecodeStats, type EventEncoding, type KvEvent, type KvEventBatch } from "../src/index.ts";

const hex = (...parts: string[]) => Buffer.from(parts.join("").replace(/\s+/g, ""), "hex");
const str = (s: string) => (0xa0 | s.length).toString(16) + Buffer.from(s).toString("hex");

describe("golden bytes", () => {
  test("bytes hashes are 32-byte bin values folding to the low 64 bits big-endian", () => {
    const b: KvEventBatch = { ts: 1.5, events: [{ type: "BlockRemoved", blockHashes: [0x0102030405060708n], medium: "CPU" }], dataParallelRank: null };
    const bytes = Buffer.from(encodeBatch(b, { encoding: "vllm-array", hashMode: "bytes" }));
    const digest = Buffer.from(hashToDigest(0x0102030405060708n));
    expect(bytes.toString("hex")).toBe(hex("93 cb 3ff8000000000000 91 94", str("BlockRemoved"), "91 c4 20", digest.toString("hex"), str("CPU"), "c0 c0").toString("hex"));
    expect(digest.subarray(24).toString("hex")).toBe("0102030405060708");
    expect(decodeBatch(bytes)).toEqual({ ...b, events: [{ type: "BlockRemoved", blockHashes: [0x0102030405060708n], medium: "CPU", groupIdx: null }] });
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
    const stats = newDecodeStats();
    const p = hex("92 cb 3ff0000000000000 94",
      "92", str("Mystery"), "01",
      "93", str("BlockRemoved"), "a1 78", "c0", // hashes not a list
      "81", str("type"), str("AllBlocksCleared"),
      "07");
    expect(decodeBatch(p, stats).events).toEqual([{ type: "AllBlocksCleared" }]);
    expect(stats).toEqual({ skippedEvents: 3, unknownTypes: 1, malformedEvents: 2, unknownFields: 0 });
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
    blockSize: fc.integer({ min: 0, max: 1024 }),
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

/** What each encoding carries of an event that sets only the base fields. */
function asCarried(e: KvEvent, encoding: EventEncoding): KvEvent {
  if (encoding === "vllm" || encoding === "vllm-map") return e.type === "BlockStored" ? { ...e, loraName: null } : e;
  if (encoding === "vllm-array") {
    if (e.type === "BlockStored") return { ...e, loraName: null, extraKeys: null, groupIdx: null, kvCacheSpecKind: null, kvCacheSpecSlidingWindow: null };
    if (e.type === "BlockRemoved") return { ...e, groupIdx: null };
  }
  return e;
}

describe("round trips", () => {
  test("decode(encode(b)) == b for every encoding, int and bytes hashes", () => {
    fc.assert(
      fc.property(batch, fc.constantFrom(...EVENT_ENCODINGS), fc.constantFrom("int" as const, "bytes" as const), (b, encoding, hashMode) => {
        const bytes = encodeBatch(b, { encoding, hashMode });
        const back = decodeBatch(bytes);
        expect(decodeGeneric(bytes)).toEqual(back); // the msgpackr path agrees with the fast path
        expect(back).toEqual({ ...b, events: b.events.map((e) => asCarried(e, encoding)) });
      }),
      { numRuns: 300 },
    );
  });
});
