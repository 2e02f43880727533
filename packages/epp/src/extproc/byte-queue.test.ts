import { expect, test } from "bun:test";
import fc from "fast-check";
import { ByteQueue } from "./byte-queue.ts";

const alloc = (n: number) => Buffer.allocUnsafe(n);

test("a message received one byte per read is held in a few pieces, not one per byte, and taken whole", () => {
  const q = new ByteQueue();
  const n = 256 * 1024;
  for (let i = 0; i < n; i++) q.push(Buffer.from([i & 255]));
  expect(q.length).toBe(n);
  // 16 KiB blocks: 16 of them, and the first byte kept as it came.
  expect(q.pieceCount).toBeLessThanOrEqual(n / (16 * 1024) + 1);
  const out = q.take(n, alloc);
  expect(out.length).toBe(n);
  expect(out.every((b, i) => b === (i & 255))).toBe(true);
  expect(q.pieceCount).toBe(0);
});

test("pieces taken one by one, thousands of them, while small chunks keep arriving between: every byte in order", () => {
  const q = new ByteQueue();
  const sent: Buffer[] = [];
  const got: Buffer[] = [];
  let next = 0;
  const chunk = (n: number) => {
    const c = Buffer.allocUnsafe(n);
    for (let i = 0; i < n; i++) c[i] = next++ & 255;
    sent.push(c);
    q.push(c);
  };
  chunk(1);
  for (let i = 0; i < 3000; i++) {
    chunk(4096);
    chunk(3);
    if (i % 2 === 1) got.push(q.take(4096 + 3 + 4096, alloc));
  }
  got.push(q.take(q.length, alloc));
  expect(Buffer.concat(got).equals(Buffer.concat(sent))).toBe(true);
  expect(q.pieceCount).toBe(0);
});

test("any chunks, any takes: the bytes come out in order; a large chunk taken alone is a view of it", () => {
  fc.assert(
    fc.property(
      fc.array(fc.oneof(fc.integer({ min: 0, max: 40 }), fc.integer({ min: 4000, max: 20_000 })), { maxLength: 60 }),
      fc.array(fc.integer({ min: 0, max: 30_000 }), { maxLength: 60 }),
      (sizes, takes) => {
        const q = new ByteQueue();
        let next = 0;
        const sent: number[] = [];
        for (const s of sizes) {
          const c = Buffer.allocUnsafe(s);
          for (let i = 0; i < s; i++) sent.push((c[i] = next++ & 255));
          q.push(c);
        }
        const got: number[] = [];
        for (const t of takes) {
          if (t > q.length) break;
          got.push(...q.take(t, alloc));
        }
        got.push(...q.take(q.length, alloc));
        expect(got).toEqual(sent);
        expect(q.pieceCount).toBe(0);
      },
    ),
  );
  const q = new ByteQueue();
  q.push(Buffer.from([1]));
  const large = Buffer.alloc(5000, 2);
  q.push(large);
  q.take(1, alloc);
  expect(q.take(5000, alloc).buffer).toBe(large.buffer);
});

test("a piece taken is let go of at once, though what follows it stays queued", async () => {
  const q = new ByteQueue();
  const refs: WeakRef<Buffer>[] = [];
  // A message of 200 large chunks whose last one also starts the next message: joined, then only that one's rest kept.
  const fill = () => {
    for (let i = 0; i < 200; i++) {
      const c = Buffer.alloc(8192, i);
      refs.push(new WeakRef(c));
      q.push(c);
    }
    q.take(200 * 8192 - 100, alloc);
  };
  fill();
  expect(q.length).toBe(100);
  await Bun.sleep(0); // a WeakRef keeps its target until the current job ends
  Bun.gc(true);
  const alive = refs.filter((r) => r.deref() !== undefined).length;
  // The last chunk is still queued; a stray word on the stack may keep one or two others (a conservative GC).
  expect(alive).toBeLessThan(10);
});

test("an emptied queue keeps no block for small chunks", async () => {
  const q = new ByteQueue();
  const blockRef = () => {
    q.push(Buffer.alloc(8192));
    q.push(Buffer.alloc(10)); // copied into a block
    q.take(8192, alloc);
    return new WeakRef(q.take(10, alloc).buffer);
  };
  const block = blockRef();
  expect(q.length).toBe(0);
  await Bun.sleep(0);
  Bun.gc(true);
  expect(block.deref()).toBeUndefined();
});

test("what it holds counts the block of small chunks at its whole size while it is kept, and nothing once let go", () => {
  const q = new ByteQueue();
  q.push(Buffer.alloc(2)); // into an empty queue: kept as it came, no block
  expect(q.heldBytes).toBe(2);
  q.push(Buffer.alloc(1)); // copied into a block
  expect(q.heldBytes).toBe(3 + 16 * 1024);
  q.take(2, alloc);
  expect(q.heldBytes).toBe(1 + 16 * 1024);
  q.take(1, alloc); // all taken: the block let go
  expect(q.heldBytes).toBe(0);
  q.push(Buffer.alloc(5000));
  q.push(Buffer.alloc(10));
  expect(q.heldBytes).toBe(5010 + 16 * 1024);
  q.clear();
  expect(q.heldBytes).toBe(0);
});

test("peek shows the first bytes held, across pieces, after a partial take too, and leaves them to be taken", () => {
  const chunks = fc.array(fc.uint8Array({ minLength: 1, maxLength: 6000 }), { minLength: 1, maxLength: 12 });
  fc.assert(
    fc.property(chunks, chunks, fc.nat(), fc.nat(), (before, after, taken, at) => {
      const q = new ByteQueue();
      const all: Buffer[] = [];
      const push = (c: Uint8Array) => (q.push(Buffer.from(c)), all.push(Buffer.from(c)));
      before.forEach(push);
      let bytes = Buffer.concat(all);
      // As the transport does: a frame header taken, the rest of the message peeked at as it arrives.
      const k = taken % (bytes.length + 1);
      expect(q.take(k, alloc)).toEqual(bytes.subarray(0, k));
      bytes = bytes.subarray(k);
      const n = at % (bytes.length + 1);
      const seen = Buffer.from(q.peek(n));
      expect(seen).toEqual(bytes.subarray(0, n));
      after.forEach(push);
      bytes = Buffer.concat([bytes, ...after.map((c) => Buffer.from(c))]);
      expect(q.peek(n)).toEqual(seen);
      expect(q.length).toBe(bytes.length);
      expect(q.take(bytes.length, alloc)).toEqual(bytes);
    }),
    { numRuns: 300 },
  );
});
