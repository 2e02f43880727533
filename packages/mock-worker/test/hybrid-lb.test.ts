// --data-parallel-hybrid-lb: a later node of a multi-node DP group (llm-d's wide-EP layout, one API
// server per node). Its KV events follow the global rank (port + global rank, data_parallel_rank
// global), while its API server numbers its own engines from 0 in x-data-parallel-rank, and refuses
// a rank outside them as vLLM's input processor does.
import { afterEach, expect, test } from "bun:test";
import type { BlockStored } from "@kv-epp/kv-events";
import { waitFor, LOOPBACK } from "@kv-epp/testkit";
import { startMockWorker, type MockWorker } from "../src/index.ts";
import { post, subscribe, syncSubscribers } from "./support.ts";

const cleanup: (() => Promise<unknown>)[] = [];
afterEach(async () => {
  for (const f of cleanup.splice(0).reverse()) await f().catch(() => {});
});

async function node(): Promise<{ w: MockWorker; subs: ReturnType<typeof subscribe>[] }> {
  const w = await startMockWorker({
    listen: `${LOOPBACK}.2.1`, port: 0, kvEvents: `tcp://${LOOPBACK}.2.1:25760`, speed: 0, blockSize: 4, logLevel: "silent",
    dpSize: 2, dataParallelStartRank: 2, dataParallelHybridLb: true,
  });
  cleanup.push(() => w.close());
  const subs = w.ranks.map((r) => subscribe(r.kvEvents));
  for (const s of subs) cleanup.push(async () => s.close());
  await syncSubscribers(w.url, subs);
  return { w, subs };
}

const complete = (w: MockWorker, rank: string) => post(`${w.url}/v1/completions`, { prompt: [1, 2, 3, 4, 5], max_tokens: 1 }, { "x-data-parallel-rank": rank });

test("a hybrid-LB node at start rank 2 publishes global ranks 2 and 3 on port + 2 and + 3, and x-data-parallel-rank 1 is its second engine", async () => {
  const { w, subs } = await node();
  expect(w.ranks.map((r) => [r.rank, r.kvEvents])).toEqual([[2, `tcp://${LOOPBACK}.2.1:25762`], [3, `tcp://${LOOPBACK}.2.1:25763`]]);
  expect((await complete(w, "1")).status).toBe(200);
  await waitFor(() => subs[1]!.messages.some((m) => m.batch.events.some((e) => e.type === "BlockStored")), { message: "rank 3's BlockStored" });
  const batch = subs[1]!.messages.find((m) => m.batch.events.some((e): e is BlockStored => e.type === "BlockStored"))!.batch;
  expect(batch.dataParallelRank).toBe(3);
  expect(w.ranks[1]!.cache.usedBlocks).toBeGreaterThan(0);
  expect(w.ranks[0]!.cache.usedBlocks).toBe(0);
});

test("the global rank is out of a hybrid node's range: 400 with vLLM's message; a header int() refuses is ignored", async () => {
  const { w } = await node();
  const res = await complete(w, "3");
  expect(res.status).toBe(400);
  expect(((await res.json()) as { error: { message: string; param: string } }).error).toMatchObject({
    message: "data_parallel_rank 3 is out of range [0, 2).",
    param: "x-data-parallel-rank",
  });
  expect((await complete(w, "2")).status).toBe(400);
  expect((await complete(w, " +0 ")).status).toBe(200); // Python's int() takes sign and whitespace
  expect((await complete(w, "one")).status).toBe(200); // not an int: as if absent
  // SGLang's body fields are not vLLM's: ignored, whatever they hold.
  expect((await post(`${w.url}/v1/completions`, { prompt: [1, 2, 3, 4, 5], max_tokens: 1, routed_dp_rank: "x", data_parallel_rank: 7 })).status).toBe(200);
  expect(w.ranks[0]!.cache.usedBlocks).toBeGreaterThan(0);
});
