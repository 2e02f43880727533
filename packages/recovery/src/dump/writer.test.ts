import { expect, test } from "bun:test";
import { DUMP_SLICE_MS, streamFromChunks } from "./writer.ts";

test("a dump read as fast as it is written still lets the event loop turn between slices", async () => {
  // Each chunk costs a little CPU, like the index writing one; the reader keeps up (microtasks only), as a
  // loopback socket does: without slices the whole body would be written in one turn.
  const chunks = 40;
  let made = 0;
  const next = () => {
    if (made === chunks) return null;
    const until = performance.now() + DUMP_SLICE_MS / 2;
    while (performance.now() < until) {} // eslint-disable-line no-empty
    return new Uint8Array([made++]);
  };
  let turns = 0;
  const seenAt: number[] = [];
  const tick = () => {
    turns++;
    if (made < chunks) setImmediate(tick);
  };
  setImmediate(tick);
  const reader = streamFromChunks(next, null, () => {}).getReader();
  const got: number[] = [];
  for (let r = await reader.read(); !r.done; r = await reader.read()) {
    got.push(r.value[0]!);
    seenAt.push(turns);
  }
  expect(got).toEqual([...Array(chunks).keys()]);
  // Other work (the ticks standing for picks) ran while the body was written, not only after it.
  expect(seenAt[seenAt.length - 1]!).toBeGreaterThan(seenAt[0]!);
});

test("a reader that goes away while the stream waits for its turn gets no more chunks from the source", async () => {
  let made = 0;
  let cancelled = 0;
  const next = () => {
    const until = performance.now() + DUMP_SLICE_MS;
    while (performance.now() < until) {} // eslint-disable-line no-empty
    return new Uint8Array([made++]);
  };
  const reader = streamFromChunks(next, null, () => void cancelled++).getReader();
  await reader.read();
  // A second read past the slice: its pull waits for a turn, and the reader leaves meanwhile.
  void reader.read().catch(() => {});
  await Promise.resolve();
  await reader.cancel();
  const after = made;
  await new Promise((r) => setTimeout(r, 20));
  expect(cancelled).toBe(1);
  expect(made).toBe(after);
});
