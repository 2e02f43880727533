import { expect, test } from "bun:test";
import { readChatReply } from "./chat-reply";

const read = (text: string) => readChatReply(new TextEncoder().encode(text));
const sse = (...chunks: object[]) => chunks.map((c) => `data: ${JSON.stringify(c)}\n\n`).join("") + "data: [DONE]\n\n";

test("a JSON chat completion's single message is the reply", () => {
  expect(read(JSON.stringify({ choices: [{ index: 0, message: { role: "assistant", content: "Hi there." } }] })))
    .toEqual({ role: "assistant", content: "Hi there." });
});

test("a stream's deltas are joined", () => {
  const body = sse({ choices: [{ index: 0, delta: { role: "assistant", content: "" } }] }, { choices: [{ index: 0, delta: { content: "Hel" } }] },
    { choices: [{ index: 0, delta: { content: "lo 日本" } }] }, { choices: [], usage: { prompt_tokens: 3 } });
  expect(read(body)).toEqual({ role: "assistant", content: "Hello 日本" });
});

test("tool calls, several choices, a Responses reply, an unreadable or an empty body give nothing to warm with", () => {
  expect(read(sse({ choices: [{ index: 0, delta: { tool_calls: [{ index: 0, function: { name: "f" } }] } }] }))).toBeUndefined();
  expect(read(JSON.stringify({ choices: [{ message: { content: "a" } }, { message: { content: "b" } }] }))).toBeUndefined();
  expect(read(sse({ choices: [{ index: 1, delta: { content: "x" } }] }))).toBeUndefined();
  expect(read(JSON.stringify({ object: "response", output: [{ type: "message", content: [{ type: "output_text", text: "a" }] }] }))).toBeUndefined();
  expect(read("{not json")).toBeUndefined();
  expect(read("")).toBeUndefined();
});
