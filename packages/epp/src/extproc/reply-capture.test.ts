import { expect, test } from "bun:test";
import { ReplyCapture } from "./reply-capture.ts";

const capture = (...parts: string[]) => {
  const c = new ReplyCapture();
  for (const p of parts) c.add(new TextEncoder().encode(p));
  return c.message();
};
const sse = (...chunks: object[]) => chunks.map((c) => `data: ${JSON.stringify(c)}\n\n`).join("") + "data: [DONE]\n\n";

test("a JSON chat completion's single message is the reply", () => {
  expect(capture(JSON.stringify({ choices: [{ index: 0, message: { role: "assistant", content: "Hi there." } }] })))
    .toEqual({ role: "assistant", content: "Hi there." });
});

test("a stream's deltas are joined, across body chunks cut anywhere", () => {
  const body = sse({ choices: [{ index: 0, delta: { role: "assistant", content: "" } }] }, { choices: [{ index: 0, delta: { content: "Hel" } }] },
    { choices: [{ index: 0, delta: { content: "lo 日本" } }] }, { choices: [], usage: { prompt_tokens: 3 } });
  const bytes = new TextEncoder().encode(body);
  const c = new ReplyCapture();
  for (let i = 0; i < bytes.length; i += 7) c.add(bytes.subarray(i, i + 7));
  expect(c.message()).toEqual({ role: "assistant", content: "Hello 日本" });
});

test("tool calls, several choices, an unreadable or an empty body give nothing to warm with", () => {
  expect(capture(sse({ choices: [{ index: 0, delta: { tool_calls: [{ index: 0, function: { name: "f" } }] } }] }))).toBeUndefined();
  expect(capture(JSON.stringify({ choices: [{ message: { content: "a" } }, { message: { content: "b" } }] }))).toBeUndefined();
  expect(capture(sse({ choices: [{ index: 1, delta: { content: "x" } }] }))).toBeUndefined();
  expect(capture("{not json")).toBeUndefined();
  expect(capture()).toBeUndefined();
});

test("a reply over the bound is not kept, and says so as it passes the bound", () => {
  expect(capture(JSON.stringify({ choices: [{ message: { content: "x".repeat(2 << 20) } }] }))).toBeUndefined();
  const c = new ReplyCapture();
  c.add(new Uint8Array(1 << 20));
  expect(c.overflowed).toBe(false);
  c.add(new Uint8Array(1));
  expect(c.overflowed).toBe(true);
});
