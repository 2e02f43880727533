// --rank-ports: one API server per rank (vLLM's external DP load balancing, each an InferencePool
// target port): a request on rank r's port runs on rank r, which publishes on the KV port + r.
import { afterAll, expect, test } from "bun:test";
import { startMockWorker, type MockWorker } from "../src/worker.ts";
import { LOOPBACK } from "@kv-epp/testkit";

let w: MockWorker | undefined;
afterAll(() => w?.close());

test("each rank's own port serves that rank only, which it numbers 0 as vLLM's external load balancing does", async () => {
  w = await startMockWorker({ listen: `${LOOPBACK}.2.9`, port: 18230, kvEvents: `tcp://${LOOPBACK}.2.9:18240`, speed: 0, blockSize: 16, dpSize: 2, rankPorts: true, logLevel: "silent" });
  expect(w.urls).toEqual([`http://${LOOPBACK}.2.9:18230`, `http://${LOOPBACK}.2.9:18231`]);
  expect(w.ranks.map((r) => r.kvEvents)).toEqual([`tcp://${LOOPBACK}.2.9:18240`, `tcp://${LOOPBACK}.2.9:18241`]);
  const complete = (url: string, headers: Record<string, string> = {}) =>
    fetch(`${url}/v1/completions`, { method: "POST", headers: { "content-type": "application/json", ...headers }, body: JSON.stringify({ model: w!.config.model, prompt: Array.from({ length: 64 }, (_, i) => i + 1), max_tokens: 1 }) });
  expect((await complete(w.urls[1]!)).status).toBe(200);
  expect(w.ranks[1]!.cache.usedBlocks).toBeGreaterThan(0);
  expect(w.ranks[0]!.cache.usedBlocks).toBe(0);
  // Its one engine is rank 0 to that server; rank 1 is out of its range [0, 1).
  expect((await complete(w.urls[1]!, { "x-data-parallel-rank": "0" })).status).toBe(200);
  expect(w.ranks[0]!.cache.usedBlocks).toBe(0);
  expect((await complete(w.urls[1]!, { "x-data-parallel-rank": "1" })).status).toBe(400);
});

test("each rank's port exposes its own engine's /metrics only, as vLLM's one process per rank does", async () => {
  const metricsOf = async (url: string) => {
    const text = await (await fetch(`${url}/metrics`)).text();
    return new Set([...text.matchAll(/^vllm:num_requests_waiting\{[^}]*engine="(\d+)"/gm)].map((m) => m[1]));
  };
  expect(await metricsOf(w!.urls[0]!)).toEqual(new Set(["0"]));
  expect(await metricsOf(w!.urls[1]!)).toEqual(new Set(["1"]));
});
