import { expect, test } from "bun:test";
import { getEventListeners } from "node:events";
import { DEFAULT_TIMING, PrefixCacheSim, RankEngine } from "../src/index.ts";

const FAST = { ...DEFAULT_TIMING, stepBaseMs: 0.01, msPerToken: 0 };

test("a generation leaves no abort listener on the request's signal", async () => {
  const engine = new RankEngine(0, new PrefixCacheSim({ blockSize: 4, capacityBlocks: 16 }), FAST);
  const request = new AbortController();
  const gen = await engine.start(Uint32Array.from([1, 2, 3, 4, 5]), 50, request.signal);
  let tokens = 0;
  for await (const _ of gen.tokens()) tokens++;
  expect(tokens).toBe(50);
  expect(getEventListeners(request.signal, "abort").length).toBe(0);
  expect(engine.load).toBe(0);
});

test("requests decode in the same steps, and an abort frees the request's blocks and slot", async () => {
  const cache = new PrefixCacheSim({ blockSize: 4, capacityBlocks: 16 });
  const engine = new RankEngine(0, cache, { ...FAST, stepBaseMs: 2, maxNumSeqs: 1 });
  const a = new AbortController();
  const gen = await engine.start(Uint32Array.from([1, 2, 3, 4, 5, 6, 7, 8, 9]), 1_000_000, a.signal);
  const queued = engine.start(Uint32Array.from([9, 9, 9, 9, 9]), 1);
  expect(engine.running).toBe(1);
  expect(engine.waiting).toBe(1);
  expect(cache.usage).toBeGreaterThan(0);
  const reading = (async () => {
    for await (const _ of gen.tokens());
  })();
  a.abort(new Error("client went away"));
  await expect(reading).rejects.toThrow("client went away");
  const second = await queued;
  expect(second.promptTokens).toBe(5);
  for await (const _ of second.tokens());
  expect(engine.load).toBe(0);
  expect(cache.usage).toBe(0);
});

test("an abort while waiting rejects the start and never touches the cache", async () => {
  const cache = new PrefixCacheSim({ blockSize: 4, capacityBlocks: 16 });
  const engine = new RankEngine(0, cache, { ...FAST, stepBaseMs: 2, maxNumSeqs: 1 });
  const busy = await engine.start(Uint32Array.from([1, 2, 3, 4, 5]), 1_000_000);
  const c = new AbortController();
  const waiting = engine.start(Uint32Array.from([7, 7, 7, 7, 7, 7, 7, 7, 7]), 1, c.signal);
  c.abort(new Error("gone"));
  await expect(waiting).rejects.toThrow("gone");
  expect(engine.waiting).toBe(0);
  busy.finish();
  expect(engine.load).toBe(0);
  expect(cache.peekHitBlocks(Uint32Array.from([7, 7, 7, 7, 7, 7, 7, 7, 7]))).toBe(0);
});

test("a step that throws (a cache listener failing) rejects the requests it held, and the engine serves the next ones", async () => {
  const cache = new PrefixCacheSim({ blockSize: 4, capacityBlocks: 16 });
  const engine = new RankEngine(0, cache, FAST);
  let fail = true;
  cache.subscribe(() => {
    if (fail) throw new Error("listener failed");
  });
  await expect(engine.start(Uint32Array.from([1, 2, 3, 4, 5]), 3)).rejects.toThrow("listener failed");
  expect(engine.load).toBe(0);
  fail = false;
  const gen = await engine.start(Uint32Array.from([6, 7, 8, 9, 10]), 3);
  let n = 0;
  for await (const _ of gen.tokens()) n++;
  expect(n).toBe(3);
});
