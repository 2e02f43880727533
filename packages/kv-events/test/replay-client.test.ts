import { afterEach, expect, test } from "bun:test";
import { decodeBatch, KvEventPublisher, replayRange } from "../src/index.ts";
import { LOOPBACK } from "@kv-epp/testkit";

const cleanup: (() => Promise<unknown>)[] = [];
afterEach(async () => {
  for (const f of cleanup.splice(0)) await f().catch(() => {});
});

async function publisherWith(n: number, replayBuffer = 100): Promise<KvEventPublisher> {
  const pub = await KvEventPublisher.bind({ endpoint: `tcp://${LOOPBACK}.1.7:0`, replayEndpoint: `tcp://${LOOPBACK}.1.7:0`, replayBuffer });
  cleanup.push(() => pub.close());
  for (let i = 0; i < n; i++) pub.publish({ ts: i, events: [{ type: "BlockRemoved", blockHashes: [BigInt(i)], medium: "GPU" }], dataParallelRank: null });
  return pub;
}

test("a range the buffer holds comes back exactly, in order, nothing outside it", async () => {
  const pub = await publisherWith(10);
  const r = await replayRange({ endpoint: pub.replayEndpoint!, from: 3n, to: 7n });
  expect(r.kind).toBe("covered");
  if (r.kind !== "covered") return;
  expect(r.batches.map((b) => b.seq)).toEqual([3n, 4n, 5n, 6n]);
  expect(r.batches.map((b) => decodeBatch(b.payload).events[0])).toEqual([3n, 4n, 5n, 6n].map((h) => ({ type: "BlockRemoved", blockHashes: [h], medium: "GPU" })));
});

test("a range older than the buffer, or beyond what was published, is not covered", async () => {
  const pub = await publisherWith(10, 4); // holds 6..9
  expect(await replayRange({ endpoint: pub.replayEndpoint!, from: 2n, to: 8n })).toEqual({ kind: "uncovered", reason: "short", got: 0 });
  expect(await replayRange({ endpoint: pub.replayEndpoint!, from: 8n, to: 12n })).toEqual({ kind: "uncovered", reason: "short", got: 2 });
  expect(await replayRange({ endpoint: pub.replayEndpoint!, from: 5n, to: 5n })).toEqual({ kind: "covered", batches: [] });
});

test("no replay server answering: uncovered at the timeout", async () => {
  expect(await replayRange({ endpoint: `tcp://${LOOPBACK}.1.7:1`, from: 0n, to: 3n, timeoutMs: 200 })).toEqual({ kind: "uncovered", reason: "timeout", got: 0 });
});
