import { expect, test } from "bun:test";
import { toRouterEvents } from "./router-events.ts";

test("an index's dump events become RouterEvents numbered in stream order, u64 hashes kept exact", () => {
  const big = (1n << 64n) - 1n;
  const events = [...toRouterEvents([
    { worker: { workerId: "a", dpRank: 0 }, parentHash: null, blocks: [{ blockHash: big, tokensHash: 1n }] },
    { worker: { workerId: "b", dpRank: 2 }, parentHash: big, blocks: [{ blockHash: 7n, tokensHash: 1n << 63n }] },
  ])];
  expect(events).toEqual([
    { workerId: "a", dpRank: 0, eventId: 0, parentHash: null, blocks: [{ blockHash: big, tokensHash: 1n }] },
    { workerId: "b", dpRank: 2, eventId: 1, parentHash: big, blocks: [{ blockHash: 7n, tokensHash: 1n << 63n }] },
  ]);
});
