import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { byteFallbackEncode, byteFallbackRenderChat } from "@kv-epp/tokenizer";
import { startMockWorker, type MockWorker } from "../src/index.ts";
import { waitFor, LOOPBACK } from "@kv-epp/testkit";
import { post } from "./support.ts";

let w: MockWorker;
beforeAll(async () => {
  w = await startMockWorker({ listen: `${LOOPBACK}.2.5`, port: 0, kvEvents: `tcp://${LOOPBACK}.2.5:0`, speed: 0, blockSize: 16, dpSize: 2, model: "mock/model", logLevel: "silent" });
});
afterAll(() => w.close());

type ErrorBody = { error: { message: string; type: string; param: string | null; code: number } };

async function sse(res: Response): Promise<string[]> {
  expect(res.headers.get("content-type")).toContain("text/event-stream");
  const text = await res.text();
  return text.split("\n").filter((l) => l.startsWith("data: ")).map((l) => l.slice(6));
}

describe("OpenAI HTTP", () => {
  test("GET /health and GET /v1/models", async () => {
    expect((await fetch(`${w.url}/health`)).status).toBe(200);
    const models = (await (await fetch(`${w.url}/v1/models`)).json()) as { data: { id: string }[] };
    expect(models.data.map((m) => m.id)).toEqual(["mock/model"]);
  });

  test("a text completion is tokenized with the shared byte fallback and reports cached tokens on repeat", async () => {
    const prompt = "x".repeat(40); // 40 byte tokens: 2 full blocks of 16
    const body = { model: "mock/model", prompt, max_tokens: 3 };
    const headers = { "x-data-parallel-rank": "1" };
    const first = (await (await post(`${w.url}/v1/completions`, body, headers)).json()) as any;
    expect(first).toMatchObject({ object: "text_completion", model: "mock/model", choices: [{ index: 0, finish_reason: "length" }] });
    expect(first.usage).toEqual({ prompt_tokens: 40, completion_tokens: 3, total_tokens: 43, prompt_tokens_details: null });
    const again = (await (await post(`${w.url}/v1/completions`, body, headers)).json()) as any;
    expect(again.usage.prompt_tokens_details?.cached_tokens ?? 0).toBe(32);
    expect(w.ranks[1]!.cache.peekHitBlocks(byteFallbackEncode(prompt))).toBe(2);
  });

  test("a streamed usage chunk has prompt_tokens_details only when something was cached, as vLLM's exclude_none dump writes it", async () => {
    const body = { model: "mock/model", prompt: "s".repeat(40), max_tokens: 1, stream: true, stream_options: { include_usage: true } };
    const usageOf = async () => JSON.parse((await sse(await post(`${w.url}/v1/completions`, body, { "x-data-parallel-rank": "0" }))).at(-2)!).usage;
    const miss = await usageOf();
    expect(miss).toEqual({ prompt_tokens: 40, completion_tokens: 1, total_tokens: 41 });
    expect(await usageOf()).toEqual({ prompt_tokens: 40, completion_tokens: 1, total_tokens: 41, prompt_tokens_details: { cached_tokens: 32 } });
  });

  test("a list of prompts gets one choice per prompt", async () => {
    const res = (await (await post(`${w.url}/v1/completions`, { prompt: [[1, 2, 3], [4, 5]], max_tokens: 2 })).json()) as any;
    expect(res.choices.map((c: { index: number }) => c.index)).toEqual([0, 1]);
    expect(res.usage.prompt_tokens).toBe(5);
  });

  test("chat completions render messages like the EPP and stream SSE ending in [DONE]", async () => {
    const messages = [{ role: "system", content: "be brief" }, { role: "user", content: [{ type: "text", text: "hello" }] }];
    const expectTokens = byteFallbackEncode(byteFallbackRenderChat([messages[0]!, { role: "user", content: "hello" }])).length;
    const plain = (await (await post(`${w.url}/v1/chat/completions`, { messages, max_completion_tokens: 2 })).json()) as any;
    expect(plain.object).toBe("chat.completion");
    expect(plain.choices[0].message.role).toBe("assistant");
    expect(plain.usage.prompt_tokens).toBe(expectTokens);

    const data = await sse(await post(`${w.url}/v1/chat/completions`, { messages, max_tokens: 3, stream: true, stream_options: { include_usage: true } }));
    expect(data.at(-1)).toBe("[DONE]");
    const chunks = data.slice(0, -1).map((d) => JSON.parse(d));
    expect(chunks[0].choices[0].delta.role).toBe("assistant");
    expect(chunks.filter((c) => c.choices[0]?.delta?.content).length).toBe(3);
    expect(chunks.at(-2).choices[0].finish_reason).toBe("length");
    expect(chunks.at(-1).usage).toMatchObject({ prompt_tokens: expectTokens, completion_tokens: 3 });

    const completion = await sse(await post(`${w.url}/v1/completions`, { prompt: "hi", max_tokens: 2, stream: true }));
    expect(completion.length).toBe(3); // two tokens, no usage chunk unless asked, [DONE]
    expect(JSON.parse(completion[0]!).object).toBe("text_completion");
  });

  test("add_generation_prompt and continue_final_message shape the rendered prompt, as in vLLM", async () => {
    const messages = [{ role: "user", content: "finish this" }, { role: "assistant", content: "Once upon a" }];
    const tokensOf = async (extra: Record<string, unknown>) =>
      ((await (await post(`${w.url}/v1/chat/completions`, { messages, max_tokens: 1, ...extra })).json()) as any).usage.prompt_tokens;
    const rendered = (opts: Parameters<typeof byteFallbackRenderChat>[1]) => byteFallbackEncode(byteFallbackRenderChat(messages, opts)).length;
    expect(await tokensOf({})).toBe(rendered({}));
    expect(await tokensOf({ add_generation_prompt: false })).toBe(rendered({ addGenerationPrompt: false }));
    // The final assistant turn is left open: no end-of-turn after "Once upon a".
    expect(await tokensOf({ add_generation_prompt: false, continue_final_message: true })).toBe(rendered({ addGenerationPrompt: false }) - "<|im_end|>\n".length);
  });

  test("bad requests get 400 with an OpenAI error body naming the field", async () => {
    const cases: [string, string, string | null, Record<string, string>?][] = [
      ["/v1/completions", "{not json", null],
      ["/v1/completions", JSON.stringify({ max_tokens: 3 }), "prompt"],
      ["/v1/completions", JSON.stringify({ prompt: "x", max_tokens: 0 }), "max_tokens"],
      ["/v1/completions", JSON.stringify({ prompt: "x", max_tokens: 1e9 }), "max_tokens"],
      ["/v1/chat/completions", JSON.stringify({ messages: [{ role: "user", content: "x" }], max_completion_tokens: 1e9 }), "max_completion_tokens"],
      ["/v1/completions", JSON.stringify({ prompt: [1, -2] }), "prompt.1"],
      ["/v1/chat/completions", JSON.stringify({ messages: [] }), "messages"],
      ["/v1/chat/completions", JSON.stringify({ prompt: "x" }), "messages"],
      ["/v1/chat/completions", JSON.stringify({ messages: [{ role: "user", content: "x" }], continue_final_message: true }), "continue_final_message"],
      ["/v1/completions", JSON.stringify({ prompt: "x" }), "x-data-parallel-rank", { "x-data-parallel-rank": "2" }],
    ];
    for (const [path, body, param, headers] of cases) {
      const res = await fetch(`${w.url}${path}`, { method: "POST", body, headers: { "content-type": "application/json", ...headers } });
      expect(res.status).toBe(400);
      const err = ((await res.json()) as ErrorBody).error;
      expect(err).toMatchObject({ type: "BadRequestError", code: 400, param });
      expect(err.message.length).toBeGreaterThan(0);
    }
  });

  test("/metrics exposes vLLM names with model_name and engine labels", async () => {
    const text = await (await fetch(`${w.url}/metrics`)).text();
    for (const name of ["vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:gpu_cache_usage_perc", "vllm:kv_cache_usage_perc"]) {
      expect(text).toContain(`${name}{model_name="mock/model",engine="1"}`);
    }
    const hits = /vllm:prefix_cache_hits_total\{model_name="mock\/model",engine="1"\} (\d+)/.exec(text);
    expect(Number(hits?.[1])).toBeGreaterThanOrEqual(32);
    expect(text).toMatch(/vllm:prefix_cache_queries_total\{model_name="mock\/model",engine="0"\} \d+/);
    expect(text).toContain('vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",num_gpu_blocks="8192",num_cpu_blocks="None",engine="0"} 1');
    expect(text).toMatch(/vllm:time_to_first_token_seconds_count\{model_name="mock\/model",engine="1"\} [1-9]/);
    // No adapters served: no LoRA series, as vLLM without --enable-lora.
    expect(text).not.toContain("vllm:lora_requests_info");
  });
});

describe("vllm:lora_requests_info with --lora-modules", () => {
  test("recorded at engine steps as vLLM records it: no sample before the first step, the last step's state kept while idle", async () => {
    const lw = await startMockWorker({ listen: `${LOOPBACK}.2.5`, port: 0, kvEvents: `tcp://${LOOPBACK}.2.5:0`, speed: 0, blockSize: 16, loraModules: ["sql-lora", "chat-lora"], logLevel: "silent" });
    try {
      const series = async () => (await (await fetch(`${lw.url}/metrics`)).text()).split("\n").filter((l) => l.startsWith("vllm:lora_requests_info{"));
      // No step yet: no sample, however often it is scraped.
      expect(await series()).toEqual([]);
      expect(await series()).toEqual([]);
      const res = await post(`${lw.url}/v1/completions`, { model: "sql-lora", prompt: "x".repeat(40), max_tokens: 2 });
      expect(res.status).toBe(200);
      await res.json();
      // Idle again: the one state its steps recorded (the batch ran sql-lora, to the step that finished it) stays,
      // and a scrape records nothing (its time does not move).
      const after = await series();
      expect(after).toHaveLength(1);
      expect(after[0]).toMatch(/^vllm:lora_requests_info\{max_lora="2",running_lora_adapters="sql-lora",waiting_lora_adapters=""\} \S+$/);
      expect(await series()).toEqual(after);
    } finally {
      await lw.close();
    }
  });
});

describe("the role a chat's reply comes in (vLLM's --response-role)", () => {
  let model: MockWorker;
  beforeAll(async () => {
    model = await startMockWorker({ listen: `${LOOPBACK}.2.5`, port: 0, kvEvents: `tcp://${LOOPBACK}.2.5:0`, speed: 0, responseRole: "model", logLevel: "silent" });
  });
  afterAll(() => model.close());

  const roles = async (url: string, body: Record<string, unknown>) => {
    const json = (await (await post(`${url}/v1/chat/completions`, { ...body, max_tokens: 2 })).json()) as any;
    const chunks = (await sse(await post(`${url}/v1/chat/completions`, { ...body, max_tokens: 2, stream: true }))).slice(0, -1).map((d) => JSON.parse(d));
    // Only the first delta names the role, as vLLM streams it.
    expect(chunks.slice(1).every((c) => c.choices[0].delta.role === undefined)).toBe(true);
    return { json: json.choices[0].message.role, streamed: chunks[0].choices[0].delta.role };
  };
  const asked = [{ role: "user", content: "hello" }];
  const continued = [{ role: "user", content: "finish this" }, { role: "assistant", content: "Once upon a" }];

  test("after a generation prompt, asked for or by default, the reply comes in the configured role", async () => {
    expect(await roles(model.url, { messages: asked })).toEqual({ json: "model", streamed: "model" });
    expect(await roles(model.url, { messages: asked, add_generation_prompt: true })).toEqual({ json: "model", streamed: "model" });
    expect(await roles(w.url, { messages: asked })).toEqual({ json: "assistant", streamed: "assistant" });
  });

  test("without a generation prompt the reply takes the final message's own role, whatever the configured one", async () => {
    expect(await roles(model.url, { messages: continued, add_generation_prompt: false })).toEqual({ json: "assistant", streamed: "assistant" });
    expect(await roles(model.url, { messages: continued, add_generation_prompt: false, continue_final_message: true })).toEqual({ json: "assistant", streamed: "assistant" });
    expect(await roles(w.url, { messages: asked, add_generation_prompt: false })).toEqual({ json: "user", streamed: "user" });
  });
});

describe("engine", () => {
  test("requests beyond max-num-seqs wait, and an abandoned stream frees its slot", async () => {
    const slow = await startMockWorker({
      listen: `${LOOPBACK}.2.5`, port: 0, kvEvents: `tcp://${LOOPBACK}.2.5:0`, speed: 1, maxNumSeqs: 1, stepBaseMs: 20,
      blockSize: 16, logLevel: "silent",
    });
    try {
      const gauge = async (name: string) => {
        const m = new RegExp(`${name}\\{[^}]*\\} (\\d+)`).exec(await (await fetch(`${slow.url}/metrics`)).text());
        return Number(m?.[1]);
      };
      const long = await post(`${slow.url}/v1/completions`, { prompt: "a", max_tokens: 100_000, stream: true });
      const reader = long.body!.getReader();
      await reader.read(); // first token: it is running
      const queued = post(`${slow.url}/v1/completions`, { prompt: "b", max_tokens: 1 });
      await waitFor(async () => (await gauge("vllm:num_requests_waiting")) === 1, { message: "the second request to wait" });
      expect(await gauge("vllm:num_requests_running")).toBe(1);
      await reader.cancel();
      const res = await queued;
      expect(res.status).toBe(200);
      await waitFor(async () => (await gauge("vllm:num_requests_running")) === 0, { message: "the slots to empty" });
      expect(await gauge("vllm:num_requests_waiting")).toBe(0);
    } finally {
      await slow.close();
    }
  });
});
