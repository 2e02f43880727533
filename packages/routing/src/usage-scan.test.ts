import { expect, test } from "bun:test";
import { UsageScan } from "./usage-scan.ts";

const scan = (...chunks: string[]) => {
  const s = new UsageScan();
  for (const c of chunks) s.add(new TextEncoder().encode(c));
  return s;
};

test("a chat completion's usage, JSON or streamed, a count split between chunks read whole; the last usage of a stream counts", () => {
  expect(scan('{"choices":[{"message":{"content":"say \\"prompt_tokens\\": 9"}}],"usage":{"prompt_tokens":12,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":8}}}').usage())
    .toEqual({ promptTokens: 12, completionTokens: 5, cachedTokens: 8 });
  // vLLM's continuous_usage_stats: every chunk counts up; the final usage chunk (no choices) has the totals.
  const s = scan(
    'data: {"choices":[{"delta":{"content":"a"}}],"usage":{"prompt_tokens":40,"completion_tokens":1}}\n\n',
    'data: {"choices":[],"usage":{"prompt_tokens":40,"completion_tokens":3', '7,"prompt_tokens_details":{"cached_tokens":32}}}\n\ndata: [DONE]\n\n',
  );
  expect(s.usage()).toEqual({ promptTokens: 40, completionTokens: 37, cachedTokens: 32 });
  expect(s.finalUsage).toBe(true);
  expect(scan('{"choices":[{"text":"x"}]}').usage()).toEqual({ promptTokens: undefined, completionTokens: undefined, cachedTokens: undefined });
});

test("the Responses and Messages APIs' names: input/output tokens, input_tokens_details' cached_tokens, cache_read_input_tokens", () => {
  const responses = scan(
    'event: response.created\ndata: {"type":"response.created","response":{"usage":null}}\n\n',
    'event: response.completed\ndata: {"type":"response.completed","response":{"usage":{"input_tokens":31,"input_tokens_details":{"cached_tokens":16},"output_tokens":9,"total_tokens":40}}}\n\n',
  );
  expect(responses.usage()).toEqual({ promptTokens: 31, completionTokens: 9, cachedTokens: 16 });
  // message_start's usage has the input (and an output of 1 so far), message_delta's the final output.
  const messages = scan(
    'event: message_start\ndata: {"type":"message_start","message":{"usage":{"input_tokens":25,"cache_read_input_tokens":16,"cache_creation_input_tokens":0,"output_tokens":1}}}\n\n',
    'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":15}}\n\n',
  );
  expect(messages.usage()).toEqual({ promptTokens: 25, completionTokens: 15, cachedTokens: 16 });
  expect(messages.field("prompt_tokens")).toBeUndefined();
});
