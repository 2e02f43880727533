import { describe, expect, test } from "bun:test";
import fc from "fast-check";
import { Packr } from "msgpackr";
import { workerKeyOf } from "@kv-epp/protocol";
import { AGG_PREFIX_MAX_KEYS, AGG_VERSION, AggDecodeError, decodeAggMessage, encodeAggMessage, opOf, type AggEntry, type AggMessage } from "./codec.ts";
import { deltaParts } from "./outbox.ts";

const packr = new Packr({ useRecords: false });
const u = fc.integer({ min: 0, max: Number.MAX_SAFE_INTEGER });
const entry: fc.Arbitrary<AggEntry> = fc
  .record({ id: u, workerId: fc.string({ minLength: 1, maxLength: 20 }), rank: fc.integer({ min: 0, max: 63 }), blocks: fc.integer({ min: 0, max: 1 << 20 }), frac: fc.double({ min: 0, max: 1, noNaN: true }) })
  .map((r) => ({ id: r.id, workerKey: workerKeyOf(r.workerId, r.rank), blocks: r.blocks, prefillBlocks: Math.floor(r.blocks * r.frac) }));
const message: fc.Arbitrary<AggMessage> = fc.oneof(
  fc.record({
    kind: fc.constant("delta" as const),
    replica: fc.string({ minLength: 1, maxLength: 64 }),
    seq: u,
    ops: fc.array(
      fc.oneof(
        entry.map((e) => ({ op: "added" as const, entry: e })),
        fc.tuple(entry, fc.array(fc.integer({ min: 0, max: Number.MAX_SAFE_INTEGER }), { minLength: 1, maxLength: 40 })).map(([e, keys]) => ({ op: "added" as const, entry: e, prefix: Float64Array.from(keys) })),
        u.map((id) => ({ op: "prefilled" as const, id })),
        u.map((id) => ({ op: "freed" as const, id })),
      ),
    ),
  }),
  fc.record({ kind: fc.constant("snapshot" as const), replica: fc.string({ minLength: 1, maxLength: 64 }), seq: u, entries: fc.array(entry) }),
);

describe("replica-agg codec", () => {
  test("every message round-trips exactly", () => {
    fc.assert(fc.property(message, (m) => expect(decodeAggMessage(encodeAggMessage(m))).toEqual(m)));
  });

  test("the wire layout is the documented msgpack array (README.md)", () => {
    const bytes = encodeAggMessage({
      kind: "delta",
      replica: "00112233aabbccdd",
      seq: 7,
      ops: [
        { op: "added", entry: { id: 3, workerKey: workerKeyOf("w-0", 1), blocks: 40, prefillBlocks: 12 } },
        { op: "prefilled", id: 3 },
        { op: "freed", id: 2 },
      ],
    });
    expect(packr.unpack(bytes)).toEqual([1, "00112233aabbccdd", 7, 1, [[1, 3, "w-0", 1, 40, 12], [2, 3], [3, 2]]]);
    const snap = encodeAggMessage({ kind: "snapshot", replica: "r", seq: 8, entries: [{ id: 3, workerKey: workerKeyOf("w-0", 0), blocks: 40, prefillBlocks: 0 }] });
    expect(packr.unpack(snap)).toEqual([1, "r", 8, 2, [[3, "w-0", 0, 40, 0]]]);
  });

  test("fields added after the known ones (a later minor revision) are ignored", () => {
    const m = decodeAggMessage(packr.pack([AGG_VERSION, "r", 1, 1, [[1, 5, "w", 0, 4, 4, null, "future"], [3, 5, 99]], "extra"]));
    expect(m).toEqual({ kind: "delta", replica: "r", seq: 1, ops: [{ op: "added", entry: { id: 5, workerKey: workerKeyOf("w", 0), blocks: 4, prefillBlocks: 4 } }, { op: "freed", id: 5 }] });
  });

  test("an added op's prefix keys travel as a bin of little-endian float64s; a sender without them (or an older one) writes six elements", () => {
    const prefix = Float64Array.of(0, 1, 2 ** 53 - 1);
    const bytes = encodeAggMessage({ kind: "delta", replica: "r", seq: 1, ops: [{ op: "added", entry: { id: 5, workerKey: workerKeyOf("w", 0), blocks: 4, prefillBlocks: 4 }, prefix }] });
    const raw = packr.unpack(bytes) as unknown[][][];
    const bin = raw[4]![0]![6] as Uint8Array;
    expect(bin.length).toBe(24);
    expect(new DataView(bin.buffer, bin.byteOffset, 24).getFloat64(16, true)).toBe(2 ** 53 - 1);
    expect(decodeAggMessage(bytes)).toMatchObject({ ops: [{ op: "added", prefix }] });
    // the load's change carries at most AGG_PREFIX_MAX_KEYS keys onto the wire
    const long = new Float64Array(AGG_PREFIX_MAX_KEYS + 10).map((_, i) => i);
    const op = opOf({ kind: "added", id: 1, entry: { workerKey: "w\u00000", blocks: 600, prefillBlocks: 600 }, prefix: long });
    expect(op).toMatchObject({ op: "added" });
    expect((op as { prefix: Float64Array }).prefix.length).toBe(AGG_PREFIX_MAX_KEYS);
    expect(opOf({ kind: "added", id: 1, entry: { workerKey: "w\u00000", blocks: 1, prefillBlocks: 1 } })).not.toHaveProperty("prefix");
  });

  test("a prefix past the key cap keeps its first keys (a later sender's higher cap interoperates); an empty bin is no prefix", () => {
    const long = new Float64Array(AGG_PREFIX_MAX_KEYS + 7).map((_, i) => i);
    const bin = new Uint8Array(long.buffer);
    const m = decodeAggMessage(packr.pack([1, "r", 1, 1, [[1, 5, "w", 0, 4, 4, bin], [1, 6, "w", 0, 4, 4, new Uint8Array(0)]]]));
    if (m.kind !== "delta") throw new Error("delta expected");
    expect(m.ops[0]).toMatchObject({ op: "added", prefix: long.subarray(0, AGG_PREFIX_MAX_KEYS) });
    expect(m.ops[1]).not.toHaveProperty("prefix");
  });

  test("one turn's ops go out as deltas of at most DELTA_MAX_PREFIX_KEYS prefix keys each, in order, no op split", () => {
    const op = (id: number, keys: number) => ({ op: "added" as const, entry: { id, workerKey: workerKeyOf("w", 0), blocks: keys, prefillBlocks: 0 }, ...(keys > 0 ? { prefix: new Float64Array(keys) } : {}) });
    const ops = [op(1, 300), op(2, 0), { op: "freed" as const, id: 1 }, op(3, 300), op(4, 500), op(5, 10)];
    const parts = deltaParts(ops, 600);
    expect(parts.map((p) => p.map((o) => (o.op === "added" ? o.entry.id : -o.id)))).toEqual([[1, 2, -1, 3], [4, 5]]);
    expect(deltaParts(ops).length).toBe(1);
    expect(deltaParts([op(9, 700)], 600)).toEqual([[op(9, 700)]]); // a lone op past the budget still goes
  });

  test.each([
    ["a prefix that is not a bin", packr.pack([1, "r", 1, 1, [[1, 5, "w", 0, 4, 4, "keys"]]])],
    ["a prefix of a partial key", packr.pack([1, "r", 1, 1, [[1, 5, "w", 0, 4, 4, new Uint8Array(12)]]])],
    ["a prefix key that is not an integer", packr.pack([1, "r", 1, 1, [[1, 5, "w", 0, 4, 4, new Uint8Array(new Float64Array([Number.NaN]).buffer)]]])],
  ])("%s is refused with AggDecodeError", (_name, bytes) => {
    expect(() => decodeAggMessage(bytes)).toThrow(AggDecodeError);
  });

  test.each([
    ["not msgpack", new Uint8Array([0xc1])],
    ["not an array", packr.pack({ v: 1 })],
    ["another version", packr.pack([2, "r", 1, 1, []])],
    ["empty replica id", packr.pack([1, "", 1, 1, []])],
    ["negative seq", packr.pack([1, "r", -1, 1, []])],
    ["fractional seq", packr.pack([1, "r", 1.5, 1, []])],
    ["unknown kind", packr.pack([1, "r", 1, 9, []])],
    ["unknown op", packr.pack([1, "r", 1, 1, [[7, 1]]])],
    ["short added op", packr.pack([1, "r", 1, 1, [[1, 1, "w", 0]]])],
    ["empty worker id", packr.pack([1, "r", 1, 2, [[1, "", 0, 4, 0]]])],
    ["prefill above blocks", packr.pack([1, "r", 1, 2, [[1, "w", 0, 4, 5]]])],
    ["string block count", packr.pack([1, "r", 1, 2, [[1, "w", 0, "4", 0]]])],
  ])("%s is refused with AggDecodeError", (_name, bytes) => {
    expect(() => decodeAggMessage(bytes)).toThrow(AggDecodeError);
  });

  test("arbitrary bytes never throw anything but AggDecodeError", () => {
    fc.assert(
      fc.property(fc.uint8Array({ maxLength: 64 }), (b) => {
        try {
          decodeAggMessage(b);
        } catch (err) {
          expect(err).toBeInstanceOf(AggDecodeError);
        }
      }),
    );
  });
});
