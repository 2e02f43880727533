import { expect, test } from "bun:test";
import { getEventListeners } from "node:events";
import { PrefixCacheSim, RankEngine, TimingModel } from "../src/index.ts";

test("a generation leaves no abort listener per decoded token on the request's signal", async () => {
  const timing = new TimingModel({ speed: 1, prefillBaseMs: 0, prefillMsPerToken: 0, decodeMsPerToken: 0.01, decodeBatchFactor: 0 });
  const engine = new RankEngine(0, new PrefixCacheSim({ blockSize: 4, capacityBlocks: 16 }), timing);
  const request = new AbortController();
  const gen = await engine.start(Uint32Array.from([1, 2, 3, 4, 5]), 50, request.signal);
  let tokens = 0;
  for await (const _ of gen.tokens()) tokens++;
  expect(tokens).toBe(50);
  expect(getEventListeners(request.signal, "abort").length).toBe(0);
});
