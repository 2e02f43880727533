import { expect, test } from "bun:test";
import { readChatReply } from "./chat-reply";

const read = (text: string) => readChatReply(new TextEncoder().encode(text));
const events = (...chunks: object[]) => chunks.map((c) => `data: ${JSON.stringify(c)}\n\n`).join("");
const sse = (...chunks: object[]) => events(...chunks) + "data: [DONE]\n\n";
// vLLM's chunks: the role first with empty content, the text deltas, the finish reason on the last delta, a
// usage-only chunk (stream_options.include_usage).
const head = { id: "chatcmpl-1", object: "chat.completion.chunk", created: 1, model: "qwen3" };
const delta = (d: object, finish_reason: string | null = null) => ({ ...head, choices: [{ index: 0, delta: d, logprobs: null, finish_reason }] });
const first = delta({ role: "assistant", content: "" });
const usage = { ...head, choices: [], usage: { prompt_tokens: 3, total_tokens: 5, completion_tokens: 2 } };
const json = (content: string | null, finish_reason: string | null) =>
  JSON.stringify({ object: "chat.completion", choices: [{ index: 0, message: { role: "assistant", content, tool_calls: [] }, logprobs: null, finish_reason }] });

test("a JSON chat completion's single message is the reply", () => {
  expect(read(json("Hi there.", "stop"))).toEqual({ role: "assistant", content: "Hi there." });
});

test("a stream's deltas are joined", () => {
  const body = sse(first, delta({ content: "Hel" }), delta({ content: "lo 日本" }, "stop"), usage);
  expect(read(body)).toEqual({ role: "assistant", content: "Hello 日本" });
});

test("a stream that ends in an error gives nothing to warm with: the text before it is no reply", () => {
  // vLLM, on an exception mid-stream: an error chunk in place of the next delta, then [DONE].
  const error = { error: { message: "engine dead", type: "InternalServerError", param: null, code: 500 } };
  expect(read(sse(first, delta({ content: "Hel" }), error))).toBeUndefined();
  expect(read(sse(first, delta({ content: "Hel" }, "stop"), error))).toBeUndefined();
  // An older vLLM's: the error response itself as the chunk.
  expect(read(sse(first, delta({ content: "Hel" }, "stop"), { object: "error", message: "engine dead", type: "InternalServerError", param: null, code: 500 }))).toBeUndefined();
});

test("a stream cut before [DONE], or whose choice never finished, gives nothing to warm with", () => {
  expect(read(events(first, delta({ content: "Hello" }, "stop"), usage))).toBeUndefined();
  expect(read(sse(first, delta({ content: "Hello" }), usage))).toBeUndefined();
  expect(read(json("Hello", null))).toBeUndefined();
});

test("a reply that stopped or ran out of tokens warms; one aborted or failed does not", () => {
  for (const finish of ["stop", "length"]) {
    expect(read(sse(first, delta({ content: "Hello" }, finish), usage))).toEqual({ role: "assistant", content: "Hello" });
    expect(read(json("Hello", finish))).toEqual({ role: "assistant", content: "Hello" });
  }
  for (const finish of ["abort", "error"]) {
    expect(read(sse(first, delta({ content: "Hello" }, finish), usage))).toBeUndefined();
    expect(read(json("Hello", finish))).toBeUndefined();
  }
});

test("an empty reply gives nothing to warm with, as JSON or as a stream", () => {
  expect(read(json("", "stop"))).toBeUndefined();
  expect(read(json(null, "stop"))).toBeUndefined();
  expect(read(sse(first, delta({ content: "" }, "stop"), usage))).toBeUndefined();
});

test("a stream's finished tool calls are joined by index: id, type and name from a call's first delta, its arguments in pieces", () => {
  const body = sse(first,
    delta({ tool_calls: [{ index: 0, id: "chatcmpl-tool-a", type: "function", function: { name: "get_weather" } }] }),
    delta({ tool_calls: [{ index: 0, function: { arguments: '{"city": "' } }] }),
    delta({ tool_calls: [{ index: 0, function: { arguments: 'Paris"}' } }] }),
    delta({ tool_calls: [{ index: 1, id: "chatcmpl-tool-b", type: "function", function: { name: "get_time", arguments: "" } }] }),
    delta({ tool_calls: [{ index: 1, function: { arguments: '{"tz": "CET"}' } }] }, "tool_calls"),
    usage);
  expect(read(body)).toEqual({ role: "assistant",
    content: "", tool_calls: [
      { id: "chatcmpl-tool-a", type: "function", function: { name: "get_weather", arguments: '{"city": "Paris"}' } },
      { id: "chatcmpl-tool-b", type: "function", function: { name: "get_time", arguments: '{"tz": "CET"}' } },
    ],
  });
  // Text before the calls is kept with them.
  const said = sse(first, delta({ content: "Let me check." }), delta({ tool_calls: [{ index: 0, id: "t", type: "function", function: { name: "f", arguments: "{}" } }] }, "tool_calls"));
  expect(read(said)).toEqual({ role: "assistant", content: "Let me check.", tool_calls: [{ id: "t", type: "function", function: { name: "f", arguments: "{}" } }] });
  // Not calls cut by the token limit mid-arguments, aborted, failed, or never finished.
  const cut = delta({ tool_calls: [{ index: 0, id: "t", type: "function", function: { name: "f", arguments: '{"a": ' } }] });
  for (const finish of ["length", "abort", "error"]) expect(read(sse(first, cut, delta({}, finish), usage))).toBeUndefined();
  expect(read(sse(first, cut, usage))).toBeUndefined();
});

test("a JSON reply's tool calls are taken as sent, its null content too; a named tool's calls finish with stop", () => {
  const calls = [{ id: "chatcmpl-tool-a", type: "function", function: { name: "get_weather", arguments: '{"city": "Paris"}' } }];
  for (const finish of ["tool_calls", "stop"]) {
    const body = JSON.stringify({ choices: [{ index: 0, message: { role: "assistant", content: null, tool_calls: calls }, finish_reason: finish }] });
    expect(read(body)).toEqual({ role: "assistant", content: null, tool_calls: calls });
  }
});

test("several choices, a Responses reply, an unreadable or an empty body give nothing to warm with", () => {
  expect(read(JSON.stringify({ choices: [{ message: { content: "a" }, finish_reason: "stop" }, { message: { content: "b" }, finish_reason: "stop" }] }))).toBeUndefined();
  expect(read(sse({ choices: [{ index: 1, delta: { content: "x" }, finish_reason: "stop" }] }))).toBeUndefined();
  expect(read(JSON.stringify({ object: "response", output: [{ type: "message", content: [{ type: "output_text", text: "a" }] }] }))).toBeUndefined();
  expect(read("{not json")).toBeUndefined();
  expect(read("")).toBeUndefined();
});
