import { describe, expect, test } from "bun:test";
import { chosenPrefiller, decodeBody, prefillBody, prefillOutcome } from "../src/index.ts";
import { isHostPort } from "../src/prefiller-header.ts";
import { rewriteJson, rewriteSse } from "../src/usage-rewrite.ts";

describe("the two legs of a disaggregated request", () => {
  test("the prefill leg asks for one token, a JSON answer and a remote decode, keeping the rest of the body", () => {
    const client = { model: "m", messages: [{ role: "user", content: "hi" }], max_completion_tokens: 50, min_tokens: 10, stream: true, stream_options: { include_usage: true }, temperature: 0.5 };
    expect(prefillBody(client, "/v1/chat/completions")).toEqual({
      model: "m", messages: [{ role: "user", content: "hi" }], temperature: 0.5, stream: false, max_tokens: 1, max_completion_tokens: 1,
      kv_transfer_params: { do_remote_decode: true, do_remote_prefill: false, remote_engine_id: null, remote_block_ids: null, remote_host: null, remote_port: null },
    });
    expect(prefillBody({ prompt: "x", max_tokens: 9 }, "/v1/completions")).not.toHaveProperty("max_completion_tokens");
    expect(client.stream).toBe(true); // the client's body is left as it was, for the decode leg
  });

  test("the decode leg is the client's body with the prefill's transfer parameters", () => {
    const kv = { do_remote_prefill: true, remote_block_ids: [[1, 2]], remote_engine_id: "e", remote_request_id: "r", remote_host: "10.0.0.1", remote_port: 5600 };
    expect(decodeBody({ prompt: "x", stream: true }, kv)).toEqual({ prompt: "x", stream: true, kv_transfer_params: kv });
    expect(prefillOutcome({ kv_transfer_params: kv, usage: { prompt_tokens_details: { cached_tokens: 32 } } })).toEqual({ kvTransferParams: kv, cachedTokens: 32 });
    // vLLM writes prompt_tokens_details null when nothing was cached.
    expect(prefillOutcome({ usage: { prompt_tokens_details: null } })).toEqual({ kvTransferParams: null, cachedTokens: 0 });
  });

  test("x-prefiller-host-port names the first of its candidates; absent or blank means no disaggregation", () => {
    expect(chosenPrefiller("10.0.0.7:8000")).toBe("10.0.0.7:8000");
    expect(chosenPrefiller(" 10.0.0.7:8000 , 10.0.0.8:8000")).toBe("10.0.0.7:8000");
    expect(chosenPrefiller(null)).toBeNull();
    expect(chosenPrefiller(" ")).toBeNull();
    expect(isHostPort("[fd00::1]:8000")).toBe(true);
    for (const bad of ["10.0.0.7", "10.0.0.7:0", "http://10.0.0.7:8000", "a@b:1", "10.0.0.7:8000/x"]) expect(isHostPort(bad)).toBe(false);
  });
});

describe("the client is told the prefill's cached tokens", () => {
  test("in a JSON answer, creating prompt_tokens_details when vLLM left it null", () => {
    const body = JSON.stringify({ id: "x", usage: { prompt_tokens: 100, completion_tokens: 3, prompt_tokens_details: null } });
    expect(JSON.parse(rewriteJson(body, 32)).usage.prompt_tokens_details).toEqual({ cached_tokens: 32 });
    expect(rewriteJson("not json", 1)).toBe("not json");
    expect(rewriteJson('{"error":{"message":"x"}}', 1)).toBe('{"error":{"message":"x"}}');
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
      const out = await new Response(rewriteSse(body, 48)).text();
      expect(out).toBe(lines.replace('"cached_tokens":99', '"cached_tokens":48'));
    }
  });
});
