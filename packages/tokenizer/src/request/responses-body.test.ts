// /v1/responses bodies become the chat vLLM renders for them (vllm/entrypoints/openai/responses/utils.py,
// construct_input_messages), and the other request fields vLLM reads before tokenizing.
import { describe, expect, test } from "bun:test";
import { PyFloat } from "../py-values";
import { BadRequest, parseBodyBytes } from "./openai-body";
import { readBody } from "./read-body";

const bytes = (v: unknown) => new TextEncoder().encode(typeof v === "string" ? v : JSON.stringify(v));

describe("/v1/responses bodies", () => {
  test("previous_response_id: the prompt starts with history stored on the worker, so it is routed by load, saying why", () => {
    const body = bytes({ model: "m", previous_response_id: "resp_1", input: [{ role: "user", content: "and now?" }] });
    expect(parseBodyBytes(body, "/v1/responses")).toEqual({
      model: "m", input: { kind: "none" }, unrendered: { cause: "stored_history", message: expect.stringContaining("previous_response_id") },
    });
    expect(readBody({ body, path: "/v1/responses" })).toEqual({
      fields: { model: "m", kind: "none", unrendered: { cause: "stored_history", message: expect.any(String) }, cacheSalt: undefined, batchedPrompts: undefined },
      job: new Uint32Array(0),
    });
    expect(parseBodyBytes(bytes({ previous_response_id: null, input: "hi" }), "/v1/responses").input.kind).toBe("chat");
    expect(() => parseBodyBytes(bytes({ previous_response_id: 1, input: "hi" }), "/v1/responses")).toThrow(BadRequest);
  });

  test("instructions become the system message and a text input the user message", () => {
    const input = parseBodyBytes(bytes({ model: "m", instructions: "Be brief.", input: "Hi" }), "/v1/responses").input;
    expect(input).toEqual({
      kind: "chat", messages: [{ role: "system", content: "Be brief." }, { role: "user", content: "Hi" }],
      addGenerationPrompt: true, continueFinalMessage: false,
    });
  });

  test("items: reasoning, tool calls and the answer merge into one assistant turn; outputs become tool turns", () => {
    const body = {
      input: [
        { type: "message", role: "user", content: [{ type: "input_text", text: "Weather in Oslo?" }] },
        { type: "reasoning", id: "rs_1", summary: [], content: [{ type: "reasoning_text", text: "Call the tool." }] },
        { type: "function_call", call_id: "c1", name: "get_weather", arguments: '{"city": "Oslo"}' },
        { type: "function_call_output", call_id: "c1", output: "3 C" },
        { type: "message", role: "assistant", status: "completed", content: [{ type: "output_text", text: "It is 3 C." }] },
      ],
      tools: [{ type: "function", name: "get_weather", description: "Forecast", parameters: { type: "object" } }, { type: "web_search" }],
    };
    const input = parseBodyBytes(bytes(body), "/v1/responses").input;
    expect(input).toEqual({
      kind: "chat",
      messages: [
        { type: "message", role: "user", content: [{ type: "input_text", text: "Weather in Oslo?" }] },
        { role: "assistant", reasoning: "Call the tool.", tool_calls: [{ id: "c1", type: "function", function: { name: "get_weather", arguments: '{"city": "Oslo"}' } }] },
        { role: "tool", content: "3 C", tool_call_id: "c1" },
        { role: "assistant", content: "It is 3 C." },
      ],
      tools: [{ type: "function", function: { name: "get_weather", description: "Forecast", parameters: { type: "object" } } }],
      addGenerationPrompt: true, continueFinalMessage: false,
    });
  });

  test("a final assistant message in progress is continued, not answered", () => {
    const body = { input: [{ role: "user", content: "Count" }, { type: "message", role: "assistant", status: "in_progress", content: [{ type: "output_text", text: "1, 2," }] }] };
    expect(parseBodyBytes(bytes(body), "/v1/responses").input).toMatchObject({ addGenerationPrompt: false, continueFinalMessage: true });
  });

  test("the path names a Responses body; without one naming an API, an input of items or a Responses-only field marks it; an embeddings body is not one", () => {
    expect(parseBodyBytes(bytes({ input: [{ role: "user", content: "x" }] })).input.kind).toBe("chat");
    expect(parseBodyBytes(bytes({ input: "x", instructions: "y" })).input.kind).toBe("chat");
    expect(parseBodyBytes(bytes({ input: "x" })).input.kind).toBe("none");
    expect(parseBodyBytes(bytes({ input: ["a", "b"], encoding_format: "float" })).input.kind).toBe("none");
    expect(parseBodyBytes(bytes({ input: "x" }), "/v1/embeddings").input.kind).toBe("none");
    expect(parseBodyBytes(bytes({ input: "x" }), "/v1/responses?stream=true").input.kind).toBe("chat");
    expect(parseBodyBytes(bytes({ input: "x" }), "/llm/v1/responses/").input.kind).toBe("chat");
    // A path naming no API (a gateway that rewrites /openai to /v1) leaves it to the fields.
    expect(parseBodyBytes(bytes({ input: [{ role: "user", content: "x" }] }), "/openai/responses").input.kind).toBe("chat");
    expect(parseBodyBytes(bytes({ input: "x" }), "/openai/embeddings").input.kind).toBe("none");
  });

  test("what vLLM refuses is a bad request", () => {
    const refused = (body: unknown) => () => parseBodyBytes(bytes(body), "/v1/responses");
    expect(refused({ input: [{ type: "reasoning", encrypted_content: "x", summary: [] }] })).toThrow(/Encrypted content/);
    expect(refused({ input: [{ type: "mystery" }] })).toThrow(/Unsupported input item type: mystery/);
    expect(refused({ input: 3 })).toThrow(BadRequest);
  });
});

describe("request fields read before tokenizing", () => {
  const chat = [{ role: "user", content: "x" }];

  test("add_special_tokens reaches the tokenizer for text and chat prompts", () => {
    expect(parseBodyBytes(bytes({ prompt: "hi", add_special_tokens: false })).input).toEqual({ kind: "prompt", text: "hi", addSpecialTokens: false });
    expect(parseBodyBytes(bytes({ messages: chat, add_special_tokens: true })).input).toMatchObject({ kind: "chat", addSpecialTokens: true });
    expect(() => parseBodyBytes(bytes({ prompt: "hi", add_special_tokens: "yes" }))).toThrow(/add_special_tokens/);
  });

  test("truncate_prompt_tokens cuts a token prompt as vLLM does (the last k; the first k on the right side)", () => {
    expect(parseBodyBytes(bytes({ prompt: [1, 2, 3, 4, 5], truncate_prompt_tokens: 2 })).input).toEqual({ kind: "tokens", tokens: new Uint32Array([4, 5]) });
    expect(parseBodyBytes(bytes({ prompt: [[1, 2, 3], [4]], truncate_prompt_tokens: 2, truncation_side: "right" })).input).toEqual({ kind: "tokens", tokens: new Uint32Array([1, 2]) });
    expect(parseBodyBytes(bytes({ prompt: "hi", truncate_prompt_tokens: 3 })).input).toEqual({ kind: "prompt", text: "hi", truncatePromptTokens: 3 });
    expect(parseBodyBytes(bytes({ messages: chat, truncate_prompt_tokens: -1 })).input).toMatchObject({ truncatePromptTokens: -1 });
  });

  test("truncate_prompt_tokens vLLM would refuse is a bad request", () => {
    for (const k of [-2, 1.5, "3"]) expect(() => parseBodyBytes(bytes({ prompt: [1], truncate_prompt_tokens: k }))).toThrow(/truncate_prompt_tokens/);
    expect(() => parseBodyBytes(bytes({ prompt: "x", truncation_side: "middle" }))).toThrow(/truncation_side/);
  });

  test("numbers a chat template prints keep Python's float/int distinction (1.0 is not 1)", () => {
    const raw = '{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"minimum":1.0,"maximum":10}}}]}';
    const input = parseBodyBytes(bytes(raw)).input as { tools: { function: { parameters: { minimum: unknown; maximum: unknown } } }[] };
    expect(input.tools[0]!.function.parameters.minimum).toEqual(new PyFloat(1));
    expect(input.tools[0]!.function.parameters.maximum).toBe(10);
  });
});
