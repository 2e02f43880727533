import { describe, expect, test } from "bun:test";
import { release } from "node:os";
import { requestThreadSlice, threadId, threadNice, threadSliceUs } from "../src/pool/thread-priority";
import {
  DEFAULT_MEMBER_NICE, BadRequest, ChatTemplateError, createPreprocessor, encodeJob, joinBody, nextTurnJob, readBody, TokenizeCancelled, TokenizerPool,
  TooDeep, type PoolJob, type TokenizeJob,
} from "../src/index";
import { copyFileSync, readdirSync, rmSync } from "node:fs";
import { join } from "node:path";
import { freshWords, tempDir } from "@kv-epp/testkit";
import { chatReplyBody } from "./chat-reply-body";
import { chat, freshChat, QWEN3_DIR as dir, qwen3Pools } from "./qwen3-pool";
import { modelDir } from "./reference-tokenizers";

const pools = qwen3Pools();

/**
 * About `words` fresh words in lines of 50: a text cut into pieces (the segmenter cuts a long section where the
 * pre-tokenizer provably restarts, at line ends here), which is told as it is tokenized.
 */
function lines(words: number, seed: number): string {
  return Array.from({ length: Math.ceil(words / 50) }, (_, i) => freshWords(50, seed * 100_000 + i)).join("\n");
}

/**
 * Whether member `i`'s thread keeps the process alive, as the pool last set it (a Worker does not tell), from
 * `held` on: an idle member must not.
 */
function watchRef(pool: TokenizerPool, i: number, held = false): () => boolean {
  const w = (pool as unknown as { members: { worker: { ref(): void; unref(): void } }[] }).members[i]!.worker;
  const [ref, unref] = [w.ref.bind(w), w.unref.bind(w)];
  w.ref = () => ((held = true), ref());
  w.unref = () => ((held = false), unref());
  return () => held;
}

/** Until no member is busy or has anything queued, warm jobs included. */
async function idle(pool: TokenizerPool): Promise<void> {
  while (pool.stats().members.some((m) => m.busy || m.queued > 0 || m.warmQueued > 0)) await Bun.sleep(20);
}

describe("tokenizer pool", () => {
  test("gives the preprocessor's ids for chats and prompts", async () => {
    const pool = await pools.start({ size: 2, budgetMs: 60_000 });
    const pre = createPreprocessor({ tokenizerDir: dir });
    const messages = chat("You are terse.", "Hello <think> there", "hi", "again 日本語 123");
    const a = await pool.tokenize({ kind: "chat", messages, opts: {} });
    expect([...a.tokens]).toEqual([...pre.encodeChat(messages)]);
    expect(a.complete).toBe(true);
    const b = await pool.tokenize({ kind: "prompt", text: "The cat sat." });
    expect([...b.tokens]).toEqual([...pre.encodeCompletion("The cat sat.")]);
  }, 60_000);

  test("members render with the server's default chat template kwargs, as a preprocessor given them does", async () => {
    const defaults = '{"enable_thinking": false}';
    const pool = await pools.start({ size: 1, budgetMs: 60_000 }, { defaultChatTemplateKwargs: defaults });
    const messages = chat("You are terse.", "Hello");
    const a = await pool.tokenize({ kind: "chat", messages, opts: {} });
    expect([...a.tokens]).toEqual([...createPreprocessor({ tokenizerDir: dir, defaultChatTemplateKwargs: defaults }).encodeChat(messages)]);
    expect([...a.tokens]).not.toEqual([...createPreprocessor({ tokenizerDir: dir }).encodeChat(messages)]);
  }, 60_000);

  // vLLM's "auto" Messages modes are probed once, by the pool at startup, while its members start: each member is told
  // the verdict before its first job (a replacement starts by it), and the pool's own reading of a body on the event
  // loop is by the same modes.
  test("the Messages modes are probed once for the pool, and its members and its own reading share the verdict", async () => {
    const pool = await pools.start({ size: 2, budgetMs: 60_000 });
    expect(pool.rules.inlineSystem).toBe("preserve");
    expect(pool.rules.disabledThinkingEffort).toBe("none");
    const given = (pool as unknown as { memberOptions: { preprocessor: Record<string, unknown> } }).memberOptions.preprocessor;
    expect([given.anthropicInlineSystem, given.anthropicDisabledThinkingEffort]).toEqual(["preserve", "none"]);
    const body = (question: string) => ({
      model: "m", max_tokens: 10, thinking: { type: "disabled" },
      messages: [{ role: "user", content: question }, { role: "assistant", content: "Hello" }, { role: "system", content: "Be brief." }, { role: "user", content: "Why?" }],
    });
    const requests = ["Hi", "Hey"].map((q) => ({ body: new TextEncoder().encode(JSON.stringify(body(q))), path: "/v1/messages" }));
    const pre = createPreprocessor({ tokenizerDir: dir });
    const here = requests.map((request) => [...encodeJob(pre, readBody(request, pool.rules).job as TokenizeJob)]);
    const unprobed = createPreprocessor({ tokenizerDir: dir, anthropicInlineSystem: "fold", anthropicDisabledThinkingEffort: "low" });
    expect([...encodeJob(unprobed, readBody(requests[0]!, unprobed.rules).job as TokenizeJob)]).not.toEqual(here[0]);
    // Submitted together as soon as the pool is ready, one to each member (the second goes to the idle one).
    const outcomes = await Promise.all(requests.map((request) => pool.tokenize({ kind: "body", request })));
    expect(outcomes.map((o) => [...o.tokens])).toEqual(here);
    expect(pool.stats().members.map((m) => m.jobs)).toEqual([1, 1]);
  }, 60_000);

  test("members render with the server's rendering flags, as a preprocessor given them does", async () => {
    const flags = {
      excludeToolsWhenToolChoiceNone: true, chatTemplate: "{% if tools %}T{% endif %}{{ messages[0].content }}", chatTemplateContentFormat: "string" as const,
      trustRequestChatTemplate: true,
    };
    const pool = await pools.start({ size: 1, budgetMs: 60_000 }, flags);
    const pre = createPreprocessor({ tokenizerDir: dir, ...flags });
    const messages = [{ role: "user", content: [{ type: "text", text: "a" }, { type: "text", text: "b" }] }];
    const tools = [{ type: "function", function: { name: "f" } }];
    for (const opts of [{ tools }, { tools, toolChoice: "none" }, { chatTemplate: "({{ messages[0].content }})" }]) {
      const a = await pool.tokenize({ kind: "chat", messages, opts });
      expect(pre.decode(a.tokens)).toBe(pre.renderChat(messages, opts));
    }
    expect(pre.renderChat(messages, { tools, toolChoice: "none" })).toBe("a\nb");
  }, 60_000);

  test("a long fresh chat in flight does not hold a short one back", async () => {
    const pool = await pools.start({ size: 2, budgetMs: 60_000 });
    const order: string[] = [];
    const long = pool.tokenize({ kind: "chat", messages: chat("long", freshWords(300_000, 1)), opts: {} }).then(() => order.push("long"));
    const short = pool.tokenize({ kind: "chat", messages: chat("short", "hi"), opts: {} }).then(() => order.push("short"));
    await Promise.all([long, short]);
    expect(order).toEqual(["short", "long"]);
  }, 120_000);

  test("an aborted job is dropped from the queue, or stopped by its member midway", async () => {
    const pool = await pools.start({ size: 1, budgetMs: 60_000 });
    const running = new AbortController();
    const queued = new AbortController();
    const a = pool.tokenize({ kind: "prompt", text: freshWords(400_000, 2) }, { signal: running.signal });
    const b = pool.tokenize({ kind: "prompt", text: "queued behind" }, { signal: queued.signal });
    queued.abort();
    await expect(b).rejects.toBeInstanceOf(TokenizeCancelled);
    // Stopped between sections: the text has several, cut by added tokens.
    running.abort();
    await expect(a).rejects.toBeInstanceOf(TokenizeCancelled);
    // The member is free again and answers the next job; it reports the stop.
    expect((await pool.tokenize({ kind: "prompt", text: "next" })).complete).toBe(true);
    expect(pool.stats()).toMatchObject({ cancelled: 2 });
  }, 120_000);

  test("a short request queued behind a running one starts the moment that one ends, without waiting for this thread", async () => {
    const pool = await pools.start({ size: 1, budgetMs: 60_000 });
    const running = pool.tokenize({ kind: "prompt", text: freshWords(20_000, 5) });
    const submitted = performance.now();
    const behind = pool.tokenize({ kind: "prompt", text: "posted behind the running one" });
    // This thread busy, as under load: it hears that the running job ended only once it is free again. Its member
    // had the short one already and went on to it (posted behind, it waited there), not after this thread.
    const freed = performance.now() + 2000;
    while (performance.now() < freed);
    const [first, second] = await Promise.all([running, behind]);
    expect(first.complete && second.complete).toBe(true);
    expect(submitted + second.waitMs).toBeLessThan(freed);
    expect(pool.stats().members[0]!.queued).toBe(0);
  }, 60_000);

  test("a request posted behind a running one and cancelled is stopped before its member reads it", async () => {
    const pool = await pools.start({ size: 1, budgetMs: 60_000 });
    const running = pool.tokenize({ kind: "prompt", text: freshWords(200_000, 6) });
    const abort = new AbortController();
    const behind = pool.tokenize({ kind: "prompt", text: freshWords(50, 7) }, { signal: abort.signal });
    abort.abort();
    await expect(behind).rejects.toBeInstanceOf(TokenizeCancelled);
    expect((await running).complete).toBe(true);
    // Nothing of it was tokenized: the member's next job finds none of its words cached.
    const again = await pool.tokenize({ kind: "prompt", text: freshWords(50, 7) });
    expect(again.freshTokens).toBe(again.tokens.length);
    expect(pool.stats()).toMatchObject({ cancelled: 1 });
  }, 60_000);

  test("each request's wait is observed once: run at once, posted behind, queued, or answered out of budget", async () => {
    const { pool, registry } = await pools.startWithMetrics({ size: 1, budgetMs: 40 });
    const requests = [pool.tokenize({ kind: "prompt", text: freshWords(300_000, 8) })];
    for (let i = 0; i < 5; i++) requests.push(pool.tokenize({ kind: "prompt", text: freshWords(20 + i, 9 + i) }));
    await Promise.all(requests);
    const count = (await registry.getSingleMetricAsString("dynamo_epp_tokenizer_pool_wait_seconds")).match(/_count(?:\{[^}]*\})? (\d+)/);
    expect(Number(count?.[1])).toBe(requests.length);
  }, 60_000);

  test("a body that cannot finish in budget is answered by the exact prefix already known, and counted", async () => {
    const warnings: object[] = [];
    const pool = await pools.start({ size: 1, budgetMs: 1000, log: { warn: (o) => warnings.push(o) } });
    const system = freshWords(2000, 3);
    const first = await pool.tokenize({ kind: "chat", messages: chat(system, "first question"), opts: { addGenerationPrompt: false } });
    // A follow-up whose new turn is far too large to tokenize within the budget (the member's estimate says so).
    const big = chat(system, "first question", "an answer", freshWords(1_500_000, 4));
    const late = await pool.tokenize({ kind: "chat", messages: big, opts: {} });
    expect(late).toMatchObject({ complete: false, fallback: "budget" });
    // Known: the system and first user turns, and the <|im_start|> that opens the (unknown) assistant turn.
    const imStart = [...createPreprocessor({ tokenizerDir: dir }).encodeCompletion("<|im_start|>")];
    expect([...late.tokens]).toEqual([...first.tokens, ...imStart]);
    expect(pool.stats().fallbacks.budget).toBe(1);
    expect(warnings).toHaveLength(1);
    // The whole prompt's length is estimated from the unknown rest's characters (no member has measured its text yet: ~4 a token).
    const rest = big[3]!.content as string;
    expect(late.promptTokens).toBeGreaterThan(late.tokens.length + rest.length / 8);
    expect(late.promptTokens).toBeLessThan(late.tokens.length + rest.length);
  }, 120_000);

  test("a job is answered on the first known prefix its caller says settles it, and stopped there", async () => {
    const pool = await pools.start({ size: 1, budgetMs: 60_000 });
    // Long enough that its member is still at it when the stop comes, however late this thread's turn is on a
    // loaded machine (its member otherwise finishes first: nothing is left to tokenize again below).
    const text = lines(1_000_000, 41);
    const want = createPreprocessor({ tokenizerDir: dir }).encodeCompletion(text);
    const told: Uint32Array[] = [];
    const early = await pool.tokenize({ kind: "prompt", text }, { decides: (known) => (told.push(known.slice()), known.length >= 2000) });
    expect(early).toMatchObject({ complete: false, decided: true });
    expect(early.fallback).toBeUndefined();
    // The member's own time until it told the settling prefix (2000 tokens of fresh text by then).
    expect(early.busyMs).toBeGreaterThan(0);
    // The exact prefix told last, the first one long enough; told as it grew, each an exact prefix.
    expect(early.tokens.length).toBeGreaterThanOrEqual(2000);
    expect(early.tokens.length).toBeLessThan(want.length);
    expect(early.tokens).toEqual(told.at(-1)!);
    for (let i = 0; i < told.length; i++) {
      expect(told[i]).toEqual(want.subarray(0, told[i]!.length));
      if (i > 0) expect(told[i]!.length).toBeGreaterThan(told[i - 1]!.length);
    }
    // The whole prompt's length, estimated: its rest at 4 characters a token before the member has measured any
    // text (this text has ~1.2), then at what it measured on its own long jobs.
    expect(early.promptTokens).toBeGreaterThan(early.tokens.length);
    expect(early.promptTokens).toBeLessThan(want.length);
    expect(pool.stats().decided).toBe(1);
    for (let i = 0; i < 16; i++) await pool.tokenize({ kind: "prompt", text: lines(4000, 50 + i) });
    const measured = lines(200_000, 49);
    const estimate = (await pool.tokenize({ kind: "prompt", text: measured }, { decides: (known) => known.length >= 2000 })).promptTokens!;
    await idle(pool);
    const exact = (await pool.tokenize({ kind: "prompt", text: measured })).tokens.length;
    expect(estimate / exact).toBeGreaterThan(0.8);
    expect(estimate / exact).toBeLessThan(1.25);
    // Stopped once answered: the member is free at once, and its cache holds the pieces up to where it stopped.
    await idle(pool);
    const again = await pool.tokenize({ kind: "prompt", text });
    expect(again.freshTokens).toBeGreaterThan(0);
    expect(again.freshTokens).toBeLessThanOrEqual(want.length - early.tokens.length);
    // A caller that is never settled waits for the whole.
    const other = lines(200_000, 42);
    const whole = await pool.tokenize({ kind: "prompt", text: other }, { decides: () => false });
    expect(whole).toMatchObject({ complete: true });
    expect(whole.busyMs).toBeGreaterThan(0);
    // A completion's text has no turns; a chat answered early tells its last turn's length too, estimated.
    expect(early.newTurnTokens).toBeUndefined();
    const history = lines(100_000, 44);
    const turn = lines(20_000, 45);
    const messages = [{ role: "user", content: history }, { role: "assistant", content: "Noted." }, { role: "user", content: turn }];
    const chatEarly = await pool.tokenize({ kind: "chat", messages, opts: { addGenerationPrompt: true } }, { decides: (known) => known.length >= 2000 });
    expect(chatEarly.decided).toBe(true);
    const turnTokens = createPreprocessor({ tokenizerDir: dir }).encodeCompletion(turn).length;
    expect(chatEarly.newTurnTokens! / turnTokens).toBeGreaterThan(0.8);
    expect(chatEarly.newTurnTokens! / turnTokens).toBeLessThan(1.25);
  }, 120_000);

  test("a long chat told in several reports is answered on what they add up to: the whole encode's first ids, decided or over budget", async () => {
    const budgetMs = 1500;
    const pool = await pools.start({ size: 1, budgetMs });
    const pre = createPreprocessor({ tokenizerDir: dir });
    const system = lines(3000, 60);
    // The system turn cached: the first report carries it, each later one the ids tokenized since.
    await pool.tokenize({ kind: "chat", messages: chat(system, "hi"), opts: {} });
    const reports = 3;
    const prefixesOf = async (seed: number, decides: (told: Uint32Array[]) => boolean) => {
      const messages = chat(system, lines(200_000, seed));
      const told: Uint32Array[] = [];
      const outcome = await pool.tokenize({ kind: "chat", messages, opts: {} }, { decides: (known) => (told.push(known.slice()), decides(told)) });
      const want = pre.encodeChat(messages, {});
      expect(told).toHaveLength(reports);
      expect(told[0]!.length).toBeGreaterThan(0);
      for (let i = 0; i < told.length; i++) {
        expect(told[i]).toEqual(want.subarray(0, told[i]!.length));
        if (i > 0) expect(told[i]!.length).toBeGreaterThan(told[i - 1]!.length);
      }
      expect(outcome.tokens).toEqual(told.at(-1)!);
      return outcome;
    };
    expect(await prefixesOf(61, (told) => told.length === reports)).toMatchObject({ complete: false, decided: true });
    // Over budget at the last report: held on this thread until the budget has passed (no timer fires meanwhile).
    const t0 = performance.now();
    const late = await prefixesOf(62, (told) => {
      if (told.length === reports) Bun.sleepSync(Math.max(0, budgetMs + 20 - (performance.now() - t0)));
      return false;
    });
    expect(late).toMatchObject({ complete: false, fallback: "budget" });
  }, 120_000);

  test("a request answered over budget and still tokenizing yields to the next request, and finishes after it", async () => {
    const pool = await pools.start({ size: 1, budgetMs: 1 });
    const text = lines(400_000, 43);
    const late = await pool.tokenize({ kind: "prompt", text });
    expect(late.fallback).toBe("budget");
    await pool.tokenize({ kind: "prompt", text: "a question" });
    expect(pool.stats().warmPreempted).toBe(1);
    // Resumed after it, where it stopped, and finished: every piece of both tokenized once, none twice, none walked twice.
    await idle(pool);
    const pre = createPreprocessor({ tokenizerDir: dir });
    expect(pool.stats().cache.freshTokens).toBe(pre.encodeCompletion(text).length + pre.encodeCompletion("a question").length);
    expect(pool.stats().cache.hits).toBe(pre.cacheStats().hits);
  }, 120_000);

  test("a request stopped out of budget before it started goes on behind the resume of the job it preempted, which walks no piece twice", async () => {
    const pool = await pools.start({ size: 1, budgetMs: 1 });
    const prefix = lines(5_000, 51);
    pool.warm({ kind: "prompt", text: prefix });
    await idle(pool);
    // Stopped past its cached prefix at the latest, the warm's member keeps its walk for its resume.
    const long = prefix + "\n" + lines(400_000, 52);
    pool.warm({ kind: "prompt", text: long });
    // The stops the pool asks are held back, then told in the order under test: the question's before the warm's, so
    // that its member reads the question already stopped. (Left alone, the member stops the warm at its next piece
    // and reads the question well within its budget, unless the machine is loaded.)
    type Posted = { id: number; slot: 0 | 1 };
    const member = (pool as unknown as { members: { cancel: Int32Array; current: Posted | null; next: Posted | null }[] }).members[0]!;
    const cancel = member.cancel;
    member.cancel = new Int32Array(2);
    const question = await pool.tokenize({ kind: "prompt", text: "a question" });
    expect(question.fallback).toBe("queue");
    for (const p of [member.next!, member.current!]) Atomics.store(cancel, p.slot, member.cancel[p.slot]!);
    member.cancel = cancel;
    await idle(pool);
    expect(pool.stats().warmPreempted).toBe(1);
    // The warm resumed where it stopped, and the question ran after it, whole: each text walked once.
    const pre = createPreprocessor({ tokenizerDir: dir });
    for (const text of [prefix, long, "a question"]) pre.encodeCompletion(text);
    expect(pool.stats().cache.hits).toBe(pre.cacheStats().hits);
    expect(pool.stats().cache.freshTokens).toBe(pre.cacheStats().freshTokens);
  }, 120_000);

  // A stopped request's rest put back behind the resume its member keeps goes on next: the queue's bound drops the
  // oldest plain warm behind them, not the job just put back to go on.
  test("a full warm queue drops its oldest plain warm for a stopped job put back, not that job", async () => {
    const pool = await pools.start({ size: 1, budgetMs: 60_000, maxWarmQueued: 2 });
    type Queued = { id: number; job: PoolJob; discard: boolean; submitted: number; dispatched: number; cost: number };
    const internals = pool as unknown as {
      members: { warm: Queued[]; kept: number | null }[];
      requeue(member: unknown, p: Queued, kept: boolean): void;
    };
    const member = internals.members[0]!;
    const queued = (id: number): Queued => ({ id, job: { kind: "prompt", text: `warm ${id}` }, discard: true, submitted: 0, dispatched: 0, cost: 0 });
    // Set up as the pool leaves it, unpumped: the kept resume first, then an older plain warm.
    member.warm = [queued(1_000_001), queued(1_000_002)];
    member.kept = 1_000_001;
    internals.requeue(member, { ...queued(1_000_003), discard: false }, false);
    expect(member.warm.map((p) => p.id)).toEqual([1_000_001, 1_000_003]);
    expect(pool.stats().warmDropped).toBe(1);
    member.warm = [];
    member.kept = null;
  }, 60_000);

  test("a request stops the warm job its member is running; the warm resumes after it and finishes", async () => {
    const pool = await pools.start({ size: 1, budgetMs: 60_000 });
    const long = freshWords(400_000, 31);
    pool.warm({ kind: "prompt", text: long });
    expect(pool.stats().members[0]).toMatchObject({ busy: true });
    const short = await pool.tokenize({ kind: "prompt", text: "a question" });
    expect(short.complete).toBe(true);
    // Answered before the warm finished: it was stopped, and is queued again (or running again).
    expect(pool.stats().warmPreempted).toBe(1);
    const m = pool.stats().members[0]!;
    expect(m.busy || m.warmQueued === 1).toBe(true);
    await idle(pool);
    // Resumed and finished: the whole text is cached.
    expect((await pool.tokenize({ kind: "prompt", text: long })).freshTokens).toBe(0);
    expect(pool.stats().warmDropped).toBe(0);
  }, 120_000);

  test("a warm stopped for a request resumes where it stopped: it walks none of the pieces it finished again", async () => {
    const pool = await pools.start({ size: 1, budgetMs: 60_000 });
    const messages = [{ role: "user", content: lines(5_000, 46) }];
    const reply = { role: "assistant", content: lines(50_000, 47) };
    await pool.tokenize({ kind: "chat", messages, opts: {} });
    // The warm (a job with no body to read) walks the turn's cached pieces, then is stopped (at its first piece to
    // tokenize, at the latest).
    const next = nextTurnJob({ kind: "chat", messages, opts: {} }, reply)!;
    pool.warm(next);
    await pool.tokenize({ kind: "prompt", text: "a question" });
    expect(pool.stats().warmPreempted).toBe(1);
    await idle(pool);
    // The same work in one preprocessor, the warm's text walked once: the pool found as many pieces cached.
    const pre = createPreprocessor({ tokenizerDir: dir });
    pre.encodeChat(messages);
    pre.encodeCompletion("a question");
    encodeJob(pre, next);
    expect(pool.stats().cache.hits).toBe(pre.cacheStats().hits);
    expect(pool.stats().cache.freshTokens).toBe(pre.cacheStats().freshTokens);
  }, 120_000);

  test("a warm of a body that a request stops is stopped before its render: it walks nothing first, then runs whole, reading the reply from the response body", async () => {
    const pool = await pools.start({ size: 1, budgetMs: 60_000 });
    const messages = [{ role: "user", content: lines(5_000, 48) }];
    // A field vLLM ignores makes the body take the member milliseconds to read (~700 KB of small objects, under
    // readHereMaxBytes), while this thread stops the warm microseconds after handing it over: had the member read it
    // by then (this thread stalled that long), the warm would walk the turn's cached pieces before it was told to stop.
    const ignored = Array.from({ length: 60_000 }, (_, i) => ({ k: i }));
    const body = new TextEncoder().encode(JSON.stringify({ model: "qwen3", messages, ignored }));
    expect(body.length).toBeGreaterThan(500_000);
    expect(body.length).toBeLessThan(pool.readHereMaxBytes);
    // vLLM's stream: the reply in delta chunks (the last with its finish reason), a usage chunk, [DONE].
    const parts = [lines(1_000, 49), "\n" + lines(1_000, 50)];
    const sse = parts.map((content, i) => `data: ${JSON.stringify({ choices: [{ index: 0, delta: { content }, finish_reason: i === 1 ? "stop" : null }] })}\n\n`).join("") +
      `data: ${JSON.stringify({ choices: [], usage: { prompt_tokens: 1 } })}\n\ndata: [DONE]\n\n`;
    await pool.tokenize({ kind: "chat", messages, opts: {} });
    const pre = createPreprocessor({ tokenizerDir: dir });
    pre.encodeChat(messages);
    const hits = { pool: pool.stats().cache.hits, pre: pre.cacheStats().hits };
    pool.warm({ kind: "body", request: { body }, reply: new TextEncoder().encode(sse) });
    await pool.tokenize({ kind: "prompt", text: "a question" });
    pre.encodeCompletion("a question");
    expect(pool.stats().warmPreempted).toBe(1);
    // The request's hits alone: the warm was stopped once its body was read, before it rendered and walked the
    // turn's cached pieces (a request waits out the read, not the render too).
    expect(pool.stats().cache.hits - hits.pool).toBe(pre.cacheStats().hits - hits.pre);
    await idle(pool);
    // Then read and run again, whole: the next turn cached as a warm with the reply as a message would have.
    encodeJob(pre, nextTurnJob(readBody({ body }).job as Extract<TokenizeJob, { kind: "chat" }>, { role: "assistant", content: parts.join("") })!);
    expect(pool.stats().cache.hits).toBe(pre.cacheStats().hits);
    expect(pool.stats().cache.freshTokens).toBe(pre.cacheStats().freshTokens);
  }, 120_000);

  test("a warm of a body past readHereMaxBytes is not run, counted: its member could not stop reading it for a request", async () => {
    const { pool, registry } = await pools.startWithMetrics({ size: 1, budgetMs: 60_000, readHereMaxBytes: 1000 });
    const body = new TextEncoder().encode(JSON.stringify({ model: "qwen3", messages: chat("a system prompt", lines(300, 51)) }));
    expect(body.length).toBeGreaterThan(1000);
    pool.warm({ kind: "body", request: { body }, reply: chatReplyBody({ role: "assistant", content: "an answer" }) });
    expect(pool.stats()).toMatchObject({ warmTooLarge: 1, warmDropped: 0 });
    expect(pool.stats().members[0]).toMatchObject({ busy: false, warmQueued: 0 });
    expect(await registry.metrics()).toContain('dynamo_epp_tokenizer_warm_jobs_total{outcome="too_large"} 1');
  }, 60_000);

  test("a warm whose reply has nothing to warm with is released by its member at once, its body unread, counted", async () => {
    const { pool, registry } = await pools.startWithMetrics({ size: 1, budgetMs: 60_000 });
    // A body no member could read (it would fail the warm), and a stream cut before its [DONE].
    const cut = new TextEncoder().encode(`data: ${JSON.stringify({ choices: [{ index: 0, delta: { content: "Hel" } }] })}\n\n`);
    pool.warm({ kind: "body", request: { body: new TextEncoder().encode("not a body") }, reply: cut });
    await idle(pool);
    expect(pool.stats()).toMatchObject({ warmNothing: 1, warmDropped: 0 });
    expect(pool.stats().members[0]!.jobs).toBe(1);
    expect(await registry.metrics()).toContain('dynamo_epp_tokenizer_warm_jobs_total{outcome="nothing"} 1');
  }, 60_000);

  // A one-member pool that has tokenized a conversation's first turn, its body, and the reply that turn got.
  const answered = async (seed: number) => {
    const pool = await pools.start({ size: 1, budgetMs: 60_000 });
    const turn1 = freshChat(seed, 1, 300);
    await pool.tokenize({ kind: "chat", messages: turn1, opts: {} });
    const body = new TextEncoder().encode(JSON.stringify({ model: "qwen3", messages: turn1 }));
    return { pool, turn1, body, reply: freshWords(400, seed + 2) };
  };

  test("warming a conversation with its reply leaves only the next user message fresh", async () => {
    const { pool, turn1, body, reply } = await answered(5);
    // As the EPP warms (createPoolWarm): the request's body and the response body as received.
    pool.warm({ kind: "body", request: { body }, reply: chatReplyBody({ role: "assistant", content: reply }) });
    // The next turn comes once the user has read the reply: a request sent at once would stop the warm (it yields).
    await idle(pool);
    const next = freshWords(50, 8);
    const turn2 = await pool.tokenize({ kind: "chat", messages: [...turn1, { role: "assistant", content: reply }, { role: "user", content: next }], opts: {} });
    const pre = createPreprocessor({ tokenizerDir: dir });
    const nextOnly = pre.encodeCompletion(next).length;
    // The new user message, its role line and the generation prompt: nothing of the reply or earlier.
    expect(turn2.freshTokens).toBeGreaterThan(0);
    expect(turn2.freshTokens).toBeLessThanOrEqual(nextOnly + 8);
    // What warming saved is counted: the reply's tokens were found cached only because it was warmed.
    expect(turn2.warmedTokens).toBeGreaterThanOrEqual(pre.encodeCompletion(reply).length - 8);
  }, 60_000);

  test("warming a chat with echo whose final assistant message is content parts takes the echo vLLM repeated off the reply", async () => {
    const pool = await pools.start({ size: 1, budgetMs: 60_000 });
    const parts = [{ type: "text", text: freshWords(40, 31) }, { type: "text", text: freshWords(40, 32) }];
    const turn1 = [...freshChat(33, 1, 300), { role: "assistant", content: parts }];
    await pool.tokenize({ kind: "chat", messages: turn1, opts: {} });
    const body = new TextEncoder().encode(JSON.stringify({ model: "qwen3", messages: turn1, echo: true }));
    const generated = freshWords(400, 35);
    // Qwen3's template is of the string format: vLLM echoes the parts' texts joined by a newline.
    const echoed = `${parts[0]!.text}\n${parts[1]!.text}${generated}`;
    pool.warm({ kind: "body", request: { body }, reply: chatReplyBody({ role: "assistant", content: echoed }) });
    await idle(pool);
    const next = freshWords(50, 37);
    const turn2 = await pool.tokenize({ kind: "chat", messages: [...turn1, { role: "assistant", content: generated }, { role: "user", content: next }], opts: {} });
    const pre = createPreprocessor({ tokenizerDir: dir });
    expect(turn2.freshTokens).toBeLessThanOrEqual(pre.encodeCompletion(next).length + 8);
    expect(turn2.warmedTokens).toBeGreaterThanOrEqual(pre.encodeCompletion(generated).length - 8);
  }, 60_000);

  test("warming a conversation with its tool-calling reply, streamed, leaves only the tools' results fresh, after several calls too", async () => {
    const { pool, turn1, body } = await answered(25);
    const queries = [freshWords(300, 27), freshWords(200, 29)];
    // vLLM's stream of parallel tool calls: the role, then each call in turn by its index, its id and name first,
    // its arguments in pieces; the finish reason, a usage chunk, [DONE].
    const chunk = (delta: object, finish_reason: string | null = null) => `data: ${JSON.stringify({ choices: [{ index: 0, delta, logprobs: null, finish_reason }] })}\n\n`;
    const call = (index: number, fn: object, head = {}) => ({ tool_calls: [{ index, ...head, function: fn }] });
    const sse = chunk({ role: "assistant", content: "" }) + queries.map((query, i) => {
      const args = JSON.stringify({ query });
      const half = args.length >> 1;
      return chunk(call(i, { name: "search" }, { id: `chatcmpl-tool-${i}`, type: "function" })) + chunk(call(i, { arguments: args.slice(0, half) })) +
        chunk(call(i, { arguments: args.slice(half) }), i === queries.length - 1 ? "tool_calls" : null);
    }).join("") + `data: ${JSON.stringify({ choices: [], usage: { prompt_tokens: 1 } })}\n\ndata: [DONE]\n\n`;
    pool.warm({ kind: "body", request: { body }, reply: new TextEncoder().encode(sse) });
    await idle(pool);
    // The client sends the calls back in its own form (arguments as objects here), then one result a call.
    const results = [freshWords(50, 28), freshWords(40, 30)];
    const calls = queries.map((query, i) => ({ id: `chatcmpl-tool-${i}`, type: "function", function: { name: "search", arguments: { query } } }));
    const tools = results.map((content, i) => ({ role: "tool", tool_call_id: `chatcmpl-tool-${i}`, content }));
    const turn2 = await pool.tokenize({ kind: "chat", messages: [...turn1, { role: "assistant", content: null, tool_calls: calls }, ...tools], opts: {} });
    const pre = createPreprocessor({ tokenizerDir: dir });
    const tokens = (texts: string[]) => texts.reduce((n, t) => n + pre.encodeCompletion(t).length, 0);
    // The results, the ends of their turn and the generation prompt: nothing of the calls or earlier.
    expect(turn2.freshTokens).toBeGreaterThan(0);
    expect(turn2.freshTokens).toBeLessThanOrEqual(tokens(results) + 8);
    expect(turn2.warmedTokens).toBeGreaterThanOrEqual(tokens(queries) - 8);
  }, 60_000);

  test("without a warm nothing counts as warmed: the next turn tokenizes the reply itself", async () => {
    const { pool, turn1, reply } = await answered(15);
    const turn2 = await pool.tokenize({ kind: "chat", messages: [...turn1, { role: "assistant", content: reply }, { role: "user", content: "ok" }], opts: {} });
    expect(turn2.warmedTokens).toBe(0);
    expect(turn2.freshTokens).toBeGreaterThan(createPreprocessor({ tokenizerDir: dir }).encodeCompletion(reply).length - 8);
  }, 60_000);

  test.skipIf(process.platform !== "linux")("members' threads run at the configured nice value; the calling thread keeps its own", async () => {
    const before = threadNice(threadId());
    // Above ours: only a privileged process may lower a nice value.
    const nice = Math.min(19, before + 7);
    const pool = await pools.start({ size: 2, budgetMs: 60_000, nice });
    const members = pool.stats().members.map((m) => m.priority);
    expect(members).toHaveLength(2);
    for (const p of members) {
      if (p === null || "unsupported" in p) throw new Error(`member priority not set: ${JSON.stringify(p)}`);
      // What the kernel says of that thread, not what the member reported.
      expect(threadNice(p.tid)).toBe(nice);
      expect(p.nice).toBe(nice);
    }
    expect(new Set(members.map((p) => (p as { tid: number }).tid)).size).toBe(2);
    expect(threadNice(threadId())).toBe(before);
    // The default is the caller's priority (DEFAULT_MEMBER_NICE).
    const dflt = await pools.start({ size: 1, budgetMs: 60_000 });
    expect(dflt.stats().members[0]!.priority).toMatchObject({ nice: DEFAULT_MEMBER_NICE });
  }, 60_000);

  // EEVDF keeps a slice per thread from Linux 6.12 (sched_attr.sched_runtime of a SCHED_OTHER thread); the kernel's
  // own view of a thread's slice is in /proc/<tid>/sched where it has that file (CONFIG_SCHED_DEBUG).
  const [major = 0, minor = 0] = release().split(".").map(Number);
  const slices = process.platform === "linux" && (major > 6 || (major === 6 && minor >= 12));
  const kernelView = process.platform === "linux" && threadSliceUs(threadId()) !== null;
  test.skipIf(process.platform !== "linux")(`members ask the kernel for the configured time slice once warm (kernel ${release()}: ${slices ? "held" : "not kept, said so"}); the calling thread keeps its own`, async () => {
    // This thread may hold a slice an in-process EPP of another test file asked for: back to the kernel's default.
    if (slices) requestThreadSlice(0);
    const callerSlice = threadSliceUs(threadId());
    const pool = await pools.start({ size: 2, budgetMs: 60_000, sliceUs: 100 });
    const dflt = await pools.start({ size: 1, budgetMs: 60_000 });
    for (const p of pool.stats().members.map((m) => m.priority)) {
      if (p === null || "unsupported" in p) throw new Error(`member priority not set: ${JSON.stringify(p)}`);
      if (slices) {
        expect(p).toMatchObject({ sliceUs: 100 });
        expect(p.sliceUnsupported).toBeUndefined();
        // What the kernel says of that thread, not what the member reported.
        if (kernelView) expect(threadSliceUs(p.tid)).toBe(100);
      } else {
        expect(p.sliceUs).toBe(0);
        expect(p.sliceUnsupported).toBeString();
      }
    }
    // Without a slice asked for, a member keeps the kernel's (the one this thread has), and reports none of its own.
    const own = dflt.stats().members[0]!.priority;
    if (own === null || "unsupported" in own) throw new Error(`member priority not set: ${JSON.stringify(own)}`);
    expect(own.sliceUs).toBe(0);
    expect(threadSliceUs(own.tid)).toBe(callerSlice);
    expect(threadSliceUs(threadId())).toBe(callerSlice);
  }, 60_000);

  test.skipIf(!slices || !kernelView)("a thread started after its starter took a short slice gets the kernel's default, not the starter's (RESET_ON_FORK)", async () => {
    requestThreadSlice(0);
    const kernelDefault = threadSliceUs(threadId());
    expect(kernelDefault).toBeGreaterThan(100);
    try {
      expect(requestThreadSlice(100)).toEqual({ sliceUs: 100 });
      expect(threadSliceUs(threadId())).toBe(100);
      // A pool started now: its members are threads this one starts (as a replacement member is, after the EPP took its slice).
      const pool = await pools.start({ size: 1, budgetMs: 60_000 });
      const member = pool.stats().members[0]!.priority;
      if (member === null || "unsupported" in member) throw new Error(`member priority not set: ${JSON.stringify(member)}`);
      expect(threadSliceUs(member.tid)).toBe(kernelDefault);
    } finally {
      requestThreadSlice(0);
    }
    expect(threadSliceUs(threadId())).toBe(kernelDefault);
  }, 60_000);

  test("the members' segment caches are summed in the pool's stats and in the process's cache metrics", async () => {
    const { pool, registry } = await pools.startWithMetrics({ size: 2, budgetMs: 60_000 });
    // Two conversations, each sent twice: the second send of each hits its member's cache.
    const convs = [chat(freshWords(300, 21), freshWords(100, 22)), chat(freshWords(300, 23), freshWords(100, 24))];
    for (let round = 0; round < 2; round++) for (const messages of convs) await pool.tokenize({ kind: "chat", messages, opts: {} });
    const stats = pool.stats();
    const summed = (k: "hits" | "misses" | "bytes" | "entries") => stats.members.reduce((n, m) => n + m.cache[k], 0);
    expect(stats.cache.hits).toBeGreaterThan(0);
    expect(stats.cache.misses).toBeGreaterThan(0);
    expect(stats.cache.bytes).toBeGreaterThan(0);
    expect({ hits: stats.cache.hits, misses: stats.cache.misses, bytes: stats.cache.bytes, entries: stats.cache.entries })
      .toEqual({ hits: summed("hits"), misses: summed("misses"), bytes: summed("bytes"), entries: summed("entries") });
    const text = await registry.metrics();
    const value = (name: string) => Number(new RegExp(`^${name}\\{model="qwen3"\\} (\\S+)$`, "m").exec(text)?.[1]);
    expect(value("dynamo_epp_tokenizer_cache_hits_total")).toBe(stats.cache.hits);
    expect(value("dynamo_epp_tokenizer_cache_misses_total")).toBe(stats.cache.misses);
    expect(value("dynamo_epp_tokenizer_cache_bytes")).toBe(stats.cache.bytes);
  }, 60_000);

  test("the cache bound holds for the whole pool: its members' caches together stay within it, evicting", async () => {
    const maxBytes = 256 * 1024;
    const pool = await pools.start({ size: 2, budgetMs: 60_000 }, { cache: { maxBytes } });
    for (let i = 0; i < 60; i++) await pool.tokenize({ kind: "chat", messages: chat(freshWords(400, 300 + 2 * i), freshWords(200, 301 + 2 * i)), opts: {} });
    const { cache, members } = pool.stats();
    expect(members.every((m) => m.jobs > 0)).toBe(true);
    expect(cache.evictions).toBeGreaterThan(0);
    expect(cache.bytes).toBeGreaterThan(maxBytes / 2);
    expect(cache.bytes).toBeLessThanOrEqual(maxBytes);
  }, 60_000);

  test("a conversation's turn stays on its member while that member runs background work: a warm, or a request answered already", async () => {
    // Placement would move it for work that stops at its next piece for it (preemptWarm), and tokenize it all fresh.
    const pool = await pools.start({ size: 2, budgetMs: 60_000 });
    const turn1 = chat(freshWords(300, 80), freshWords(100, 81));
    await pool.tokenize({ kind: "chat", messages: turn1, opts: {} });
    const reply = { role: "assistant", content: lines(50_000, 82) };
    pool.warm(nextTurnJob({ kind: "chat", messages: turn1, opts: {} }, reply)!);
    expect(pool.stats().members.filter((m) => m.busy)).toHaveLength(1);
    await pool.tokenize({ kind: "chat", messages: [...turn1, reply, { role: "user", content: "and then?" }], opts: {} });
    expect(pool.stats().placement).toMatchObject({ new: 1, affine: 1, moved: 0 });
    // Answered over budget, still tokenizing (its rest fills the cache): the next turn stays too.
    const late = await pools.start({ size: 2, budgetMs: 20 });
    const long = chat(freshWords(300, 83), lines(800_000, 84));
    expect((await late.tokenize({ kind: "chat", messages: long, opts: {} })).fallback).toBe("budget");
    expect(late.stats().members.filter((m) => m.busy)).toHaveLength(1);
    const next = late.tokenize({ kind: "chat", messages: [...long, { role: "assistant", content: "ok" }, { role: "user", content: "and then?" }], opts: {} });
    expect(late.stats().placement).toMatchObject({ new: 1, affine: 1, moved: 0 });
    await next;
  }, 120_000);

  test("without a cache (cache: false) the members tokenize every piece, count it fresh and keep nothing", async () => {
    const pool = await pools.start({ size: 2, budgetMs: 60_000 }, { cache: false });
    expect(pool.caches).toBe(false);
    const messages = chat(freshWords(300, 41), freshWords(100, 42));
    const first = await pool.tokenize({ kind: "chat", messages, opts: {} });
    const again = await pool.tokenize({ kind: "chat", messages, opts: {} });
    expect([...again.tokens]).toEqual([...first.tokens]);
    // Every token but the template's added ones (split off, never tokenized), each time.
    const pre = createPreprocessor({ tokenizerDir: dir, cache: false });
    pre.encodeChat(messages);
    const fresh = pre.cacheStats().freshTokens;
    expect(fresh).toBeGreaterThan(0.9 * first.tokens.length);
    expect(again.freshTokens).toBe(fresh);
    expect(pool.stats().cache).toMatchObject({ hits: 0, entries: 0, bytes: 0, freshTokens: 2 * fresh });
  }, 60_000);

  test("without a cache nothing is warmed, and a request answered over budget stops: its rest would fill no cache", async () => {
    const pool = await pools.start({ size: 1, budgetMs: 1 }, { cache: false });
    const text = lines(400_000, 44);
    expect((await pool.tokenize({ kind: "prompt", text })).fallback).toBe("budget");
    const body = new TextEncoder().encode(JSON.stringify({ model: "qwen3", messages: chat("a system prompt", "a question") }));
    pool.warm({ kind: "body", request: { body }, reply: chatReplyBody({ role: "assistant", content: "an answer" }) });
    await idle(pool);
    const pre = createPreprocessor({ tokenizerDir: dir });
    // Stopped short of the text's end and not resumed; the warm never queued.
    expect(pool.stats().cache.freshTokens).toBeLessThan(pre.encodeCompletion(text).length);
    expect(pool.stats()).toMatchObject({ warmPreempted: 0, warmDropped: 0 });
    expect(pool.stats().members[0]!.jobs).toBe(1);
  }, 120_000);
});

describe("tokenizer pool: request bodies as received", () => {
  const enc = new TextEncoder();
  const bytes = (v: unknown) => enc.encode(typeof v === "string" ? v : JSON.stringify(v));

  test("a copy of a body goes to the member, which reads and tokenizes it; only a rewritten body comes back", async () => {
    const pool = await pools.start({ size: 2, budgetMs: 60_000 });
    const pre = createPreprocessor({ tokenizerDir: dir });
    const messages = chat("You are terse.", "Hello <think> there");
    const raw = { model: "m", cache_salt: "tenant", messages, add_generation_prompt: false };
    const body = bytes(raw);
    const pending = pool.tokenize({ kind: "body", request: { body, path: "/v1/chat/completions" } });
    // Copied: the caller keeps its bytes (to forward, or to read itself if the budget ends first).
    expect(new TextDecoder().decode(body)).toBe(JSON.stringify(raw));
    const out = await pool.tokenize({ kind: "body", request: { body: bytes(raw) } });
    const first = await pending;
    expect([...first.tokens]).toEqual([...pre.encodeChat(messages, { addGenerationPrompt: false })]);
    expect([...out.tokens]).toEqual([...first.tokens]);
    expect(first.read).toEqual({ fields: { model: "m", cacheSalt: "tenant", batchedPrompts: undefined, kind: "chat" } });
    // Token ids are read, not tokenized; a rewrite comes back as the body to forward.
    const ids = await pool.tokenize({ kind: "body", request: { body: bytes({ model: "m", prompt: [[1, 2], [3]] }), rewriteModel: "served" } });
    expect([...ids.tokens]).toEqual([1, 2]);
    expect(ids.read).toMatchObject({ fields: { model: "m", batchedPrompts: 2, kind: "tokens" } });
    expect(new TextDecoder().decode(ids.read!.rewritten)).toBe('{"model":"served","prompt":[[1,2],[3]]}');
    // Nothing to tokenize (an embeddings body), twice: no ids, the same each time.
    for (let i = 0; i < 2; i++) {
      const none = await pool.tokenize({ kind: "body", request: { body: bytes({ model: "m", input: ["a", "b"] }), path: "/v1/embeddings" } });
      expect({ tokens: [...none.tokens], kind: none.read?.fields.kind }).toEqual({ tokens: [], kind: "none" });
    }
  }, 60_000);

  test("a body is read with the rewrite rules it was submitted with, as they change and go (sent to a member once per change)", async () => {
    const pool = await pools.start({ size: 1, budgetMs: 60_000 });
    const rulesTo = (target: string) => ({ exact: new Map([["alias", { rewrite: "canary", targets: [{ modelRewrite: target }] }]]) });
    const v1 = rulesTo("served-v1");
    const v2 = rulesTo("served-v2");
    const body = bytes({ model: "alias", messages: chat("You are terse.", "Hello") });
    const read = async (rewriteRules?: ReturnType<typeof rulesTo>) => {
      const o = await pool.tokenize({ kind: "body", request: { body, path: "/v1/chat/completions", ...(rewriteRules ? { rewriteRules } : {}) } });
      return o.read!.fields.target ?? null;
    };
    // The same rules twice, new ones, none, and the new ones again: each job as submitted, one member throughout.
    const targets = [await read(v1), await read(v1), await read(v2), await read(), await read(v2)];
    expect(targets).toEqual(["served-v1", "served-v1", "served-v2", null, "served-v2"]);
  }, 60_000);

  test("a bad body is the member's BadRequest (TooDeep for nesting), and the member takes the next job", async () => {
    const pool = await pools.start({ size: 1, budgetMs: 60_000 });
    // Awaited, not `expect(...).rejects`: Bun's rejects matcher holds back worker messages while it waits.
    const refusal = (body: Uint8Array) => pool.tokenize({ kind: "body", request: { body } }).then(() => undefined, (e: unknown) => e as Error);
    expect(await refusal(bytes("{not json"))).toBeInstanceOf(BadRequest);
    expect((await refusal(bytes({ messages: [{ content: "no role" }] })))?.message).toContain("messages must be");
    expect(await refusal(bytes(`{"prompt": ${"[".repeat(10_000)}${"]".repeat(10_000)}}`))).toBeInstanceOf(TooDeep);
    // A template's refusal is the request's too.
    expect(await refusal(bytes({ messages: [{ role: "user", content: [{ type: "no-such-part" }] }] }))).toBeInstanceOf(ChatTemplateError);
    // A cut body (BUFFERED_PARTIAL) that does not parse is read as routed by load, saying why.
    const cut = await pool.tokenize({ kind: "body", request: { body: bytes('{"messages": [{"role": "us'), maybeCut: true } });
    expect(cut.read?.fields).toMatchObject({ kind: "none", cut: expect.stringContaining("not JSON") });
    const ok = await pool.tokenize({ kind: "body", request: { body: bytes({ prompt: "still here" }) } });
    expect(ok.complete).toBe(true);
    expect(ok.read?.fields.kind).toBe("prompt");
  }, 60_000);

  test("a body no member took within the budget is answered unread (a queue fallback), its bytes still the caller's", async () => {
    // A budget well under the long body's reading: JSON.parse of its ~20 MB took ~10 ms on a quick day here, and a
    // 20 ms budget then saw the queued body read in time.
    const pool = await pools.start({ size: 1, budgetMs: 3, readHereMaxBytes: 1 << 20 });
    // Its member busy reading ~20 MB of chat, too large for the caller to read: not answered (so not stopped for
    // the body queued behind it, as a request answered over budget would be) before its member has read it.
    const long = pool.tokenize({ kind: "body", request: { body: bytes({ messages: [{ role: "user", content: freshWords(100_000, 9).repeat(30) }] }) } });
    const body = bytes({ prompt: "queued behind" });
    const queued = await pool.tokenize({ kind: "body", request: { body } });
    expect(queued).toMatchObject({ complete: false, fallback: "queue" });
    expect(queued.read).toBeUndefined();
    expect(new TextDecoder().decode(body)).toBe('{"prompt":"queued behind"}');
    await long;
  }, 120_000);

  /**
   * `body` as a caller may hold it: a view of a larger buffer (plain, or shared), between bytes that would not
   * parse with it, or joined from pieces into shared memory (joinBody, as the EPP joins a body sent in chunks).
   */
  const held = (body: Uint8Array): [string, Uint8Array][] => {
    const inBuffer = (buffer: ArrayBuffer | SharedArrayBuffer) => {
      const beside = bytes({ prompt: "beside" });
      const all = new Uint8Array(buffer);
      all.set(beside, 0);
      all.set(body, beside.length);
      all.set(beside, beside.length + body.length);
      return all.subarray(beside.length, beside.length + body.length);
    };
    const size = body.length + 2 * bytes({ prompt: "beside" }).length;
    const third = Math.floor(body.length / 3);
    return [
      ["a view of a plain buffer", inBuffer(new ArrayBuffer(size))],
      ["a view of a shared buffer", inBuffer(new SharedArrayBuffer(size))],
      ["joined from pieces", joinBody([body.subarray(0, third), body.subarray(third, 2 * third), body.subarray(2 * third)], body.length)],
    ];
  };
  const same = (a: Uint8Array, b: Uint8Array) => a.byteLength === b.byteLength && Buffer.compare(a, b) === 0;

  test("a member tokenizes exactly its caller's bytes, copied or shared, and leaves them as they were: answered, stopped, or fallen back", async () => {
    const pool = await pools.start({ size: 1, budgetMs: 60_000 });
    const pre = createPreprocessor({ tokenizerDir: dir });
    const small = bytes({ model: "m", messages: chat("You are terse.", freshWords(2_000, 70)) });
    const want = encodeJob(pre, readBody({ body: small }).job as TokenizeJob);
    // ~3 MB of chat in 100k short messages: its member is still reading it when stopped, or when a 20 ms budget ends.
    const large = bytes({ model: "m", messages: Array.from({ length: 100_000 }, (_, i) => ({ role: i % 2 === 0 ? "user" : "assistant", content: `turn ${i}` })) });
    for (const [how, body] of held(small)) {
      const out = await pool.tokenize({ kind: "body", request: { body } });
      expect({ how, tokens: [...out.tokens] }).toEqual({ how, tokens: [...want] });
      await idle(pool);
      expect({ how, intact: same(body, small) }).toEqual({ how, intact: true });
    }
    for (const [how, body] of held(large)) {
      const stop = new AbortController();
      // Awaited, not `expect(...).rejects`: Bun's rejects matcher holds back worker messages while it waits.
      const stopped = pool.tokenize({ kind: "body", request: { body } }, { signal: stop.signal }).then(() => undefined, (e: unknown) => e);
      stop.abort();
      expect(await stopped).toBeInstanceOf(TokenizeCancelled);
      await idle(pool);
      expect({ how, intact: same(body, large) }).toEqual({ how, intact: true });
    }
    const late = await pools.start({ size: 1, budgetMs: 20, readHereMaxBytes: 64 << 20 });
    for (const [how, body] of held(large)) {
      const out = await late.tokenize({ kind: "body", request: { body } });
      expect({ how, fallback: out.fallback }).toEqual({ how, fallback: "budget" });
      // Its caller reads its own bytes while the member reads on.
      expect(readBody({ body }).fields).toMatchObject({ model: "m", kind: "chat" });
      await idle(late);
      expect({ how, intact: same(body, large) }).toEqual({ how, intact: true });
    }
  }, 120_000);

  // ~20 MB of token ids: reading it alone takes a member far past a 20 ms budget.
  const slowToRead = () => bytes(`{"prompt":[${Array.from({ length: 3_000_000 }, (_, i) => i % 150_000).join(",")}]}`);

  test("a body its member is still reading when the budget ends is answered unread, while the member reads on", async () => {
    const pool = await pools.start({ size: 1, budgetMs: 20, readHereMaxBytes: 64 << 20 });
    const body = slowToRead();
    const out = await pool.tokenize({ kind: "body", request: { body } });
    expect(out).toMatchObject({ complete: false, fallback: "budget" });
    expect(out.read).toBeUndefined();
    // Answered before the member finished reading: no wall-clock bound needed.
    expect(pool.stats().members[0]!.busy).toBe(true);
    expect(body.byteLength).toBeGreaterThan(15_000_000);
    await idle(pool);
    expect(pool.stats().members[0]!.jobs).toBe(1);
    // The member takes the next job (whether it answers within the 20 ms budget depends on the machine's load).
    await pool.tokenize({ kind: "body", request: { body: bytes({ prompt: [7, 8, 9] }) } });
    await idle(pool);
    expect(pool.stats().members[0]!.jobs).toBe(2);
  }, 120_000);

  test("a body over readHereMaxBytes is not answered unread: it waits for its member's reading", async () => {
    const pool = await pools.start({ size: 1, budgetMs: 20, readHereMaxBytes: 1 << 20 });
    const out = await pool.tokenize({ kind: "body", request: { body: slowToRead() } });
    // Its reading came with its result (token ids: nothing to tokenize), past the budget.
    expect(out.read?.fields.kind).toBe("tokens");
    expect(out.tokens.length).toBe(3_000_000);
    expect(pool.stats().members[0]!.busy).toBe(false);
  }, 120_000);

  test("a warm stopped once its body is read resumes from what it read: it does not read the body again", async () => {
    const pool = await pools.start({ size: 1, budgetMs: 60_000, readHereMaxBytes: 64 << 20 });
    // ~20 MB, of a field vLLM ignores: its member reads it for hundreds of ms, and tokenizes little.
    const body = bytes({ model: "qwen3", messages: [{ role: "user", content: lines(2_000, 85) }], ignored: Array.from({ length: 1_500_000 }, (_, i) => ({ k: i })) });
    const job = readBody({ body }).job as TokenizeJob;
    const cpu = process.cpuUsage();
    pool.warm({ kind: "body", request: { body } });
    // Stopped while its member reads (the process's CPU time, not a clock, says it has begun: this thread sleeps).
    while ((({ user, system }) => user + system)(process.cpuUsage(cpu)) < 100_000) await Bun.sleep(5);
    // Its bytes changed after that read: a resume that read them again would fail on them.
    body[0] = 0x78;
    await pool.tokenize({ kind: "prompt", text: "a question" });
    expect(pool.stats().warmPreempted).toBe(1);
    await idle(pool);
    expect((await pool.tokenize(job)).freshTokens).toBe(0);
  }, 120_000);

  test("a body too large to warm, answered and stopped, resumes only from what its member keeps of it, never read again", async () => {
    // A budget of 1 ms runs out while the first is read: it is answered at its member's first report, its whole walk
    // still to go (at 20 ms, once its member had measured its pace in a try before, it could be answered later).
    const pool = await pools.start({ size: 1, budgetMs: 1, readHereMaxBytes: 64 << 10 });
    const held = watchRef(pool, 0);
    // The second and third requests wait for their member to stop the job it runs, and are answered by it: their
    // budgets are held (their timers cleared). Under load that stop can outlast a budget; the second would then be
    // answered "queue" and never run, and the third "queue" whether its member ran it once (started before the stop
    // reached it) or twice (stopped before it started, then run as a warm).
    type Waiting = { job: PoolJob; timer?: ReturnType<typeof setTimeout> };
    const member = (pool as unknown as { members: { queue: Waiting[]; next: Waiting | null }[] }).members[0]!;
    const heldBudget = (job: PoolJob) => {
      const answer = pool.tokenize(job);
      clearTimeout([...member.queue, member.next].find((p) => p?.job === job)!.timer);
      return answer;
    };
    // The second's start cached, its stop lands past it: it keeps its walk in the first's place wherever it lands (a
    // stop at its first piece keeps nothing), and it is within what a member keeps of one (4 Mi characters).
    const start = lines(2_000, 88);
    pool.warm({ kind: "prompt", text: start });
    await idle(pool);
    for (let tries = 1; ; tries++) {
      const before = pool.stats();
      const large = bytes({ model: "qwen3", messages: [{ role: "user", content: lines(100_000, 90 + 2 * tries) }] });
      expect(large.length).toBeGreaterThan(pool.readHereMaxBytes);
      // Joined, not concatenated: a concatenation is flattened when first read, by tokenize() on this thread (tens of
      // ms), between the first's answer and its stop.
      const text = [start, lines(600_000, 91 + 2 * tries)].join("\n");
      // Read, answered over budget, then stopped for the request sent after that answer: its member keeps its walk.
      expect(await pool.tokenize({ kind: "body", request: { body: large } })).toMatchObject({ complete: false, fallback: "budget", read: { fields: { kind: "chat" } } });
      // The second, answered over budget and stopped for a third, takes the walk's place in its member (its ~3.5 M
      // fresh characters far from done when that stop reaches it).
      expect(await heldBudget({ kind: "prompt", text })).toMatchObject({ complete: false, fallback: "budget" });
      // The first waits behind it, to resume from its walk; unless its member finished it before the stop came: legal,
      // but it then keeps nothing to resume, and the try is made again with new texts. Its walk is at most the routing
      // bound (~131k characters, milliseconds), and under load this thread can take longer to hear of its answer.
      const kept = pool.stats().members[0]!.warmQueued === 1;
      expect(await heldBudget({ kind: "prompt", text: "a question" })).toMatchObject({ complete: true });
      await idle(pool);
      const after = pool.stats();
      if (!kept) {
        expect(after.warmTooLarge).toBe(0);
        expect(tries).toBeLessThan(5);
        continue;
      }
      expect(after.warmPreempted - before.warmPreempted).toBe(2);
      // The second resumed; the first, its walk gone and its body let go of, was not run again (nor its body read).
      expect(after).toMatchObject({ warmTooLarge: 1, warmDropped: 0, fallbacks: { budget: before.fallbacks.budget + 2, queue: 0 } });
      // The jobs: the first and second stopped, the question, the second's resume.
      expect(after.members[0]!.jobs - before.members[0]!.jobs).toBe(4);
      break;
    }
    // Dropped last, with nothing after it: its member idle, its thread no longer keeps the process alive.
    expect(held()).toBe(false);
  }, 120_000);
});

test("a pool whose members cannot load the tokenizer fails ready(), naming the file", async () => {
  const bad = new TokenizerPool({ preprocessor: { tokenizerDir: "/nonexistent-tokenizer-dir" }, size: 1 });
  await expect(bad.ready()).rejects.toThrow(/tokenizer\.json not found/);
  // A pool that never started is not kept trying: its member is not replaced.
  await Bun.sleep(50);
  expect(bad.stats().restarts).toBe(0);
  await bad.close();
});

test("members share the model the pool read once: no member, a replacement included, reads the tokenizer directory", async () => {
  const copy = tempDir("qwen3-tokenizer-");
  for (const f of readdirSync(dir)) copyFileSync(join(dir, f), join(copy, f));
  const pool = new TokenizerPool({ preprocessor: { tokenizerDir: copy }, size: 2, budgetMs: 600_000 });
  // Gone before any member thread has loaded its modules: a member reading its own copy would not find it.
  rmSync(copy, { recursive: true });
  try {
    await pool.ready();
    const pre = createPreprocessor({ tokenizerDir: dir });
    const messages = chat("You are terse.", "Hello <think> there", "hi", "again 日本語 123");
    expect((await pool.tokenize({ kind: "chat", messages, opts: {} })).tokens).toEqual(pre.encodeChat(messages));
    await (pool as unknown as { members: { worker: { terminate(): Promise<number> } }[] }).members[0]!.worker.terminate();
    while (pool.stats().restarts < 1) await Bun.sleep(1);
    await pool.ready();
    expect(pool.stats().members.every((m) => m.warmUp !== null)).toBe(true);
    // Two at once: the second goes to the member the first left idle, so each member answers one.
    const texts = [lines(2_000, 67), lines(2_000, 68)];
    const answers = await Promise.all(texts.map((text) => pool.tokenize({ kind: "prompt", text })));
    expect(answers.map((a) => a.tokens)).toEqual(texts.map((t) => pre.encodeCompletion(t)));
    expect(pool.stats().members.map((m) => m.jobs > 0)).toEqual([true, true]);
  } finally {
    await pool.close();
  }
}, 120_000);

test("members of a Llama 3 pool find its whole words in the table the pool built, hashed with the pool's seed", async () => {
  const llama3 = modelDir("llama3");
  const pool = new TokenizerPool({ preprocessor: { tokenizerDir: llama3 }, size: 1, budgetMs: 600_000 });
  try {
    await pool.ready();
    // Tokens of Llama 3 its merges do not make: each is one id only when the whole-word lookup finds it.
    const text = `${lines(200, 69)} jeho mektedir lardan iyordu zdrav nhanh dikkat`;
    const expected = createPreprocessor({ tokenizerDir: llama3 }).encodeCompletion(text);
    expect((await pool.tokenize({ kind: "prompt", text })).tokens).toEqual(expected);
  } finally {
    await pool.close();
  }
}, 120_000);

test("a pool whose member thread is gone before it was ready fails ready(), whatever message went with it", async () => {
  const pool = new TokenizerPool({ preprocessor: { tokenizerDir: dir }, size: 1 });
  // Gone without a word (an exit that lost its last message, a thread killed): only its exit tells.
  await (pool as unknown as { members: { worker: { terminate(): Promise<number> } }[] }).members[0]!.worker.terminate();
  await expect(pool.ready()).rejects.toThrow(/tokenizer pool member 0/);
  await pool.close();
});

test("an observer that throws does not keep a request from its answer", async () => {
  const pool = new TokenizerPool({ preprocessor: { tokenizerDir: dir }, size: 1, budgetMs: 600_000, observe: { fresh: () => { throw new Error("a metric refused the value"); } } });
  await pool.ready();
  const o = await pool.tokenize({ kind: "prompt", text: "an answer all the same" });
  await pool.close();
  expect(o.complete).toBe(true);
  expect(o.tokens).toEqual(createPreprocessor({ tokenizerDir: dir }).encodeCompletion("an answer all the same"));
});

describe("tokenizer pool: lost members and answered requests", () => {
  // The member thread itself, as an uncaught error or an exit would end it (the pool's own handle on it).
  const memberThread = (pool: TokenizerPool, i: number) => (pool as unknown as { members: { worker: { terminate(): Promise<number> } }[] }).members[i]!.worker;

  test("a member whose thread is lost is replaced: the request it ran fails, the one queued behind it is answered by the replacement", async () => {
    const pool = await pools.start({ size: 1, budgetMs: 600_000 });
    await pool.tokenize({ kind: "prompt", text: lines(2_000, 60) }); // figures the member has counted
    const running = pool.tokenize({ kind: "prompt", text: lines(400_000, 61) });
    const queued = pool.tokenize({ kind: "prompt", text: "a question queued behind it" });
    while (!pool.stats().members[0]!.busy) await Bun.sleep(5);
    const counted = pool.cacheStats();
    await memberThread(pool, 0).terminate();
    await expect(running).rejects.toThrow(/tokenizer pool member 0 failed/);
    const pre = createPreprocessor({ tokenizerDir: dir });
    expect((await queued).tokens).toEqual(pre.encodeCompletion("a question queued behind it"));
    expect(pool.stats().restarts).toBe(1);
    // The cache's counters (exported as Prometheus counters) keep what the lost member counted.
    for (const k of ["hits", "misses", "evictions", "freshTokens"] as const) expect(pool.cacheStats()[k]).toBeGreaterThanOrEqual(counted[k]);
    expect(counted.misses).toBeGreaterThan(0);
    // The replacement goes on taking work.
    expect((await pool.tokenize({ kind: "prompt", text: "and the next one" })).tokens).toEqual(pre.encodeCompletion("and the next one"));
  }, 120_000);

  test("while no member is live (each being replaced), a request is answered at once on the queue fallback, and warmed later", async () => {
    const pool = await pools.start({ size: 1, budgetMs: 600_000 });
    await memberThread(pool, 0).terminate();
    while (pool.stats().restarts < 1) await Bun.sleep(1); // lost, its replacement loading
    const o = await pool.tokenize({ kind: "prompt", text: lines(2_000, 66) });
    expect(o).toMatchObject({ complete: false, fallback: "queue", tokens: new Uint32Array(0) });
    expect(pool.stats().fallbacks.queue).toBe(1);
    // Placed nowhere: not counted as a placement.
    expect(pool.stats().placement).toMatchObject({ affine: 0, moved: 0, new: 0 });
    // The replacement, once ready, tokenizes it in the background: the conversation's next turn finds it cached.
    await pool.ready();
    await idle(pool);
    expect((await pool.tokenize({ kind: "prompt", text: lines(2_000, 66) })).freshTokens).toBe(0);
  }, 120_000);

  test("the live members are told apart from the configured ones while a lost one is replaced", async () => {
    const { pool, registry } = await pools.startWithMetrics({ size: 2, budgetMs: 600_000 });
    const gauge = async (name: string) => Number(new RegExp(`^${name} (\\S+)$`, "m").exec(await registry.metrics())?.[1]);
    expect([await gauge("dynamo_epp_tokenizer_pool_members"), await gauge("dynamo_epp_tokenizer_pool_members_live")]).toEqual([2, 2]);
    await memberThread(pool, 0).terminate();
    while (pool.stats().restarts < 1) await Bun.sleep(1); // lost, its replacement loading
    expect([await gauge("dynamo_epp_tokenizer_pool_members"), await gauge("dynamo_epp_tokenizer_pool_members_live")]).toEqual([2, 1]);
    expect(pool.stats().members.map((m) => m.live)).toEqual([false, true]);
    await pool.ready();
    expect(await gauge("dynamo_epp_tokenizer_pool_members_live")).toBe(2);
  }, 120_000);

  test("the cache counters never go back: not for a member's reset that comes after forgetWork gave up on it", async () => {
    const pool = await pools.start({ size: 1, budgetMs: 600_000 });
    await pool.tokenize({ kind: "prompt", text: lines(2_000, 88) });
    const long = pool.tokenize({ kind: "prompt", text: lines(400_000, 89) });
    // Its member busy past the timeout: the reset comes after the long job, once the process may serve.
    await pool.forgetWork(1);
    const counted = pool.cacheStats();
    expect(counted.misses).toBeGreaterThan(0);
    await long;
    // Answered after the reset (its member answers in order).
    await pool.tokenize({ kind: "prompt", text: "after the reset" });
    for (const k of ["hits", "misses", "evictions", "freshTokens"] as const) expect({ k, v: pool.cacheStats()[k] >= counted[k] }).toEqual({ k, v: true });
  }, 120_000);

  test("a reset that comes after forgetWork gave up on it keeps the warms queued meanwhile: they are traffic's", async () => {
    const pool = await pools.start({ size: 1, budgetMs: 600_000 });
    const long = pool.tokenize({ kind: "prompt", text: lines(400_000, 91) });
    await pool.forgetWork(1);
    // Queued behind the long job: the first warm is posted when it ends, ahead of the reset's answer; the second
    // is still queued when that answer comes.
    const text = lines(2_000, 92);
    pool.warm({ kind: "prompt", text: lines(2_000, 94) });
    pool.warm({ kind: "prompt", text });
    await long;
    while (pool.stats().members[0]!.busy || pool.stats().members[0]!.warmQueued > 0) await Bun.sleep(5);
    const after = await pool.tokenize({ kind: "prompt", text });
    expect(after.freshTokens).toBe(0);
  }, 120_000);

  test("a warm running when its member's thread is lost is counted lost, not run again", async () => {
    const pool = await pools.start({ size: 1, budgetMs: 600_000 });
    pool.warm({ kind: "prompt", text: lines(400_000, 93) });
    while (!pool.stats().members[0]!.busy) await Bun.sleep(1);
    await memberThread(pool, 0).terminate();
    while (pool.stats().restarts < 1) await Bun.sleep(1);
    await pool.ready();
    expect(pool.stats()).toMatchObject({ warmLost: 1 });
    expect(pool.stats().members[0]).toMatchObject({ busy: false, warmQueued: 0 });
  }, 120_000);

  test("forgetWork forgets what lost members counted too", async () => {
    const pool = await pools.start({ size: 1, budgetMs: 600_000 });
    await pool.tokenize({ kind: "prompt", text: lines(2_000, 90) });
    await memberThread(pool, 0).terminate();
    while (pool.stats().restarts < 1) await Bun.sleep(1);
    await pool.ready();
    expect(pool.cacheStats().misses).toBeGreaterThan(0);
    await pool.forgetWork();
    expect(pool.cacheStats()).toMatchObject({ hits: 0, misses: 0, evictions: 0, freshTokens: 0 });
  }, 120_000);

  test("a body too large for its caller, past its budget behind a member that is lost, is answered unread", async () => {
    const pool = await pools.start({ size: 1, budgetMs: 20, readHereMaxBytes: 1 << 20 });
    // ~13 MB of chat in 400k short messages: a member takes hundreds of ms to read (parse and validate) it, while a
    // body under 1 MiB would be answered unread at once.
    const large = (seed: number) => new TextEncoder().encode(JSON.stringify({
      messages: Array.from({ length: 400_000 }, (_, i) => ({ role: i % 2 === 0 ? "user" : "assistant", content: `turn ${seed} ${i}` })),
    }));
    const [first, second] = [large(64), large(65)]; // built before either goes (building one takes a while)
    const reading = pool.tokenize({ kind: "body", request: { body: first } });
    const waiting = pool.tokenize({ kind: "body", request: { body: second } });
    await Bun.sleep(50); // both past their budget, waiting for the member's reading
    expect(pool.stats().members[0]!).toMatchObject({ busy: true, jobs: 0, queued: 1 }); // the first still being read
    await memberThread(pool, 0).terminate();
    await expect(reading).rejects.toThrow(/tokenizer pool member 0 failed/);
    // Not kept for the replacement (which may be a backoff away): its caller reads it.
    const out = await waiting;
    expect(out).toMatchObject({ complete: false, fallback: "budget" });
    expect(out.read).toBeUndefined();
  }, 120_000);

  test("a stopped body too large to read again is lost with its member's thread, counted so; the replacement, idle, keeps nothing alive", async () => {
    const pool = await pools.start({ size: 1, budgetMs: 20, readHereMaxBytes: 64 << 10 });
    const text = lines(800_000, 91); // made before either goes: this thread must be free to stop the first early
    const large = new TextEncoder().encode(JSON.stringify({ model: "qwen3", messages: [{ role: "user", content: lines(100_000, 92) }] }));
    // Answered over budget, then stopped for a long request: only its member's walk can resume it. The request
    // goes once the body is answered (queued with it, its own budget could end before it reached the member).
    expect((await pool.tokenize({ kind: "body", request: { body: large } })).fallback).toBe("budget");
    await pool.tokenize({ kind: "prompt", text }); // answered, and still running: nothing waits behind it
    expect(pool.stats()).toMatchObject({ warmPreempted: 1, members: [{ busy: true, warmQueued: 1 }] });
    await memberThread(pool, 0).terminate();
    while (pool.stats().restarts < 1) await Bun.sleep(1);
    // The replacement, as lost() left it: held while it had work waiting for it to be ready.
    const held = watchRef(pool, 0, true);
    await pool.ready();
    await idle(pool);
    expect(pool.stats()).toMatchObject({ warmLost: 1, warmTooLarge: 0, warmDropped: 0 });
    expect(held()).toBe(false);
  }, 120_000);

  test("a request answered over budget stops for the requests queued behind it, and finishes after them", async () => {
    const pool = await pools.start({ size: 1, budgetMs: 20 });
    const text = lines(800_000, 62);
    const long = pool.tokenize({ kind: "prompt", text });
    const queued = pool.tokenize({ kind: "prompt", text: "waiting behind it" });
    expect((await long).fallback).toBe("budget");
    // Answered, its rest only fills the cache: told to stop at once, since a request waits behind it.
    expect(pool.stats().warmPreempted).toBe(1);
    await queued;
    // Resumed after it and finished: every piece of both tokenized once.
    await idle(pool);
    const pre = createPreprocessor({ tokenizerDir: dir });
    expect(pool.stats().cache.freshTokens).toBe(pre.encodeCompletion(text).length + pre.encodeCompletion("waiting behind it").length);
    // The member's own count (tokens/s per thread) has the stopped part too.
    expect(pool.stats().members[0]!.freshTokens).toBe(pool.stats().cache.freshTokens);
  }, 120_000);
});
