import { describe, expect, test } from "bun:test";
import fc from "fast-check";
import { opensIdArray, parseBody, TooDeep } from "./openai-body";
import { BadRequest } from "./bad-request";
import { DEFAULT_READ_HERE_MAX_BYTES as MAX, glanceBody, readBody, readTokenIds } from "./read-body";
import type { RewriteRules } from "./rewrite-rules";
import { ROUTING_TEXT_CHARS } from "./routing-job";

const bytes = (v: unknown) => new TextEncoder().encode(typeof v === "string" ? v : JSON.stringify(v));

test("a body is read into the fields a pick needs and the job to tokenize, cut to the routing bound", () => {
  const long = "word ".repeat(ROUTING_TEXT_CHARS / 2);
  const read = readBody({ body: bytes({ model: "m", cache_salt: "s", messages: [{ role: "user", content: long }] }), path: "/v1/chat/completions" });
  // Cut at the bound: its next turn is cut at the same place (no reply to warm it with).
  expect(read.fields).toEqual({ model: "m", cacheSalt: "s", batchedPrompts: undefined, kind: "chat", boundCut: true });
  expect(readBody({ body: bytes({ model: "m", messages: [{ role: "user", content: "word" }] }), path: "/v1/chat/completions" }).fields.boundCut).toBeUndefined();
  // Routed by load for being past the bound whole (tools longer than it): the same for its next turn.
  const tools = [{ type: "function", function: { name: "f", description: "d".repeat(ROUTING_TEXT_CHARS) } }];
  const byLoad = readBody({ body: bytes({ model: "m", messages: [{ role: "user", content: "word" }], tools }), path: "/v1/chat/completions" });
  expect(byLoad.job).toEqual(new Uint32Array(0));
  expect(byLoad.fields.boundCut).toBe(true);
  expect(read.rewritten).toBeUndefined();
  const job = read.job as { kind: string; messages: { content: string }[] };
  expect(job.kind).toBe("chat");
  expect(job.messages[0]!.content.length).toBeLessThanOrEqual(ROUTING_TEXT_CHARS);
  expect(readBody({ body: bytes({ prompt: [[1, 2], [3]] }) })).toMatchObject({ fields: { kind: "tokens", batchedPrompts: 2 }, job: new Uint32Array([1, 2]) });
});

test("a /v1/responses body, read as a chat, says so in its fields (its reply is no chat completion's); a chat completion's does not", () => {
  const input = [{ role: "user", content: "hi" }];
  expect(readBody({ body: bytes({ model: "m", input }), path: "/v1/responses" }).fields).toMatchObject({ kind: "chat", responses: true });
  expect(readBody({ body: bytes({ model: "m", messages: input }), path: "/v1/chat/completions" }).fields.responses).toBeUndefined();
});

test("the rewrite model is spliced in only when the body names another one", () => {
  const body = '{"model": "alias", "prompt": "x"}';
  expect(new TextDecoder().decode(readBody({ body: bytes(body), rewriteModel: "served" }).rewritten)).toBe('{"model": "served", "prompt": "x"}');
  expect(readBody({ body: bytes(body), rewriteModel: "alias" }).rewritten).toBeUndefined();
});

describe("InferenceModelRewrite rules", () => {
  const rules: RewriteRules = {
    exact: new Map([
      ["alias", { rewrite: "canary", targets: [{ modelRewrite: "v1", weight: 1 }, { modelRewrite: "v2", weight: 3 }] }],
      ["retired", { rewrite: "gone", targets: [] }],
    ]),
  };
  const body = '{"model": "alias", "prompt": "x"}';
  const text = (b: Uint8Array | undefined) => new TextDecoder().decode(b);

  test("a rule for the body's model wins over the header's rewrite: the body names its weighted target, the fields say so", () => {
    const draws = [0.1, 0.3, 0.5, 0.9].map((r) => readBody({ body: bytes(body), rewriteModel: "served", rewriteRules: rules }, undefined, () => r));
    expect(draws.map((d) => d.fields.target)).toEqual(["v1", "v2", "v2", "v2"]);
    expect(draws[0]!.fields).toMatchObject({ model: "alias", target: "v1", rule: "canary", kind: "prompt" });
    expect(text(draws[0]!.rewritten)).toBe('{"model": "v1", "prompt": "x"}');
  });

  test("no rule for the body's model: the header's rewrite, as without rules; a body of ids likewise where it is read", () => {
    const other = readBody({ body: bytes('{"model": "m", "prompt": "x"}'), rewriteModel: "served", rewriteRules: rules });
    expect(other.fields).toMatchObject({ model: "m", target: "served" });
    expect(other.fields.rule).toBeUndefined();
    expect(text(other.rewritten)).toBe('{"model": "served", "prompt": "x"}');
    expect(readBody({ body: bytes(body), rewriteRules: { exact: new Map() } }).fields.target).toBeUndefined();
    expect(text(readTokenIds({ body: bytes('{"model":"alias","prompt":[1]}'), rewriteRules: { exact: new Map([["alias", { rewrite: "r", targets: [{ modelRewrite: "v" }] }]]) } })?.rewritten)).toBe('{"model":"v","prompt":[1]}');
  });

  test("a rule without targets: target \"\" (refused by its caller), nothing to tokenize and nothing rewritten", () => {
    const read = readBody({ body: bytes('{"model": "retired", "prompt": "x"}'), rewriteModel: "served", rewriteRules: rules });
    expect(read).toEqual({ fields: { model: "retired", cacheSalt: undefined, batchedPrompts: undefined, kind: "prompt", target: "", rule: "gone" }, job: new Uint32Array(0) });
  });
});

test("a body that may be cut and does not parse is routed by load, saying why; nesting too deep is refused even then", () => {
  expect(readBody({ body: bytes('{"prompt": "a'), maybeCut: true }).fields).toMatchObject({ kind: "none", cut: expect.stringContaining("not JSON") });
  expect(() => readBody({ body: bytes('{"prompt": "a') })).toThrow("not JSON");
  expect(() => readBody({ body: bytes(`{"prompt": ${"[".repeat(200)}`), maybeCut: true })).toThrow(TooDeep);
});

describe("glanceBody", () => {
  const text = (b: Uint8Array | undefined) => new TextDecoder().decode(b);
  // Quotes, braces and a `model` key inside strings and nested objects: none of them is the request's model.
  const chat = '{"messages": [{"role": "user", "content": "\\"model\\": \\"no\\" {["}], "x": {"model": "nested"}, "n": 1.0, "model": "alias"}';

  test("the body's last top-level model, as Python's json reads it; the header's rewrite spliced in; nothing else read", () => {
    const read = glanceBody({ body: bytes(chat), rewriteModel: "served" });
    expect(read).toMatchObject({ fields: { model: "alias", kind: "none", target: "served" }, job: new Uint32Array(0) });
    expect(text(read.rewritten)).toBe(chat.replace('"alias"', '"served"'));
    const twice = '{"model": "a", "prompt": "p", "mod\\u0065l": "b"}';
    expect(glanceBody({ body: bytes(twice) }).fields).toEqual({ model: "b", kind: "none" });
    expect(glanceBody({ body: bytes('{"prompt": "p"}'), rewriteModel: "m" }).rewritten).toEqual(bytes('{"model":"m","prompt": "p"}'));
  });

  test("InferenceModelRewrite rules apply as readBody applies them", () => {
    const rules: RewriteRules = { exact: new Map([["alias", { rewrite: "canary", targets: [{ modelRewrite: "v1" }] }], ["retired", { rewrite: "gone", targets: [] }]]) };
    const read = glanceBody({ body: bytes(chat), rewriteModel: "served", rewriteRules: rules });
    expect(read.fields).toMatchObject({ model: "alias", target: "v1", rule: "canary" });
    expect(text(read.rewritten)).toBe(chat.replace('"alias"', '"v1"'));
    expect(glanceBody({ body: bytes('{"model": "retired"}'), rewriteModel: "served", rewriteRules: rules })).toEqual({ fields: { model: "retired", kind: "none", target: "", rule: "gone" }, job: new Uint32Array(0) });
  });

  test("a body that is not an object is refused, or routed by load as cut when it may be; a model not a string is refused", () => {
    expect(glanceBody({ body: bytes('{"prompt": "a'), maybeCut: true }).fields).toMatchObject({ kind: "none", cut: expect.any(String) });
    expect(() => glanceBody({ body: bytes('{"prompt": "a') })).toThrow(BadRequest);
    expect(() => glanceBody({ body: bytes("[1]") })).toThrow(BadRequest);
    expect(() => glanceBody({ body: bytes('{"model": 1}') })).toThrow("model must be a string");
  });
});

describe("readTokenIds", () => {
  const ws = fc.constantFrom("", " ", "\n  ", "\t");
  // Bodies of ids as clients write them: keys in any order, any JSON whitespace, the ids under prompt or token_ids.
  const idsBody = fc.record({
    ids: fc.array(fc.integer({ min: 0, max: 2 ** 32 - 1 }), { minLength: 1, maxLength: 50 }),
    key: fc.constantFrom("prompt", "token_ids"),
    model: fc.option(fc.constantFrom("m", "alias", 'with \\"quote\\"'), { nil: undefined }),
    salt: fc.option(fc.string({ maxLength: 8 }), { nil: undefined }),
    // Each key once: a key the scan reads (stream) given twice sends the body to JSON.parse, which keeps the last.
    others: fc.uniqueArray(fc.tuple(fc.constantFrom("max_tokens", "stream", "temperature"), fc.constantFrom("16", "true", "0.5")), { maxLength: 3, selector: ([k]) => k }),
    // SGLang's fields, read by the same scan: strings (empty, escaped) and values that are none.
    sglang: fc.uniqueArray(fc.tuple(fc.constantFrom("lora_path", "extra_key"), fc.constantFrom('"sql"', '""', '"a\\u0062"', "null", '["x"]')), { maxLength: 2, selector: ([k]) => k }),
    space: fc.tuple(ws, ws, ws),
    shuffle: fc.integer({ min: 0, max: 1000 }),
  }).map(({ ids, key, model, salt, others, sglang, space: [a, b, c], shuffle }) => {
    const fields = [`"${key}"${a}:${b}[${c}${ids.join(`,${a}`)}]`, ...[...others, ...sglang].map(([k, v]) => `"${k}":${a}${v}`)];
    if (model !== undefined) fields.push(`"model":${b}"${model}"`);
    if (salt !== undefined) fields.push(`"cache_salt": ${JSON.stringify(salt)}`);
    const at = shuffle % fields.length;
    return `{${a}${[...fields.slice(at), ...fields.slice(0, at)].join(`,${c}`)}${b}}`;
  });

  test("reads a body of ids as readBody does, model rewrite included, and as JSON.parse reads it", () => {
    fc.assert(fc.property(idsBody, fc.constantFrom(undefined, "served"), (text, rewriteModel) => {
      const req = { body: bytes(text), rewriteModel };
      const here = readTokenIds(req);
      expect(here).toBeDefined();
      expect(here).toEqual(readBody(req) as typeof here);
      const parsed = parseBody(JSON.parse(text));
      expect(parsed.input).toEqual({ kind: "tokens", tokens: here!.job });
      expect(here!.fields).toMatchObject({ model: parsed.model, cacheSalt: parsed.cacheSalt });
      expect(here!.fields.stream).toBe(parsed.stream);
      expect([here!.fields.loraPath, here!.fields.namespaced]).toEqual([parsed.loraPath, parsed.namespaced]);
      expect(opensIdArray(Buffer.from(req.body))).toBe(true);
    }));
  });

  test("the search for the key tells a body of ids from others without parsing", () => {
    const opens = (text: string) => opensIdArray(Buffer.from(text));
    for (const text of ['{"prompt":[1]}', '{"token_ids" :\n[ 7 ]}', '{"messages": [], "prompt": [1]}', '{"a": {"prompt": [1, 2]}}']) expect(opens(text)).toBe(true);
    for (const text of ['{"prompt": "1"}', '{"prompt": [[1]]}', '{"prompt": []}', '{"prompts": [1]}', '{"m": "say \\"prompt\\": [1]"}', '{"prompt"']) expect(opens(text)).toBe(false);
  });

  test("reads nothing of any other body, nor of one over MAX", () => {
    const others = [
      { messages: [{ role: "user", content: "say \"prompt\": [1] please" }] },
      { prompt: "text" },
      { prompt: [[1, 2], [3]] },
      { prompt: [1, 2], truncate_prompt_tokens: 1 },
      { model: "m" },
    ];
    for (const o of others) expect(readTokenIds({ body: bytes(o) })).toBeUndefined();
    expect(readTokenIds({ body: bytes('{"prompt": [1, 2') })).toBeUndefined(); // cut
    const big = bytes({ prompt: Array.from({ length: MAX / 4 }, (_, i) => i) });
    expect(big.length).toBeGreaterThan(MAX);
    expect(readTokenIds({ body: big })).toBeUndefined();
    expect(readBody({ body: big }).job).toHaveLength(MAX / 4);
  });
});
