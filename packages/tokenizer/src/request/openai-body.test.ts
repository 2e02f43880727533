import { describe, expect, test } from "bun:test";
import fc from "fast-check";
import { BadRequest, MAX_JSON_DEPTH, parseBody, parseBodyBytes, stringEnd, TooDeep } from "./openai-body";

const bytes = (v: unknown) => new TextEncoder().encode(typeof v === "string" ? v : JSON.stringify(v));

describe("OpenAI request bodies", () => {
  test("completions: token ids, text, and batches (the first prompt decides)", () => {
    expect(parseBodyBytes(bytes({ model: "m", prompt: [1, 2, 3] }))).toEqual({ model: "m", input: { kind: "tokens", tokens: new Uint32Array([1, 2, 3]) } });
    expect(parseBodyBytes(bytes({ prompt: "hi" })).input).toEqual({ kind: "prompt", text: "hi" });
    expect(parseBodyBytes(bytes({ prompt: ["a", "b"] })).input).toEqual({ kind: "prompt", text: "a" });
    expect(parseBodyBytes(bytes({ prompt: [[5, 6], [7]] })).input).toEqual({ kind: "tokens", tokens: new Uint32Array([5, 6]) });
    expect(parseBodyBytes(bytes({ token_ids: [4294967295] })).input).toEqual({ kind: "tokens", tokens: new Uint32Array([4294967295]) });
    // A batch says how many prompts it holds (its usage is theirs together); one prompt is no batch.
    expect(parseBodyBytes(bytes({ prompt: ["a", "b", "c"] })).batchedPrompts).toBe(3);
    expect(parseBodyBytes(bytes({ prompt: [[5, 6], [7]] })).batchedPrompts).toBe(2);
    expect(parseBodyBytes(bytes({ prompt: ["a"] })).batchedPrompts).toBeUndefined();
    expect(parseBodyBytes(bytes({ prompt: [5, 6] })).batchedPrompts).toBeUndefined();
  });

  test("chat: messages and tools", () => {
    const msgs = [{ role: "user", content: "x" }];
    expect(parseBodyBytes(bytes({ messages: msgs, tools: [{ type: "function" }] })).input).toEqual({ kind: "chat", messages: msgs, tools: [{ type: "function" }] });
  });

  test("chat: a content part may be a plain string (a text part), a Responses input's may not", () => {
    const input = parseBodyBytes(bytes({ messages: [{ role: "user", content: ["a", { type: "image_url", image_url: { url: "u" } }] }] })).input;
    expect(input.kind === "chat" && input.messages).toEqual([{ role: "user", content: [{ type: "text", text: "a" }, { type: "image_url", image_url: { url: "u" } }] }]);
    expect(() => parseBodyBytes(bytes({ messages: [{ role: "user", content: [1] }] }))).toThrow(BadRequest);
    expect(() => parseBodyBytes(bytes({ input: [{ role: "user", content: ["a"] }] }), "/v1/responses")).toThrow(BadRequest);
  });

  test("chat: chat_template_kwargs reach the template, as vLLM renders with them", () => {
    const msgs = [{ role: "user", content: "x" }];
    const input = parseBodyBytes(bytes({ messages: msgs, chat_template_kwargs: { enable_thinking: false } })).input;
    expect(input).toEqual({ kind: "chat", messages: msgs, tools: undefined, templateKwargs: { enable_thinking: false } });
    expect(() => parseBodyBytes(bytes({ messages: msgs, chat_template_kwargs: [1] }))).toThrow(/chat_template_kwargs/);
  });

  test("chat: documents and reasoning_effort join chat_template_kwargs as vLLM's build_chat_params merges them", () => {
    const msgs = [{ role: "user", content: "x" }];
    const kwargs = (body: Record<string, unknown>) => {
      const input = parseBodyBytes(bytes({ messages: msgs, ...body })).input;
      return input.kind === "chat" ? input.templateKwargs : "not a chat";
    };
    const docs = [{ title: "t", text: "d" }];
    expect(kwargs({ documents: docs })).toEqual({ documents: docs });
    // A request field left null leaves the kwarg of that name as chat_template_kwargs gives it.
    expect(kwargs({ documents: null, chat_template_kwargs: { documents: docs } })).toEqual({ documents: docs });
    expect(kwargs({ documents: [{ text: "mine" }], chat_template_kwargs: { documents: docs } })).toEqual({ documents: [{ text: "mine" }] });
    // reasoning_effort turns thinking on or off, unless chat_template_kwargs says so itself.
    expect(kwargs({ reasoning_effort: "none" })).toEqual({ reasoning_effort: "none", enable_thinking: false });
    expect(kwargs({ reasoning_effort: "low" })).toEqual({ reasoning_effort: "low", enable_thinking: true });
    expect(kwargs({ reasoning_effort: "high", chat_template_kwargs: { enable_thinking: false } })).toEqual({ reasoning_effort: "high", enable_thinking: false });
    expect(kwargs({ reasoning_effort: null })).toBeUndefined();
    // What vLLM's schema refuses is a 400 here too.
    expect(() => kwargs({ documents: "d" })).toThrow(/documents must be an array of objects of strings/);
    expect(() => kwargs({ documents: [{ text: 1 }] })).toThrow(/documents must be/);
    expect(() => kwargs({ reasoning_effort: 1 })).toThrow(/reasoning_effort must be a string/);
    // Which strings a worker takes depends on its vLLM: any is rendered as given.
    expect(kwargs({ reasoning_effort: "max" })).toEqual({ reasoning_effort: "max", enable_thinking: true });
    // merge_kwargs drops an "auto" (an unset value), not the enable_thinking it implies.
    expect(kwargs({ reasoning_effort: "auto" })).toEqual({ enable_thinking: true });
    // `1.0` where an object belongs (the body parsed keeping floats, for its tools) is no object.
    expect(() => kwargs({ tools: [], chat_template_kwargs: 1.0 })).toThrow(/chat_template_kwargs must be an object/);
  });

  test("responses: chat_template_kwargs and reasoning.effort merge as vLLM's ResponsesRequest.build_chat_params merges them", () => {
    const kwargs = (body: Record<string, unknown>) => {
      const input = parseBodyBytes(bytes({ input: "x", ...body }), "/v1/responses").input;
      return input.kind === "chat" ? input.templateKwargs : "not a chat";
    };
    expect(kwargs({ chat_template_kwargs: { enable_thinking: false } })).toEqual({ enable_thinking: false });
    expect(kwargs({ reasoning: { effort: "low" } })).toEqual({ reasoning_effort: "low", enable_thinking: true });
    expect(kwargs({ reasoning: { effort: "none" } })).toEqual({ reasoning_effort: "none", enable_thinking: false });
    expect(kwargs({ reasoning: { effort: "high" }, chat_template_kwargs: { enable_thinking: false, x: 1 } })).toEqual({ reasoning_effort: "high", enable_thinking: false, x: 1 });
    expect(kwargs({ reasoning: { effort: null } })).toBeUndefined();
    expect(() => kwargs({ chat_template_kwargs: [1] })).toThrow(/chat_template_kwargs must be an object/);
    expect(() => kwargs({ reasoning: { effort: 3 } })).toThrow(/reasoning.effort must be a string/);
    expect(() => kwargs({ reasoning: 1.0 })).toThrow(/reasoning must be an object/);
  });

  test("chat: a message's deprecated reasoning_content is its reasoning (vLLM's validator renames it); not on Responses", () => {
    const chat = (messages: unknown[]) => {
      const input = parseBodyBytes(bytes({ messages })).input;
      return input.kind === "chat" ? input.messages : "not a chat";
    };
    expect(chat([{ role: "assistant", content: "a", reasoning_content: "r" }])).toEqual([{ role: "assistant", content: "a", reasoning: "r" }]);
    // A reasoning given wins; a null reasoning_content is dropped.
    expect(chat([{ role: "assistant", content: "a", reasoning: "mine", reasoning_content: "r" }])).toEqual([{ role: "assistant", content: "a", reasoning: "mine" }]);
    expect(chat([{ role: "assistant", content: "a", reasoning: null, reasoning_content: "r" }])).toEqual([{ role: "assistant", content: "a", reasoning: "r" }]);
    expect(chat([{ role: "assistant", content: "a", reasoning_content: null }])).toEqual([{ role: "assistant", content: "a" }]);
    const plain = [{ role: "user", content: "x" }];
    expect(parseBodyBytes(bytes({ messages: plain })).input).toMatchObject({ messages: plain });
    // vLLM's Responses path does not rename: an assistant input message is rebuilt from its text alone.
    const item = { role: "assistant", content: "a", reasoning_content: "r" };
    const responses = parseBodyBytes(bytes({ input: [{ role: "user", content: "q" }, item] }), "/v1/responses").input;
    expect(responses.kind === "chat" ? responses.messages.at(-1) : undefined).toEqual({ role: "assistant", content: "a" });
  });

  test("chat: add_generation_prompt and continue_final_message reach the template, as vLLM renders with them", () => {
    const msgs = [{ role: "user", content: "x" }, { role: "assistant", content: "The answer is" }];
    const input = parseBodyBytes(bytes({ messages: msgs, add_generation_prompt: false, continue_final_message: true })).input;
    expect(input).toMatchObject({ kind: "chat", addGenerationPrompt: false, continueFinalMessage: true });
    expect(parseBodyBytes(bytes({ messages: msgs })).input).toMatchObject({ addGenerationPrompt: undefined, continueFinalMessage: undefined });
  });

  test("chat: echo is read (its reply repeats the final message's text); any other value refuses nothing", () => {
    const msgs = [{ role: "user", content: "x" }, { role: "assistant", content: "The answer is" }];
    expect(parseBodyBytes(bytes({ messages: msgs, echo: true })).input).toMatchObject({ kind: "chat", echo: true });
    for (const echo of [false, "no", 1]) expect(parseBodyBytes(bytes({ messages: msgs, echo })).input).not.toHaveProperty("echo");
  });

  test.each([
    [JSON.stringify({ messages: [{ role: "user", content: "x" }], continue_final_message: true }), /add_generation_prompt to be false/],
    [JSON.stringify({ messages: [{ role: "user", content: "x" }], continue_final_message: true, add_generation_prompt: true }), /add_generation_prompt to be false/],
    [JSON.stringify({ messages: [{ role: "user", content: "x" }], add_generation_prompt: "no" }), /add_generation_prompt must be a boolean/],
    ["{", /not JSON/],
    ["[1]", /JSON object/],
    [JSON.stringify({ prompt: [1, -1] }), /prompt\[1\]/],
    [JSON.stringify({ prompt: [1.5] }), /prompt\[0\]/],
    [JSON.stringify({ prompt: [4294967296] }), /prompt\[0\]/],
    [JSON.stringify({ prompt: 3 }), /prompt must be/],
    [JSON.stringify({ messages: [{ content: "no role" }] }), /messages/],
    [JSON.stringify({ messages: [{ role: "user", content: 123 }] }), /content must be/],
    [JSON.stringify({ messages: [{ role: "user", content: { text: "x" } }] }), /content must be/],
    [JSON.stringify({ messages: [{ role: "user", content: [null] }] }), /content must be/],
    [JSON.stringify({ model: 5, prompt: "x" }), /model/],
  ])("%s is a bad request", (body, message) => {
    expect(() => parseBodyBytes(bytes(body))).toThrow(BadRequest);
    expect(() => parseBodyBytes(bytes(body))).toThrow(message);
  });
});

describe("the token-ids fast path (WASM) answers as JSON.parse + parseBody does", () => {
  const outcome = (f: () => unknown) => {
    try {
      return { ok: f() };
    } catch (e) {
      return { error: (e as Error).constructor.name };
    }
  };
  const slow = (b: Uint8Array) => outcome(() => parseBody(JSON.parse(new TextDecoder().decode(b))));

  test.each([
    { model: "m", prompt: [1, 2] },
    { model: "caf\u00e9 \"quoted\" \\ m", token_ids: [7], prompt: "ignored" },
    { token_ids: [1], messages: [{ role: "user", content: "x" }] },
    { messages: [{ role: "user", content: "x" }], prompt: [1] },
    { model: null, prompt: [1] },
    { model: 3, prompt: [1] },
    { prompt: [] },
    { token_ids: [] },
    { prompt: [1.5] },
    { prompt: [4294967296] },
  ])("%j", (doc) => {
    const b = bytes(doc);
    expect(outcome(() => parseBodyBytes(b))).toEqual(slow(b));
  });

  test("random bodies", () => {
    const ids = fc.array(fc.oneof(fc.nat({ max: 0xffffffff }), fc.double(), fc.integer({ min: -5, max: 5 })), { maxLength: 20 });
    const doc = fc.record(
      {
        model: fc.oneof(fc.string(), fc.constant(null), fc.nat()),
        prompt: fc.oneof(ids, fc.string(), fc.array(ids, { maxLength: 2 })),
        token_ids: ids,
        messages: fc.array(fc.record({ role: fc.string(), content: fc.string() }), { maxLength: 2 }),
        max_tokens: fc.nat(),
      },
      { requiredKeys: [] },
    );
    fc.assert(
      fc.property(doc, (d) => {
        const b = bytes(d);
        expect(outcome(() => parseBodyBytes(b))).toEqual(slow(b));
      }),
      { numRuns: 500 },
    );
  });
});

test("a body past the fast path's size limit (4 MiB, left to JSON.parse) gets the same answer", () => {
  const tokens = Array.from({ length: 700_000 }, (_, i) => (i * 7919) % 151_000);
  const body = bytes({ model: "m", prompt: tokens });
  expect(body.length).toBeGreaterThan(4 * 1024 * 1024);
  const parsed = parseBodyBytes(body);
  expect(parsed.model).toBe("m");
  expect(parsed.input).toEqual({ kind: "tokens", tokens: Uint32Array.from(tokens) });
});

test("stringEnd: just past a string's closing quote (escaped quotes and backslash runs counted), -1 if it does not close before the limit", () => {
  fc.assert(
    fc.property(fc.string({ unit: fc.constantFrom('"', "\\", "a", "é") }), (text) => {
      const literal = bytes(JSON.stringify(text));
      const b = bytes(`${JSON.stringify(text)}"x"`);
      expect(stringEnd(b, 0)).toBe(literal.length);
      expect(stringEnd(b, 0, literal.length)).toBe(literal.length);
      expect(stringEnd(b, 0, literal.length - 1)).toBe(-1);
    }),
    { numRuns: 500 },
  );
});

describe("JSON depth limit", () => {
  const nest = (depth: number, leaf = "1") => "[".repeat(depth) + leaf + "]".repeat(depth);
  const chatWith = (part: string) => `{"messages":[{"role":"user","content":[{"type":"text","text":"hi","x":${part}}]}]}`;

  test("bodies nested past MAX_JSON_DEPTH are refused as TooDeep (a 400) wherever the nesting is", () => {
    const deep = nest(50_000);
    for (const body of [
      `{"prompt":${deep}}`,
      `{"token_ids":${deep}}`,
      chatWith(deep),
      `{"messages":[{"role":"user","content":"hi"}],"tools":[${'{"a":'.repeat(50_000)}1${"}".repeat(50_000)}]}`,
      `{"messages":[{"role":"user","content":"hi"}],"chat_template_kwargs":{"x":${deep}}}`,
      `{"prompt":${nest(MAX_JSON_DEPTH)}}`, // the body object itself is one level
    ])
      expect(() => parseBodyBytes(bytes(body))).toThrow(TooDeep);
  });

  test("nesting up to the limit parses; brackets inside strings (escaped quotes too) do not count", () => {
    // The body object + messages + message + content + part + MAX - 5 arrays = MAX levels.
    expect(parseBodyBytes(bytes(chatWith(nest(MAX_JSON_DEPTH - 5)))).input.kind).toBe("chat");
    // JSON-escaped: \\\"[[[...{{{...\\ then the closing quote (after an even run of backslashes).
    const text = `\\"${"[".repeat(500)}${"{".repeat(500)}\\`;
    expect(parseBodyBytes(bytes({ prompt: text, n: [[1]] })).input).toEqual({ kind: "prompt", text });
  });

  test("random documents, wrapped to just below the limit: refused exactly when their depth takes them past it", () => {
    const depthOf = (v: unknown): number => (typeof v === "object" && v !== null ? 1 + Math.max(0, ...Object.values(v).map(depthOf)) : 0);
    const { tree } = fc.letrec((tie) => ({
      tree: fc.oneof(
        { depthSize: "small", maxDepth: 12 },
        fc.string({ unit: fc.constantFrom("[", "]", "{", "}", '"', "\\", "a") }),
        fc.nat(),
        fc.array(tie("tree"), { maxLength: 3 }),
        fc.dictionary(fc.string(), tie("tree"), { maxKeys: 3 }),
      ),
    }));
    const wrap = MAX_JSON_DEPTH - 6; // arrays around the document; the body object is one more level
    const tooDeep = (b: Uint8Array) => {
      try {
        parseBodyBytes(b);
        return false;
      } catch (e) {
        return e instanceof TooDeep;
      }
    };
    fc.assert(
      fc.property(tree, (t) => {
        const body = bytes(`{"prompt":"x","w":${nest(wrap, JSON.stringify(t))}}`);
        expect(tooDeep(body)).toBe(1 + wrap + depthOf(t) > MAX_JSON_DEPTH);
      }),
      { numRuns: 500 },
    );
  });
});

describe("stream", () => {
  const enc = (o: unknown) => new TextEncoder().encode(JSON.stringify(o));
  test("a body asking for its answer streamed says so, on the token-id fast path, the JSON path and a Messages body alike", () => {
    expect(parseBodyBytes(enc({ prompt: [1, 2], stream: true })).stream).toBe(true);
    expect(parseBodyBytes(enc({ messages: [{ role: "user", content: "hi" }], stream: true })).stream).toBe(true);
    expect(parseBodyBytes(enc({ model: "m", max_tokens: 8, messages: [{ role: "user", content: "hi" }], stream: true }), "/v1/messages").stream).toBe(true);
    // Only the JSON true: vLLM's own reading of the field (a string or false streams nothing).
    for (const stream of [false, "true", 1, null]) {
      expect(parseBodyBytes(enc({ prompt: [1, 2], stream })).stream).toBeUndefined();
      expect(parseBodyBytes(enc({ prompt: "text", stream })).stream).toBeUndefined();
    }
    expect(parseBodyBytes(enc({ prompt: [1], stream_options: { include_usage: true } })).stream).toBeUndefined();
  });
});

describe("cache_salt", () => {
  const enc = (o: unknown) => new TextEncoder().encode(JSON.stringify(o));
  test("is read on the token-id fast path and the JSON path alike; absent or null means none", () => {
    expect(parseBodyBytes(enc({ model: "m", prompt: [1, 2, 3], cache_salt: "tenant-a" }))).toMatchObject({ model: "m", cacheSalt: "tenant-a" });
    expect(parseBodyBytes(enc({ messages: [{ role: "user", content: "hi" }], cache_salt: "t\\u00e9" })).cacheSalt).toBe("t\\u00e9");
    expect(parseBodyBytes(enc({ prompt: "text", cache_salt: "s" })).cacheSalt).toBe("s");
    expect(parseBodyBytes(enc({ prompt: [1], cache_salt: null })).cacheSalt).toBeUndefined();
    expect(parseBodyBytes(enc({ prompt: [1] })).cacheSalt).toBeUndefined();
  });
  test("a salt that is not a string is a bad request", () => {
    expect(() => parseBodyBytes(enc({ prompt: [1], cache_salt: 7 }))).toThrow(BadRequest);
  });
});

describe("SGLang's lora_path and extra_key", () => {
  const sglang = (body: unknown, path?: string) => {
    const { loraPath, namespaced } = parseBodyBytes(bytes(body), path);
    return { loraPath, namespaced };
  };
  const none = { loraPath: undefined, namespaced: undefined };
  test("a top-level lora_path string is the adapter, a non-empty extra_key string a namespace, on the token-id path and JSON.parse's alike", () => {
    for (const input of [{ prompt: [1, 2] }, { prompt: "text" }, { messages: [{ role: "user", content: "hi" }] }, { input: "x", instructions: "y" }]) {
      expect(sglang({ model: "m", ...input, lora_path: "sql", extra_key: "tenant-a" })).toEqual({ loraPath: "sql", namespaced: true });
      expect(sglang({ model: "m", ...input })).toEqual(none);
    }
    expect(sglang({ model: "m", max_tokens: 8, messages: [{ role: "user", content: "hi" }], extra_key: "k" }, "/v1/messages").namespaced).toBe(true);
  });

  test("other values are neither and are not refused; keys inside other values are not the body's", () => {
    for (const prompt of [[1], "text"]) {
      expect(sglang({ prompt, lora_path: "", extra_key: "" })).toEqual(none);
      expect(sglang({ prompt, lora_path: ["sql"], extra_key: null })).toEqual(none);
      expect(sglang({ prompt, lora_path: null, extra_key: ["a"] })).toEqual(none);
      expect(sglang({ prompt, metadata: { extra_key: "x", lora_path: "y" } })).toEqual(none);
      expect(sglang({ prompt, note: 'say "extra_key": "x"' })).toEqual(none);
    }
  });

  test("read as JSON reads them: escapes in a value or a key, and the last of a key given twice", () => {
    for (const prompt of ["[1, 2]", '"text"']) {
      expect(sglang(`{"prompt": ${prompt}, "lora_path": "a\\u0062"}`).loraPath).toBe("ab");
      expect(sglang(`{"prompt": ${prompt}, "extra\\u005fkey": "k", "lora\\u005fpath": "sql"}`)).toEqual({ loraPath: "sql", namespaced: true });
      expect(sglang(`{"prompt": ${prompt}, "extra_key": "\\u0000"}`).namespaced).toBe(true);
      expect(sglang(`{"prompt": ${prompt}, "extra_key": "a", "extra_key": ""}`)).toEqual(none);
      expect(sglang(`{"prompt": ${prompt}, "lora_path": "a", "lora_path": "b"}`).loraPath).toBe("b");
    }
  });
});
