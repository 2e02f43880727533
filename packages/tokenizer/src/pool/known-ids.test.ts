import { expect, test } from "bun:test";
import { appendIds } from "./known-ids";

// Ids far from 0, so that an id left unwritten (0) is told apart.
const ids = (from: number, n: number) => Uint32Array.from({ length: n }, (_, i) => 1000 + from + i);

test("reports appended one after another are the prefix they add up to, and earlier views keep their ids", () => {
  const first = ids(0, 3);
  let known = appendIds(undefined, first);
  // The first report is adopted as it came.
  expect(known).toBe(first);
  const views = [known];
  for (const [from, n] of [[3, 2], [5, 0], [5, 1], [6, 7], [13, 1], [14, 30]] as const) {
    known = appendIds(known, ids(from, n));
    views.push(known);
  }
  expect([...known]).toEqual([...ids(0, 44)]);
  for (const v of views) expect([...v]).toEqual([...ids(0, v.length)]);
});

test("a prefix grows in place while its buffer has room, into one twice its length when not", () => {
  const a = appendIds(ids(0, 4), ids(4, 4));
  expect(a.buffer.byteLength).toBe(2 * 8 * 4);
  const b = appendIds(a, ids(8, 8));
  expect(b.buffer).toBe(a.buffer);
  expect([...b]).toEqual([...ids(0, 16)]);
  const c = appendIds(b, ids(16, 1));
  expect(c.buffer).not.toBe(b.buffer);
  expect([...c]).toEqual([...ids(0, 17)]);
});
