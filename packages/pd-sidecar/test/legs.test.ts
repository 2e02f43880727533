import { describe, expect, test } from "bun:test";
import { decodeBody, prefillBody, prefillOutcome } from "../src/index.ts";
import { pickPrefiller, prefillerCandidates } from "../src/prefiller-header.ts";
import { isHostPort } from "../src/prefiller-header.ts";
import { SPLIT_APIS } from "../src/apis.ts";
import { rewriteJson, rewriteSse } from "../src/usage-rewrite.ts";

const KV_PREFILL = { do_remote_decode: true, do_remote_prefill: false, remote_engine_id: null, remote_block_ids: null, remote_host: null, remote_port: null };
const CHAT = SPLIT_APIS["/v1/chat/completions"];

describe("the two legs of a disaggregated request", () => {
  test("the prefill leg asks for one token, a JSON answer and a remote decode, keeping the rest of the body", () => {
    const client = { model: "m", messages: [{ role: "user", content: "hi" }], max_completion_tokens: 50, min_tokens: 10, stream: true, stream_options: { include_usage: true }, temperature: 0.5 };
    expect(prefillBody(client, "/v1/chat/completions")).toEqual({
      model: "m", messages: [{ role: "user", content: "hi" }], temperature: 0.5, stream: false, max_tokens: 1, max_completion_tokens: 1,
      kv_transfer_params: KV_PREFILL,
    });
    expect(prefillBody({ prompt: "x", max_tokens: 9 }, "/v1/completions")).not.toHaveProperty("max_completion_tokens");
    expect(client.stream).toBe(true); // the client's body is left as it was, for the decode leg
  });

  test("the decode leg is the client's body with the prefill's transfer parameters", () => {
    const kv = { do_remote_prefill: true, remote_block_ids: [[1, 2]], remote_engine_id: "e", remote_request_id: "r", remote_host: "10.0.0.1", remote_port: 5600 };
    expect(decodeBody({ prompt: "x", stream: true }, kv)).toEqual({ prompt: "x", stream: true, kv_transfer_params: kv });
    expect(prefillOutcome({ kv_transfer_params: kv, usage: { prompt_tokens_details: { cached_tokens: 32 } } }, "/v1/completions")).toEqual({ kvTransferParams: kv, cachedTokens: 32 });
    // vLLM writes prompt_tokens_details null when nothing was cached.
    expect(prefillOutcome({ usage: { prompt_tokens_details: null } }, "/v1/chat/completions")).toEqual({ kvTransferParams: null, cachedTokens: 0 });
  });

  test("each API's prefill leg caps its own limits: Responses' max_output_tokens, Messages' max_tokens, generate's sampling_params", () => {
    const responses = { model: "m", input: "hi", instructions: "be brief", max_output_tokens: 50, stream: true, stream_options: { include_obfuscation: false } };
    expect(prefillBody(responses, "/v1/responses")).toEqual({ model: "m", input: "hi", instructions: "be brief", max_output_tokens: 1, stream: false, kv_transfer_params: KV_PREFILL });
    // A Responses request without a limit still asks for one token.
    expect(prefillBody({ input: "hi" }, "/v1/responses")).toEqual({ input: "hi", max_output_tokens: 1, stream: false, kv_transfer_params: KV_PREFILL });
    const messages = { model: "m", system: "s", messages: [{ role: "user", content: "hi" }], max_tokens: 50, stream: true };
    expect(prefillBody(messages, "/v1/messages")).toEqual({ ...messages, max_tokens: 1, stream: false, kv_transfer_params: KV_PREFILL });
    const generate = { model: "m", token_ids: [1, 2, 3], sampling_params: { max_tokens: 50, min_tokens: 5, temperature: 0.7 }, stream: true };
    expect(prefillBody(generate, "/inference/v1/generate")).toEqual({ model: "m", token_ids: [1, 2, 3], sampling_params: { max_tokens: 1, temperature: 0.7 }, stream: false, kv_transfer_params: KV_PREFILL });
    expect(generate.sampling_params.max_tokens).toBe(50); // the client's, for the decode leg
    expect(prefillBody({ token_ids: [1] }, "/inference/v1/generate")).toEqual({ token_ids: [1], sampling_params: { max_tokens: 1 }, stream: false, kv_transfer_params: KV_PREFILL });
  });

  test("each API's prefill answer tells its cached tokens in its own usage field; generate's has none", () => {
    expect(prefillOutcome({ kv_transfer_params: {}, usage: { input_tokens: 80, input_tokens_details: { cached_tokens: 48 } } }, "/v1/responses").cachedTokens).toBe(48);
    expect(prefillOutcome({ usage: { input_tokens: 80, cache_read_input_tokens: 16 } }, "/v1/messages").cachedTokens).toBe(16);
    expect(prefillOutcome({ choices: [{ index: 0, token_ids: [7] }], kv_transfer_params: { x: 1 } }, "/inference/v1/generate")).toEqual({ kvTransferParams: { x: 1 }, cachedTokens: 0 });
  });

  test("with sampling a candidate is drawn uniformly; without, the first; blank entries are none", () => {
    const list = prefillerCandidates(" 10.0.0.7:8000, ,10.0.0.8:8000 ,");
    expect(list).toEqual(["10.0.0.7:8000", "10.0.0.8:8000"]);
    expect(pickPrefiller(list, false, () => 0.99)).toBe("10.0.0.7:8000");
    expect(pickPrefiller(list, true, () => 0.49)).toBe("10.0.0.7:8000");
    expect(pickPrefiller(list, true, () => 0.5)).toBe("10.0.0.8:8000");
    expect(pickPrefiller(list, true, () => 0.999999)).toBe("10.0.0.8:8000");
    expect(pickPrefiller([], true)).toBeNull();
  });

  test("x-prefiller-host-port names the first of its candidates; absent or blank means no disaggregation", () => {
    const first = (value: string | null) => pickPrefiller(prefillerCandidates(value), false);
    expect(first("10.0.0.7:8000")).toBe("10.0.0.7:8000");
    expect(first(" 10.0.0.7:8000 , 10.0.0.8:8000")).toBe("10.0.0.7:8000");
    expect(first(null)).toBeNull();
    expect(first(" ")).toBeNull();
    expect(isHostPort("[fd00::1]:8000")).toBe(true);
    for (const bad of ["10.0.0.7", "10.0.0.7:0", "http://10.0.0.7:8000", "a@b:1", "10.0.0.7:8000/x"]) expect(isHostPort(bad)).toBe(false);
  });
});

describe("the client is told the prefill's cached tokens", () => {
  test("in a JSON answer, creating prompt_tokens_details when vLLM left it null", () => {
    const body = JSON.stringify({ id: "x", usage: { prompt_tokens: 100, completion_tokens: 3, prompt_tokens_details: null } });
    expect(JSON.parse(rewriteJson(body, 32, CHAT)).usage.prompt_tokens_details).toEqual({ cached_tokens: 32 });
    expect(rewriteJson("not json", 1, CHAT)).toBe("not json");
    expect(rewriteJson('{"error":{"message":"x"}}', 1, CHAT)).toBe('{"error":{"message":"x"}}');
  });

  test("in a Responses or Messages answer, in its own field, never as prompt_tokens_details", () => {
    const responses = JSON.parse(rewriteJson(JSON.stringify({ object: "response", usage: { input_tokens: 80, input_tokens_details: { cached_tokens: 79 }, output_tokens: 2 } }), 32, SPLIT_APIS["/v1/responses"]));
    expect(responses.usage).toEqual({ input_tokens: 80, input_tokens_details: { cached_tokens: 32 }, output_tokens: 2 });
    // Anthropic's input_tokens leaves out the cache reads: it is recomputed so that the two still make the prompt,
    // whether the decode worker's vLLM wrote no cache field (input_tokens the whole prompt) or its own cache reads.
    const messages = JSON.parse(rewriteJson(JSON.stringify({ type: "message", usage: { input_tokens: 80, output_tokens: 2 } }), 16, SPLIT_APIS["/v1/messages"]));
    expect(messages.usage).toEqual({ input_tokens: 64, output_tokens: 2, cache_read_input_tokens: 16 });
    const read = { input_tokens: 1, output_tokens: 2, cache_read_input_tokens: 79, cache_creation_input_tokens: 0 };
    expect(JSON.parse(rewriteJson(JSON.stringify({ usage: read }), 16, SPLIT_APIS["/v1/messages"])).usage).toEqual({ ...read, input_tokens: 64, cache_read_input_tokens: 16 });
    // A bare delta without input_tokens gets the count alone.
    expect(JSON.parse(rewriteJson(JSON.stringify({ type: "message_delta", usage: { output_tokens: 2 } }), 16, SPLIT_APIS["/v1/messages"])).usage).toEqual({ output_tokens: 2, cache_read_input_tokens: 16 });
    // Streamed, the usage is inside the event's object: Responses' response.completed, Anthropic's message_start.
    const completed = JSON.stringify({ type: "response.completed", response: { usage: { input_tokens: 80, input_tokens_details: { cached_tokens: 79 } } } });
    expect(JSON.parse(rewriteJson(completed, 8, SPLIT_APIS["/v1/responses"])).response.usage.input_tokens_details).toEqual({ cached_tokens: 8 });
    const start = JSON.stringify({ type: "message_start", message: { usage: { input_tokens: 80, output_tokens: 0 } } });
    expect(JSON.parse(rewriteJson(start, 8, SPLIT_APIS["/v1/messages"])).message.usage).toEqual({ input_tokens: 72, output_tokens: 0, cache_read_input_tokens: 8 });
  });

  test("in an SSE stream split anywhere, touching only the usage chunk", async () => {
    const lines = [
      'data: {"choices":[{"text":" the"}]}', "",
      'data: {"choices":[],"usage":{"prompt_tokens":100,"prompt_tokens_details":{"cached_tokens":99}}}', "",
      "data: [DONE]", "", "",
    ].join("\n");
    const bytes = new TextEncoder().encode(lines);
    for (const cut of [1, 7, 40, 90, bytes.length - 3]) {
      const body = new ReadableStream<Uint8Array>({
        start(c) {
          c.enqueue(bytes.slice(0, cut));
          c.enqueue(bytes.slice(cut));
          c.close();
        },
      });
      const out = await new Response(rewriteSse(body, 48, CHAT)).text();
      expect(out).toBe(lines.replace('"cached_tokens":99', '"cached_tokens":48'));
    }
  });
});
