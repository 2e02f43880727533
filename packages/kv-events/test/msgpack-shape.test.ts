// The pre-check of untrusted msgpack: every value msgpackr writes passes it; every strict prefix of
// one, a container declaring more elements than there are bytes, and nesting past the limit fail it
// at once (msgpackr itself spent 1.7 s on a 32-byte payload declaring 81M elements).
import { expect, test } from "bun:test";
import fc from "fast-check";
import { Packr, Unpackr } from "msgpackr";
import { decodeBatch, KvDecodeError } from "../src/index.ts";
import { MAX_MSGPACK_DEPTH, msgpackShapeError, unpackUntrusted } from "../src/codec/msgpack-shape.ts";

const packr = new Packr({ useRecords: false, moreTypes: false, int64AsType: "bigint" });
const unpackr = new Unpackr({ useRecords: false, mapsAsObjects: true, moreTypes: false, int64AsType: "bigint" });
const value = fc.letrec((tie) => ({
  v: fc.oneof(
    { depthSize: "small", maxDepth: 6 },
    fc.integer(),
    fc.bigInt({ min: -(2n ** 63n), max: 2n ** 64n - 1n }),
    fc.double(),
    fc.string(),
    fc.boolean(),
    fc.constant(null),
    fc.uint8Array({ maxLength: 300 }),
    fc.array(tie("v"), { maxLength: 20 }),
    fc.dictionary(fc.string(), tie("v"), { maxKeys: 5 }),
  ),
})).v;

test("every value msgpackr writes passes; every strict prefix of it fails", () => {
  fc.assert(
    fc.property(value, fc.nat(), (v, cut) => {
      const bytes = packr.pack(v);
      expect(msgpackShapeError(bytes)).toBeUndefined();
      expect(unpackUntrusted(unpackr, bytes)).toEqual(unpackr.unpack(bytes));
      expect(msgpackShapeError(bytes.subarray(0, cut % bytes.length))).toBeDefined();
    }),
    { numRuns: 2000 },
  );
});

test("a container declaring more elements than bytes remain, or nesting past the limit, is refused", () => {
  // [u32, array32 of 81M elements, ...] in 32 bytes: random bytes that held the event loop 1.7 s.
  const hostile = Buffer.from("92cef2753da9dd04d959c0b3790936bfe43cc942cc74921e20eca2297f330c1b", "hex");
  expect(msgpackShapeError(hostile)).toContain("81353152 elements");
  expect(() => decodeBatch(hostile)).toThrow(KvDecodeError);
  expect(msgpackShapeError(Buffer.from([0xdf, 0xff, 0xff, 0xff, 0xff]))).toContain("elements");
  expect(msgpackShapeError(Buffer.alloc(MAX_MSGPACK_DEPTH, 0x91))).toBeDefined(); // truncated anyway
  const deep = Buffer.concat([Buffer.alloc(100_000, 0x91), Buffer.from([0xc0])]);
  expect(msgpackShapeError(deep)).toContain("deeper");
  const justDeepEnough = Buffer.concat([Buffer.alloc(MAX_MSGPACK_DEPTH - 1, 0x91), Buffer.from([0xc0])]);
  expect(msgpackShapeError(justDeepEnough)).toBeUndefined();
  expect(msgpackShapeError(Buffer.from([0xc1]))).toContain("0xc1");
});

test("random bytes: refused or read, never a container allocated past the payload", () => {
  fc.assert(
    fc.property(fc.uint8Array({ maxLength: 64 }), (b) => {
      if (msgpackShapeError(b) !== undefined) return;
      try {
        unpackr.unpack(b);
      } catch {
        // a value that passes the shape check may still be refused by msgpackr (e.g. bad UTF-8)
      }
    }),
    { numRuns: 20_000 },
  );
});
