// Replies to /v1/messages as vLLM's Anthropic server writes them (serving.py: messages_full_converter for a JSON
// message, message_stream_converter for the event stream), read as the chat message the next request makes of them.
import { beforeAll, describe, expect, test } from "bun:test";
import { encodeJob, nextTurnJob, type TokenizeJob } from "../job";
import { createPreprocessor } from "../preprocessor";
import type { Preprocessor } from "../types";
import { qwen3TokenizerDir } from "../../test/qwen3-fixture";
import { readChatReply } from "./chat-reply";
import { readBody } from "./read-body";

const utf8 = (s: string) => new TextEncoder().encode(s);
const read = (text: string) => readChatReply(utf8(text));

const thinking = { type: "thinking", thinking: "Read it first.", signature: "9f2c" };
const text = { type: "text", text: "Let me look." };
const toolUse = { type: "tool_use", id: "chatcmpl-tool-1", name: "read_file", input: { path: "main.ts", lines: [1, 20] } };
const message = (content: object[], stop_reason: string | null) =>
  JSON.stringify({ id: "chatcmpl-1", type: "message", role: "assistant", content, model: "qwen3", stop_reason, stop_sequence: null, usage: { input_tokens: 9, output_tokens: 7 } });

/** vLLM's event stream: each event named on its own line, its data the event's JSON. */
const stream = (...events: object[]) => events.map((e) => `event: ${(e as { type: string }).type}\ndata: ${JSON.stringify(e)}\n\n`).join("");
const start = { type: "message_start", message: { id: "chatcmpl-1", type: "message", role: "assistant", content: [], model: "qwen3", stop_reason: null, stop_sequence: null, usage: { input_tokens: 9, output_tokens: 0 } } };
const delta = (index: number, d: object) => ({ type: "content_block_delta", index, delta: d });
const blockStart = (index: number, content_block: object) => ({ type: "content_block_start", index, content_block });
const stop = (index: number) => ({ type: "content_block_stop", index });
const end = (stop_reason: string | null) => ({ type: "message_delta", delta: { stop_reason }, usage: { input_tokens: 9, output_tokens: 7 } });
const messageStop = { type: "message_stop" };
const streamed = (stopReason: string | null, ...tail: object[]) => [
  start,
  blockStart(0, { type: "thinking", thinking: "" }), delta(0, { type: "thinking_delta", thinking: "Read it " }), delta(0, { type: "thinking_delta", thinking: "first." }),
  delta(0, { type: "signature_delta", signature: "9f2c" }), stop(0),
  blockStart(1, { type: "text", text: "" }), delta(1, { type: "text_delta", text: "Let me" }), delta(1, { type: "text_delta", text: " look." }), stop(1),
  blockStart(2, { type: "tool_use", id: "chatcmpl-tool-1", name: "read_file", input: {} }),
  delta(2, { type: "input_json_delta", partial_json: '{"path": "main.ts", ' }), delta(2, { type: "input_json_delta", partial_json: '"lines": [1, 20]}' }), stop(2),
  end(stopReason), ...tail,
];

// What the next request's conversion makes of the assistant message the client sends back (thinking, text, tool_use).
const converted = {
  role: "assistant", reasoning: "Read it first.", content: "Let me look.",
  tool_calls: [{ id: "chatcmpl-tool-1", type: "function", function: { name: "read_file", arguments: '{"path": "main.ts", "lines": [1, 20]}' } }],
};

describe("a /v1/messages reply", () => {
  test("a JSON message's blocks become the assistant message its next request converts them to", () => {
    expect(read(message([thinking, text, toolUse], "tool_use"))).toEqual(converted);
    expect(read(message([text], "end_turn"))).toEqual({ role: "assistant", content: "Let me look." });
    expect(read(message([text], "max_tokens"))).toEqual({ role: "assistant", content: "Let me look." });
  });

  test("a stream's blocks are joined from their deltas, a tool's input parsed from its JSON pieces", () => {
    expect(read(stream(...streamed("tool_use", messageStop)))).toEqual(converted);
  });

  test("nothing to warm with: no stop reason (aborted), a call cut by the token limit, an error event, a stream cut before message_stop, no text", () => {
    expect(read(message([text], null))).toBeUndefined();
    expect(read(message([text, toolUse], "max_tokens"))).toBeUndefined();
    // An input that is no object, a float among them (read as Python reads it, an object here).
    expect(read(message([text, { ...toolUse, input: "@" }], "tool_use").replace('"@"', "1.0"))).toBeUndefined();
    expect(read(message([thinking], "end_turn"))).toBeUndefined();
    expect(read(message([], "end_turn"))).toBeUndefined();
    expect(read(stream(...streamed(null, messageStop)))).toBeUndefined();
    expect(read(stream(...streamed("tool_use")))).toBeUndefined();
    const error = { type: "error", error: { type: "internal_error", message: "engine dead" } };
    expect(read(stream(...streamed("tool_use", error, messageStop)))).toBeUndefined();
    // A tool input whose JSON does not parse is no input the client can send back.
    expect(read(stream(start, blockStart(0, { type: "tool_use", id: "t", name: "f", input: {} }), delta(0, { type: "input_json_delta", partial_json: '{"a": ' }), stop(0), end("tool_use"), messageStop))).toBeUndefined();
  });
});

describe("the next turn warmed from a Messages reply is the next request's prefix (Qwen3)", () => {
  let pre: Preprocessor;
  beforeAll(async () => {
    pre = createPreprocessor({ tokenizerDir: await qwen3TokenizerDir() });
  }, 60_000);
  const job = (body: object) => readBody({ body: utf8(JSON.stringify(body)), path: "/v1/messages" }).job as TokenizeJob;

  test("after a tool call, everything up to the tool result's text is what the warm tokenized", () => {
    const first = { model: "m", max_tokens: 256, system: "You are a coding agent.", messages: [{ role: "user", content: "Open main.ts" }] };
    const reply = readChatReply(utf8(stream(...streamed("tool_use", messageStop))));
    const warm = nextTurnJob(job(first) as Extract<TokenizeJob, { kind: "chat" }>, reply!, pre)!;
    const next = {
      ...first,
      messages: [
        ...first.messages,
        { role: "assistant", content: [thinking, text, toolUse] },
        { role: "user", content: [{ type: "tool_result", tool_use_id: "chatcmpl-tool-1", content: "console.log(1)" }] },
      ],
    };
    const warmIds = encodeJob(pre, warm);
    const nextIds = encodeJob(pre, job(next));
    let shared = 0;
    while (shared < warmIds.length && warmIds[shared] === nextIds[shared]) shared++;
    const known = pre.decode([...nextIds.subarray(0, shared)]);
    // The reply as the client sends it back (its thinking too: Qwen3 renders it after the last user message), up to
    // the tool result's opening; only the result's text is new.
    expect(known).toContain("<think>\nRead it first.\n</think>\n\nLet me look.");
    expect(known.endsWith("<|im_start|>user\n<tool_response>")).toBe(true);
    expect(pre.decode([...nextIds.subarray(shared)]).trimStart().startsWith("console.log(1)")).toBe(true);
  });

  // vLLM reads the next request's tool_use input with Python's json, which keeps `1.0` and `1e5` floats and every
  // digit of an integer past 2^53, and prints the call's arguments from it: the warm reads the reply's input so too.
  test("a tool call's input keeps Python's numbers (1.0, 1e5, an integer past 2^53), as a JSON message or a stream", () => {
    const input = '{"scale": 1.0, "id": 9007199254740993, "limit": 1e5}';
    const call = { type: "tool_use", id: "chatcmpl-tool-1", name: "fetch", input: "@input" };
    const withInput = (o: object) => JSON.stringify(o).replace('"@input"', input);
    const first = { model: "m", max_tokens: 256, messages: [{ role: "user", content: "Fetch it" }] };
    const next = withInput({
      ...first,
      messages: [...first.messages, { role: "assistant", content: [text, call] }, { role: "user", content: [{ type: "tool_result", tool_use_id: call.id, content: "fetched" }] }],
    });
    const nextIds = encodeJob(pre, readBody({ body: utf8(next), path: "/v1/messages" }).job as TokenizeJob);
    const replies = {
      json: withInput(JSON.parse(message([text, call], "tool_use"))),
      stream: stream(
        start, blockStart(0, text), stop(0), blockStart(1, { ...call, input: {} }),
        delta(1, { type: "input_json_delta", partial_json: input.slice(0, 20) }), delta(1, { type: "input_json_delta", partial_json: input.slice(20) }), stop(1),
        end("tool_use"), messageStop,
      ),
      // A server that sends the whole input with the block's opening.
      opening: stream(start, blockStart(0, text), stop(0), blockStart(1, call), stop(1), end("tool_use"), messageStop).replace('"@input"', input),
    };
    for (const [kind, body] of Object.entries(replies)) {
      const warmIds = encodeJob(pre, nextTurnJob(job(first) as Extract<TokenizeJob, { kind: "chat" }>, read(body)!, pre)!);
      let shared = 0;
      while (shared < warmIds.length && warmIds[shared] === nextIds[shared]) shared++;
      const known = pre.decode([...nextIds.subarray(0, shared)]);
      expect({ kind, known }).toEqual({ kind, known: expect.stringContaining('"scale": 1.0, "id": 9007199254740993, "limit": 100000.0') });
      expect({ kind, end: known.endsWith("<|im_start|>user\n<tool_response>") }).toEqual({ kind, end: true });
    }
  });
});
