import { describe, expect, test } from "bun:test";
import fc from "fast-check";
import {
  computeBlockHashes, encodeExtraKeys, eventBlockExtras, KvIndex, requestBlockExtras,
  type BlockExtraKeys, type ExtraKey,
} from "../src/index.ts";
import { applyStored, findMatches } from "../src/helpers.ts";
import { workerKey } from "@kv-epp/protocol";

const tokensLE = (ids: number[]) => {
  const b = new Uint8Array(ids.length * 4);
  const dv = new DataView(b.buffer);
  ids.forEach((t, i) => dv.setUint32(4 * i, t, true));
  return b;
};
const concat = (...parts: Uint8Array[]) => {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let o = 0;
  for (const p of parts) { out.set(p, o); o += p.length; }
  return out;
};
const hex = (b: Uint8Array) => Buffer.from(b).toString("hex");

const extraKey: fc.Arbitrary<ExtraKey> = fc.oneof(
  fc.string({ unit: "grapheme", maxLength: 12 }),
  fc.record({ mmId: fc.string({ maxLength: 12 }), offset: fc.integer({ min: -5000, max: 5000 }) }),
  fc.uint8Array({ maxLength: 40 }),
);

describe("block identity with extra keys", () => {
  test("the worked example of the README: bytes and hash", () => {
    // tokens [1, 2, 3, 4], block size 4, LoRA "sql-lora", cache salt "tenant-a" (block 0)
    const [block0] = requestBlockExtras(1, 4, { loraName: "sql-lora", cacheSalt: "tenant-a" });
    expect(block0).toEqual(["sql-lora", "tenant-a"]);
    const trailer = encodeExtraKeys(block0!);
    expect(hex(trailer)).toBe(
      "01" + "08000000" + "73716c2d6c6f7261" // string "sql-lora"
      + "01" + "08000000" + "74656e616e742d61" // string "tenant-a"
      + "02000000" + "4b565831", // 2 entries, "KVX1"
    );
    const got = computeBlockHashes(Uint32Array.from([1, 2, 3, 4]), 4, [block0]);
    expect(got[0]).toBe(Bun.hash.xxHash3(concat(tokensLE([1, 2, 3, 4]), trailer), 1337n));
    expect(got[0]).toBe(7054540032639063881n);
    expect(computeBlockHashes(Uint32Array.from([1, 2, 3, 4]), 4)[0]).toBe(14643705804678351452n);
  });

  test("a multimodal entry is tag 2, the identifier, then the block-relative offset as i64 little-endian", () => {
    expect(hex(encodeExtraKeys([{ mmId: "img", offset: -2 }]))).toBe(
      "02" + "03000000" + "696d67" + "feffffffffffffff" + "01000000" + "4b565831",
    );
    expect(hex(encodeExtraKeys([Uint8Array.of(0xab, 0xcd)]))).toBe("03" + "02000000" + "abcd" + "01000000" + "4b565831");
  });

  test("blocks without extra keys hash exactly as their tokens alone", () => {
    fc.assert(fc.property(
      fc.array(fc.nat({ max: 0xffffffff }), { maxLength: 120 }), fc.integer({ min: 1, max: 16 }),
      fc.array(fc.option(fc.constant([] as ExtraKey[]), { nil: undefined }), { maxLength: 20 }),
      (ids, bs, extras) => {
        const t = Uint32Array.from(ids);
        expect(computeBlockHashes(t, bs, extras)).toEqual(computeBlockHashes(t, bs));
      },
    ), { numRuns: 200 });
  });

  test("each block hashes its tokens followed by its own extra keys' bytes, in the module", () => {
    fc.assert(fc.property(
      fc.integer({ min: 1, max: 12 }).chain((bs) => fc.tuple(
        fc.constant(bs),
        fc.array(fc.nat({ max: 0xffffffff }), { minLength: bs, maxLength: bs * 8 }),
        fc.array(fc.option(fc.array(extraKey, { maxLength: 4 }), { nil: null }), { maxLength: 9 }),
      )),
      ([bs, ids, extras]) => {
        const got = computeBlockHashes(Uint32Array.from(ids), bs, extras);
        for (let i = 0; i < got.length; i++) {
          const keys = extras[i] ?? [];
          const want = Bun.hash.xxHash3(concat(tokensLE(ids.slice(i * bs, (i + 1) * bs)), encodeExtraKeys(keys)), 1337n);
          expect(got[i]).toBe(want);
        }
      },
    ), { numRuns: 300 });
  });

  test("the layout is unambiguous: tuples that differ only in how entries split or are typed hash apart", () => {
    const t = Uint32Array.from([7, 7, 7, 7]);
    const tuples: BlockExtraKeys[] = [
      [], ["ab"], ["a", "b"], ["b", "a"], ["", "ab"], [new TextEncoder().encode("ab")], [{ mmId: "ab", offset: 0 }],
      [{ mmId: "ab", offset: 1 }], [{ mmId: "a", offset: 0 }, "b"], ["sql-lora"], ["sql-lora", "salt"], ["salt"],
    ];
    const hashes = tuples.map((k) => computeBlockHashes(t, 4, [k])[0]);
    expect(new Set(hashes).size).toBe(tuples.length);
  });

  test("a malformed extra key is a TypeError, not a silent hash", () => {
    expect(() => computeBlockHashes(Uint32Array.from([1, 2]), 2, [[{ mmId: "x", offset: 0.5 } as ExtraKey]])).toThrow(TypeError);
    expect(() => computeBlockHashes(Uint32Array.from([1, 2]), 2, [[42 as unknown as ExtraKey]])).toThrow(TypeError);
  });
});

describe("requestBlockExtras (vLLM's generate_block_hash_extra_keys)", () => {
  test("the LoRA name on every block, the salt on block 0 only, in that order", () => {
    expect(requestBlockExtras(3, 16, { loraName: "sql-lora", cacheSalt: "s" })).toEqual([["sql-lora", "s"], ["sql-lora"], ["sql-lora"]]);
    expect(requestBlockExtras(2, 16, { cacheSalt: "s" })).toEqual([["s"], []]);
    expect(requestBlockExtras(2, 16, {})).toEqual([[], []]);
  });

  test("multimodal items overlapping a block, with offsets relative to its first token, before the salt", () => {
    // blocks of 4: item A covers tokens 2..8, item B 9..10
    const items = [{ mmId: "A", offset: 2, length: 7 }, { mmId: "B", offset: 9, length: 2 }];
    expect(requestBlockExtras(4, 4, { loraName: "l", cacheSalt: "s", mmItems: items })).toEqual([
      ["l", { mmId: "A", offset: 2 }, "s"],
      ["l", { mmId: "A", offset: -2 }],
      ["l", { mmId: "A", offset: -6 }, { mmId: "B", offset: 1 }],
      ["l"],
    ]);
  });

  test("prompt-embeds digests come last, per block", () => {
    const d = Uint8Array.of(1, 2, 3);
    expect(requestBlockExtras(2, 4, { cacheSalt: "s", promptEmbedDigests: [undefined, d] })).toEqual([["s"], [d]]);
  });
});

describe("eventBlockExtras", () => {
  test("an event's extra_keys are used as they are; without them, lora_name is folded into every block", () => {
    const ek = [["sql-lora", "salt"], null];
    expect(eventBlockExtras(2, { loraName: "sql-lora", extraKeys: ek })).toBe(ek);
    expect(eventBlockExtras(2, { loraName: "sql-lora" })).toEqual([["sql-lora"], ["sql-lora"]]);
    expect(eventBlockExtras(2, { loraName: null, extraKeys: null })).toEqual([]);
  });

  test("a request and the event vLLM publishes for it produce the same local hashes", () => {
    const ids = Uint32Array.from({ length: 48 }, (_, i) => 1000 + i);
    const fromRequest = computeBlockHashes(ids, 16, requestBlockExtras(3, 16, { loraName: "sql-lora", cacheSalt: "t" }));
    // vLLM's BlockStored for that prompt: extra_keys per block as generate_block_hash_extra_keys built them
    const fromEvent = computeBlockHashes(ids, 16, eventBlockExtras(3, { loraName: "sql-lora", extraKeys: [["sql-lora", "t"], ["sql-lora"], ["sql-lora"]] }));
    expect(fromEvent).toEqual(fromRequest);
  });
});

describe("the index under the new identity", () => {
  const w = { workerId: "vllm-0", dpRank: 0 };
  const ids = Uint32Array.from({ length: 64 }, (_, i) => i * 7 + 1);
  const store = (index: KvIndex, hashes: BigUint64Array, base: bigint) =>
    applyStored(index, w, null, [...hashes].map((t, i) => ({ blockHash: base + BigInt(i), tokensHash: t })));

  test("the same tokens under another adapter or salt never match; every block of a salted chain differs", () => {
    const index = KvIndex.create({ blockSize: 16 });
    const base = computeBlockHashes(ids, 16);
    const lora = computeBlockHashes(ids, 16, requestBlockExtras(4, 16, { loraName: "sql-lora" }));
    const salted = computeBlockHashes(ids, 16, requestBlockExtras(4, 16, { cacheSalt: "tenant-a" }));
    store(index, lora, 2n ** 63n);
    expect(findMatches(index, base).scores.size).toBe(0);
    expect(findMatches(index, salted).scores.size).toBe(0);
    expect(findMatches(index, lora).scores).toEqual(new Map([[workerKey(w), 4]]));
    store(index, salted, 2n ** 63n + 100n);
    // blocks 1.. of the salted chain hash like the unsalted ones locally, but sit under a salted block 0
    expect(salted.slice(1)).toEqual(base.slice(1));
    expect(findMatches(index, base).scores.size).toBe(0);
    expect(findMatches(index, salted).scores).toEqual(new Map([[workerKey(w), 4]]));
  });
});
