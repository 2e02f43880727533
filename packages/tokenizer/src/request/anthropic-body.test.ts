// /v1/messages bodies become the chat vLLM's Anthropic server builds from them (vllm/entrypoints/anthropic/serving.py,
// _convert_anthropic_to_openai_request; protocol.py for what it refuses). The expected chats are written out from
// that code, case by case.
import { beforeAll, describe, expect, test } from "bun:test";
import { chatRules } from "../chat-rules";
import { encodeJob, type TokenizeJob } from "../job";
import { createPreprocessor } from "../preprocessor";
import { PyFloat } from "../py-values";
import type { Preprocessor } from "../types";
import { qwen3TokenizerDir } from "../../test/qwen3-fixture";
import { BadRequest, parseBodyBytes } from "./openai-body";
import { readBody } from "./read-body";

const bytes = (v: unknown) => new TextEncoder().encode(JSON.stringify(v));
const MESSAGES = "/v1/messages";
// `2.0` written as Python reads it (a float): JSON.stringify writes it `2`.
const FLOAT = 2.000001;
const messages = (body: Record<string, unknown>) =>
  parseBodyBytes(new TextEncoder().encode(JSON.stringify({ model: "m", max_tokens: 64, ...body }).replaceAll(String(FLOAT), "2.0")), MESSAGES);
const chatOf = (body: Record<string, unknown>) => messages(body).input;

describe("/v1/messages bodies", () => {
  test("a string system becomes the system message; a string content stays the message's text", () => {
    expect(messages({ system: "Be brief.", messages: [{ role: "user", content: "Hi" }] })).toEqual({
      model: "m", input: { kind: "chat", messages: [{ role: "system", content: "Be brief." }, { role: "user", content: "Hi" }], tools: undefined, toolChoice: undefined, templateKwargs: undefined },
    });
  });

  test("system text blocks join with nothing between, without Claude Code's billing header; leading system messages follow after a blank line", () => {
    const body = {
      system: [
        { type: "text", text: "x-anthropic-billing-header: cc_version=2.1.37.abc; cc_entrypoint=cli;" },
        { type: "text", text: "You are Claude Code.", cache_control: { type: "ephemeral" } },
        { type: "text", text: "" },
        { type: "text", text: " Be concise." },
      ],
      messages: [
        { role: "system", content: [{ type: "text", text: "Leading." }, { type: "text", text: "x-anthropic-billing-header: x" }] },
        { role: "system", content: "Also leading." },
        { role: "user", content: "Hi" },
        { role: "system", content: "Later." },
      ],
    };
    const head = { role: "system", content: "You are Claude Code. Be concise.\n\nLeading.\n\nAlso leading." };
    // "preserve" keeps later ones in place; without rules they are folded (what "auto" means where no probe runs).
    const preserved = parseBodyBytes(bytes({ model: "m", max_tokens: 64, ...body }), MESSAGES, chatRules("vllm", { anthropicInlineSystem: "preserve" })).input;
    expect(preserved).toMatchObject({ messages: [head, { role: "user", content: "Hi" }, { role: "system", content: "Later." }] });
    expect(chatOf(body)).toMatchObject({
      messages: [head, { role: "user", content: "Hi\n\nLater." }],
    });
    // An empty system prompt, or leading system messages with no text, make no system message.
    expect(chatOf({ system: "", messages: [{ role: "user", content: "Hi" }] })).toMatchObject({ messages: [{ role: "user", content: "Hi" }] });
    expect(chatOf({ messages: [{ role: "system", content: "" }, { role: "user", content: "Hi" }] })).toMatchObject({ messages: [{ role: "user", content: "Hi" }] });
  });

  test("a tool loop: thinking becomes reasoning, tool_use a call whose arguments are Python's json.dumps, tool_result a tool message before the user's text", () => {
    const input = chatOf({
      messages: [
        { role: "user", content: [{ type: "text", text: "Weather in Zürich?", cache_control: { type: "ephemeral" } }] },
        {
          role: "assistant",
          content: [
            { type: "thinking", thinking: "Look it ", signature: "s1" },
            { type: "thinking", thinking: "up.", signature: "s2" },
            { type: "redacted_thinking", data: "opaque" },
            { type: "text", text: "Checking." },
            { type: "tool_use", id: "toolu_1", name: "weather", input: { city: "Zürich", days: FLOAT, units: ["c"] } },
            { type: "tool_use", id: "toolu_2", name: "clock", input: {} },
          ],
        },
        {
          role: "user",
          content: [
            { type: "text", text: "Both done." },
            { type: "tool_result", tool_use_id: "toolu_1", content: "3 C" },
            { type: "tool_result", tool_use_id: "toolu_2", content: [{ type: "text", text: "12:00" }, { type: "text", text: "UTC" }] },
          ],
        },
      ],
    });
    expect(input).toMatchObject({
      messages: [
        { role: "user", content: "Weather in Zürich?" },
        {
          role: "assistant", reasoning: "Look it up.", content: "Checking.",
          tool_calls: [
            { id: "toolu_1", type: "function", function: { name: "weather", arguments: '{"city": "Z\\u00fcrich", "days": 2.0, "units": ["c"]}' } },
            { id: "toolu_2", type: "function", function: { name: "clock", arguments: "{}" } },
          ],
        },
        { role: "tool", tool_call_id: "toolu_1", content: "3 C" },
        { role: "tool", tool_call_id: "toolu_2", content: "12:00\nUTC" },
        { role: "user", content: "Both done." },
      ],
    });
  });

  test("images become image_url parts (a data URI from base64); a tool_result's images follow its tool message as a user's", () => {
    const input = chatOf({
      messages: [
        {
          role: "user",
          content: [
            { type: "text", text: "What is this?" },
            { type: "image", source: { type: "base64", media_type: "image/png", data: "AAAA" } },
            { type: "image", source: { type: "url", url: "https://example.com/cat.png" } },
          ],
        },
        { role: "assistant", content: [{ type: "tool_use", id: "t1", name: "shot", input: { path: "/a" } }] },
        {
          role: "user",
          content: [{ type: "tool_result", tool_use_id: "t1", content: [{ type: "text", text: "Here" }, { type: "image", source: { data: "QUFB" } }] }],
        },
      ],
    });
    expect(input).toMatchObject({
      messages: [
        {
          role: "user",
          content: [
            { type: "text", text: "What is this?" },
            { type: "image_url", image_url: { url: "data:image/png;base64,AAAA" } },
            { type: "image_url", image_url: { url: "https://example.com/cat.png" } },
          ],
        },
        { role: "assistant", tool_calls: [{ id: "t1", type: "function", function: { name: "shot", arguments: '{"path": "/a"}' } }] },
        { role: "tool", tool_call_id: "t1", content: "Here" },
        { role: "user", content: [{ type: "image_url", image_url: { url: "data:image/jpeg;base64,QUFB" } }] },
      ],
    });
  });

  test("messages left empty: a user's of only tool results is dropped, an assistant's is kept bare; an assistant's tool_result is text", () => {
    const input = chatOf({
      messages: [
        { role: "user", content: "Context." },
        { role: "assistant", content: [{ type: "redacted_thinking", data: "x" }, { type: "text", text: "" }] },
        { role: "user", content: [{ type: "tool_result", tool_use_id: "a" }] },
        { role: "assistant", content: [{ type: "tool_result", tool_use_id: "b", content: [{ type: "text", text: "x", flag: true, n: null }] }] },
        { role: "user", content: [{ type: "tool_reference", tool_name: "f" }] },
      ],
    });
    if (input.kind !== "chat") throw new Error("not a chat");
    expect(input.messages).toEqual([
      { role: "user", content: "Context." },
      { role: "assistant" },
      { role: "tool", tool_call_id: "a", content: "" },
      { role: "assistant", content: "Tool result: [{'type': 'text', 'text': 'x', 'flag': True, 'n': None}]" },
    ]);
  });

  test("tools become function tools (a schema without a type gets \"object\", last; strict and defer_loading as pydantic's bools); tool_choice maps, defaulting to auto with tools", () => {
    const tools = [
      { name: "search", description: "Find", input_schema: { type: "object", properties: { q: { type: "string", minimum: FLOAT } } }, defer_loading: true, cache_control: { type: "ephemeral" } },
      { name: "noop", input_schema: { properties: {} }, strict: true, input_examples: [{}] },
      { name: "lax", input_schema: { type: "object" }, strict: "off", defer_loading: 1 },
    ];
    const input = chatOf({ messages: [{ role: "user", content: "x" }], tools });
    expect((input as { tools?: unknown }).tools).toEqual([
      { type: "function", function: { name: "search", description: "Find", parameters: { type: "object", properties: { q: { type: "string", minimum: new PyFloat(2) } } }, defer_loading: true } },
      { type: "function", function: { name: "noop", description: null, parameters: { properties: {}, type: "object" }, strict: true } },
      { type: "function", function: { name: "lax", description: null, parameters: { type: "object" }, strict: false, defer_loading: true } },
    ]);
    expect(input).toMatchObject({ toolChoice: "auto" });
    const noop = (input as { tools: { function: { parameters: object } }[] }).tools[1]!.function.parameters;
    expect(Object.keys(noop)).toEqual(["properties", "type"]);
    const choice = (tool_choice: unknown, withTools = true) => (chatOf({ messages: [{ role: "user", content: "x" }], tool_choice, ...(withTools ? { tools } : {}) }) as { toolChoice?: unknown }).toolChoice;
    expect(choice({ type: "any" })).toBe("required");
    expect(choice({ type: "none" })).toBe("none");
    expect(choice({ type: "tool", name: "search", disable_parallel_tool_use: true })).toEqual({ type: "function", function: { name: "search" } });
    expect(choice({ type: "auto" }, false)).toBe("auto");
    expect(choice(undefined, false)).toBeUndefined();
  });

  test("output_config.effort is the chat's reasoning_effort, merged with chat_template_kwargs as vLLM merges them", () => {
    const chat = { messages: [{ role: "user", content: "x" }] };
    expect(chatOf({ ...chat, output_config: { effort: "high" } })).toMatchObject({ templateKwargs: { reasoning_effort: "high", enable_thinking: true } });
    expect(chatOf({ ...chat, output_config: { effort: "low" }, chat_template_kwargs: { enable_thinking: false } })).toMatchObject({
      templateKwargs: { enable_thinking: false, reasoning_effort: "low" },
    });
    expect(chatOf({ ...chat, chat_template_kwargs: { enable_thinking: false } })).toMatchObject({ templateKwargs: { enable_thinking: false } });
  });

  test("thinking: disabled sets the server's effort for it over output_config's; enabled (a budget) and adaptive leave output_config's", () => {
    const chat = { max_tokens: 4096, messages: [{ role: "user", content: "x" }] };
    const kwargs = (body: Record<string, unknown>, rules = chatRules("vllm", { anthropicDisabledThinkingEffort: "none" })) =>
      (parseBodyBytes(bytes({ model: "m", ...chat, ...body }), MESSAGES, rules).input as { templateKwargs?: unknown }).templateKwargs;
    expect(kwargs({ thinking: { type: "disabled" } })).toEqual({ reasoning_effort: "none", enable_thinking: false });
    expect(kwargs({ thinking: { type: "disabled" }, output_config: { effort: "high" } })).toEqual({ reasoning_effort: "none", enable_thinking: false });
    expect(kwargs({ thinking: { type: "disabled" } }, chatRules("vllm", { anthropicDisabledThinkingEffort: "low" }))).toEqual({ reasoning_effort: "low", enable_thinking: true });
    // Without rules, what "auto" means where no probe runs.
    expect(chatOf({ messages: [{ role: "user", content: "x" }], thinking: { type: "disabled" } })).toMatchObject({ templateKwargs: { reasoning_effort: "low", enable_thinking: true } });
    expect(kwargs({ thinking: { type: "enabled", budget_tokens: 2048 } })).toBeUndefined();
    expect(kwargs({ thinking: { type: "enabled", budget_tokens: "2048", display: "omitted" }, output_config: { effort: "max" } })).toEqual({ reasoning_effort: "max", enable_thinking: true });
    // Claude Code's: an effort ceiling, adaptive thinking with its display omitted.
    expect(kwargs({ thinking: { type: "adaptive", display: "omitted" }, output_config: { effort: "high" } })).toEqual({ reasoning_effort: "high", enable_thinking: true });
    // A count_tokens request has no thinking field: it is not read.
    const counted = parseBodyBytes(bytes({ model: "m", messages: chat.messages, thinking: { type: "disabled", budget_tokens: 1 } }), "/v1/messages/count_tokens");
    expect((counted.input as { templateKwargs?: unknown }).templateKwargs).toBeUndefined();
  });

  test("cache_salt salts a Messages body's blocks as a chat's; count_tokens has none; add_generation_prompt and a prompt of ids are not read", () => {
    const body = { model: "m", max_tokens: 8, messages: [{ role: "user", content: "x" }], cache_salt: "s", add_generation_prompt: false, token_ids: [1, 2, 3] };
    const parsed = parseBodyBytes(bytes(body), MESSAGES);
    expect(parsed.cacheSalt).toBe("s");
    expect(parsed.input).toEqual({ kind: "chat", messages: [{ role: "user", content: "x" }], tools: undefined, toolChoice: undefined, templateKwargs: undefined });
    expect(parseBodyBytes(bytes(body), "/v1/messages/count_tokens").cacheSalt).toBeUndefined();
    // The same body on /v1/chat/completions is read as the chat API reads it.
    expect(parseBodyBytes(bytes(body), "/v1/chat/completions").input.kind).toBe("tokens");
    expect(parseBodyBytes(bytes(body), "/v1/messages?beta=true").input.kind).toBe("chat");
  });

  test("what vLLM's request model refuses is a bad request", () => {
    const ok = { model: "m", max_tokens: 8, messages: [{ role: "user", content: "x" }] };
    const refused = (body: Record<string, unknown>) => () => parseBodyBytes(bytes({ ...ok, ...body }), MESSAGES);
    expect(refused({ max_tokens: undefined })).toThrow(/max_tokens/);
    expect(refused({ max_tokens: 0 })).toThrow(/max_tokens/);
    expect(refused({ model: "" })).toThrow(/model/);
    expect(refused({ messages: [{ role: "bot", content: "x" }] })).toThrow(/role/);
    expect(refused({ messages: [{ role: "user", content: null }] })).toThrow(BadRequest);
    expect(refused({ messages: [{ role: "user", content: [{ type: "document", source: {} }] }] })).toThrow(/known type/);
    expect(refused({ messages: [{ role: "assistant", content: [{ type: "tool_use", id: "a", name: "f", input: [1] }] }] })).toThrow(/input/);
    expect(refused({ tool_choice: { type: "tool" } })).toThrow(/tool_choice.name/);
    expect(refused({ tools: [{ name: "f" }] })).toThrow(/input_schema/);
    expect(refused({ output_config: { effort: "extreme" } })).toThrow(/effort/);
    expect(() => parseBodyBytes(bytes({ ...ok, max_tokens: "8" }), MESSAGES)).not.toThrow();
    // Roles its AnthropicMessage has no place for, Claude Code's ctx and msg among them.
    expect(refused({ messages: [{ role: "ctx", content: "x" }] })).toThrow(/role/);
    expect(refused({ messages: [{ role: "msg", content: "x" }] })).toThrow(/role/);
    // Each variant of its thinking union, and the budget below max_tokens.
    expect(refused({ thinking: { budget_tokens: 2048 } })).toThrow(/thinking.type/);
    expect(refused({ max_tokens: 4096, thinking: { type: "enabled" } })).toThrow(/budget_tokens/);
    expect(refused({ max_tokens: 4096, thinking: { type: "enabled", budget_tokens: 1023 } })).toThrow(/budget_tokens/);
    expect(refused({ max_tokens: 4096, thinking: { type: "enabled", budget_tokens: 4096 } })).toThrow(/less than max_tokens/);
    expect(refused({ thinking: { type: "adaptive", display: "full" } })).toThrow(/display/);
    expect(refused({ thinking: "off" })).toThrow(/thinking/);
    expect(refused({ tools: [{ name: "f", input_schema: {}, strict: "maybe" }] })).toThrow(/strict/);
    expect(refused({ tool_choice: { type: "auto", name: 5 } })).toThrow(/tool_choice.name/);
    expect(refused({ tool_choice: { type: "auto", disable_parallel_tool_use: "sometimes" } })).toThrow(/disable_parallel_tool_use/);
    expect(refused({ messages: [{ role: "user", content: [{ type: "tool_result", tool_use_id: "a", is_error: "sometimes" }] }] })).toThrow(/is_error/);
    expect(refused({ cache_salt: "" })).toThrow(/cache_salt/);
    expect(refused({ cache_salt: "s".repeat(1025) })).toThrow(/cache_salt/);
  });

  test("a count_tokens body is read the same way, without max_tokens and without an effort (its request has neither)", () => {
    const body = bytes({ model: "m", system: "S", messages: [{ role: "user", content: [{ type: "text", text: "x" }] }], output_config: { effort: "high" } });
    expect(parseBodyBytes(body, "/v1/messages/count_tokens").input).toEqual({
      kind: "chat", messages: [{ role: "system", content: "S" }, { role: "user", content: "x" }], tools: undefined, toolChoice: undefined, templateKwargs: undefined,
    });
    expect(() => parseBodyBytes(body, MESSAGES)).toThrow(/max_tokens/);
  });

  test("under SGLang's rules a Messages body is routed by load, saying why", () => {
    const body = bytes({ model: "m", max_tokens: 8, messages: [{ role: "user", content: "x" }] });
    expect(parseBodyBytes(body, MESSAGES, chatRules("sglang"))).toEqual({
      model: "m", input: { kind: "none" }, unrendered: { cause: "messages_rules", message: expect.stringContaining("sglang") },
    });
  });

  test("a tool_result naming tools by reference adds a tool message of tool_reference parts, which the chat path renders as vLLM does", () => {
    const input = chatOf({
      messages: [{ role: "user", content: [{ type: "tool_result", tool_use_id: "t", content: [{ type: "text", text: "Loaded." }, { type: "tool_reference", tool_name: "late" }, { type: "tool_reference", name: "other" }] }] }],
    });
    expect(input).toMatchObject({
      messages: [
        { role: "tool", tool_call_id: "t", content: "Loaded." },
        { role: "tool", tool_call_id: "t", content: [{ type: "tool_reference", name: "late" }, { type: "tool_reference", name: "other" }] },
      ],
    });
  });
});

describe("a Messages body renders to the ids of the chat vLLM converts it to (Qwen3)", () => {
  let pre: Preprocessor;
  beforeAll(async () => {
    pre = createPreprocessor({ tokenizerDir: await qwen3TokenizerDir() });
  }, 60_000);
  const ids = (body: unknown, path?: string) => {
    const read = readBody({ body: bytes(body), path }, pre.rules);
    if (read.job instanceof Uint32Array) throw new Error("nothing rendered");
    return [...encodeJob(pre, read.job as TokenizeJob)];
  };

  test("a Claude Code-like turn (billing header, tools, thinking, tool results, a tool reference) and its chat completion give the same ids", () => {
    const tools = [{ name: "read_file", description: "Read a file", input_schema: { type: "object", properties: { path: { type: "string" } }, required: ["path"] } }];
    const anthropic = {
      model: "m", max_tokens: 1024, stream: true, output_config: { effort: "high" },
      system: [{ type: "text", text: "x-anthropic-billing-header: cc_version=2.1.37.abc;" }, { type: "text", text: "You are a coding agent." }],
      tools,
      messages: [
        { role: "user", content: [{ type: "text", text: "Open main.ts" }] },
        {
          role: "assistant",
          content: [
            { type: "thinking", thinking: "I should read it.", signature: "abc" },
            { type: "tool_use", id: "toolu_1", name: "read_file", input: { path: "main.ts" } },
          ],
        },
        { role: "user", content: [{ type: "tool_result", tool_use_id: "toolu_1", content: [{ type: "text", text: "console.log(1)" }, { type: "tool_reference", tool_name: "write_file" }] }] },
      ],
    };
    const chat = {
      model: "m",
      messages: [
        { role: "system", content: "You are a coding agent." },
        { role: "user", content: "Open main.ts" },
        { role: "assistant", reasoning: "I should read it.", tool_calls: [{ id: "toolu_1", type: "function", function: { name: "read_file", arguments: '{"path": "main.ts"}' } }] },
        { role: "tool", tool_call_id: "toolu_1", content: "console.log(1)" },
        { role: "tool", tool_call_id: "toolu_1", content: [{ type: "tool_reference", name: "write_file" }] },
      ],
      tools: tools.map((t) => ({ type: "function", function: { name: t.name, description: t.description, parameters: t.input_schema } })),
      tool_choice: "auto",
      reasoning_effort: "high",
    };
    const fromMessages = ids(anthropic, MESSAGES);
    expect(fromMessages.length).toBeGreaterThan(50);
    expect(fromMessages).toEqual(ids(chat, "/v1/chat/completions"));
    // Read as a chat completion (what the EPP did before), its blocks are content parts no chat has.
    expect(() => ids(anthropic, "/v1/chat/completions")).toThrow(/tool_use/);
  });

  test("thinking disabled renders as the chat with reasoning_effort \"none\" that the probe picks for Qwen3: an empty think block opens the reply", () => {
    expect(pre.rules.disabledThinkingEffort).toBe("none");
    const turn = { model: "m", max_tokens: 64, messages: [{ role: "user", content: "Hi" }] };
    const disabled = ids({ ...turn, thinking: { type: "disabled" }, output_config: { effort: "high" } }, MESSAGES);
    expect(disabled).toEqual(ids({ model: "m", messages: turn.messages, reasoning_effort: "none" }, "/v1/chat/completions"));
    expect(pre.decode(disabled.slice(-6))).toContain("<think>\n\n</think>\n\n");
    // Without it, the same prompt up to that block.
    const plain = ids(turn, MESSAGES);
    expect(plain.length).toBeLessThan(disabled.length);
    expect(disabled.slice(0, plain.length)).toEqual(plain);
  });
});
