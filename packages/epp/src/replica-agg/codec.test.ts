import { describe, expect, test } from "bun:test";
import fc from "fast-check";
import { Packr } from "msgpackr";
import { workerKeyOf } from "@kv-epp/protocol";
import { AGG_VERSION, AggDecodeError, decodeAggMessage, encodeAggMessage, type AggEntry, type AggMessage } from "./codec.ts";

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
    const m = decodeAggMessage(packr.pack([AGG_VERSION, "r", 1, 1, [[1, 5, "w", 0, 4, 4, "future"], [3, 5, 99]], "extra"]));
    expect(m).toEqual({ kind: "delta", replica: "r", seq: 1, ops: [{ op: "added", entry: { id: 5, workerKey: workerKeyOf("w", 0), blocks: 4, prefillBlocks: 4 } }, { op: "freed", id: 5 }] });
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
