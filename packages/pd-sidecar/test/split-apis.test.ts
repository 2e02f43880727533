import { afterAll, beforeAll, describe, expect, test } from "bun:test";
import { freePort, LOOPBACK } from "@kv-epp/testkit";
import pino from "pino";
import { startSidecar, type Sidecar } from "../src/index.ts";

// A real sidecar on loopback between two mock vLLM servers that answer each split API in its own shape
// (Responses, Anthropic Messages, token-in generate) and keep what each leg was sent.

const HOST = `${LOOPBACK}.2.79`;
type Leg = { path: string; body: any };
const legs: { prefill: Leg[]; decode: Leg[] } = { prefill: [], decode: [] };
const KV = { do_remote_prefill: true, do_remote_decode: false, remote_block_ids: [[3, 4]], remote_engine_id: "e1", remote_request_id: "r1", remote_host: HOST, remote_port: 1 };
const KV_PREFILL = { do_remote_decode: true, do_remote_prefill: false, remote_engine_id: null, remote_block_ids: null, remote_host: null, remote_port: null };

/** A usage in the API's own terms, `cached` of its 80 prompt tokens cached. */
function usage(path: string, cached: number): object | undefined {
  if (path === "/v1/responses") return { input_tokens: 80, input_tokens_details: { cached_tokens: cached }, output_tokens: 2, output_tokens_details: { reasoning_tokens: 0 }, total_tokens: 82 };
  // vLLM's Messages usage: input_tokens is the prompt less its cache reads (usage-rewrite.ts).
  if (path === "/v1/messages") return { input_tokens: 80 - cached, output_tokens: 2, cache_read_input_tokens: cached, cache_creation_input_tokens: 0 };
  return undefined;
}

/** The answer a vLLM of the API would give (JSON; or its SSE events when streamed). */
function answer(path: string, body: any, cached: number, kv: object | null): Response {
  if (path === "/inference/v1/generate") return Response.json({ request_id: "g1", choices: [{ index: 0, token_ids: [7, 8], finish_reason: "length" }], kv_transfer_params: kv });
  const whole = path === "/v1/responses"
    ? { id: "resp_1", object: "response", status: "completed", output: [{ type: "message", content: [{ type: "output_text", text: "ok" }] }], usage: usage(path, cached), kv_transfer_params: kv }
    : { id: "msg_1", type: "message", role: "assistant", content: [{ type: "text", text: "ok" }], usage: usage(path, cached), kv_transfer_params: kv };
  if (!body.stream) return Response.json(whole);
  const events = path === "/v1/responses"
    ? [["response.created", { type: "response.created", response: { ...whole, status: "in_progress", usage: null } }], ["response.output_text.delta", { type: "response.output_text.delta", delta: "ok" }], ["response.completed", { type: "response.completed", response: whole }]]
    : [["message_start", { type: "message_start", message: { ...whole, content: [], usage: { input_tokens: 80, output_tokens: 0 } } }], ["content_block_delta", { type: "content_block_delta", index: 0, delta: { type: "text_delta", text: "ok" } }], ["message_delta", { type: "message_delta", delta: { stop_reason: "max_tokens" }, usage: usage(path, cached) }], ["message_stop", { type: "message_stop" }]];
  const text = events.map(([event, data]) => `event: ${event}\ndata: ${JSON.stringify(data)}\n\n`).join("");
  return new Response(text, { headers: { "content-type": "text/event-stream" } });
}

let prefill: ReturnType<typeof Bun.serve>, decode: ReturnType<typeof Bun.serve>, sidecar: Sidecar;
beforeAll(async () => {
  const serve = (side: "prefill" | "decode") => Bun.serve({
    hostname: HOST, port: 0,
    fetch: async (req) => {
      const { pathname: path, search } = new URL(req.url);
      const body = req.method === "POST" ? await req.json() : null;
      legs[side].push({ path: path + search, body });
      if (path === "/v1/embeddings") return Response.json({ object: "list", data: [] });
      // The prefill worker found 32 tokens cached; the decode worker, which read the rest over NIXL, says 79.
      return side === "prefill" ? answer(path, body, 32, KV) : answer(path, body, 79, null);
    },
  });
  prefill = serve("prefill");
  decode = serve("decode");
  sidecar = await startSidecar({ listen: HOST, port: await freePort(HOST), decoder: `http://${HOST}:${decode.port}`, logger: pino({ level: "silent" }) });
});
afterAll(async () => {
  await sidecar?.close();
  await prefill?.stop(true);
  await decode?.stop(true);
});

async function send(path: string, body: object, prefiller = `${HOST}:${prefill.port}`) {
  legs.prefill.length = 0;
  legs.decode.length = 0;
  return fetch(`${sidecar.url}${path}`, { method: "POST", headers: { "content-type": "application/json", "x-prefiller-host-port": prefiller }, body: JSON.stringify(body) });
}

describe("the sidecar splits every API llm-d's splits", () => {
  test("/v1/responses: one output token on the prefill leg, the client's body with the transfer on the decode leg, the prefill's cached tokens in the answer", async () => {
    const client = { model: "m", instructions: "be brief", input: [{ role: "user", content: "hi" }], max_output_tokens: 20 };
    const res = await send("/v1/responses", client);
    expect(res.status).toBe(200);
    expect(legs.prefill).toEqual([{ path: "/v1/responses", body: { ...client, max_output_tokens: 1, stream: false, kv_transfer_params: KV_PREFILL } }]);
    expect(legs.decode).toEqual([{ path: "/v1/responses", body: { ...client, kv_transfer_params: KV } }]);
    const body = (await res.json()) as any;
    expect(body.usage.input_tokens_details).toEqual({ cached_tokens: 32 });
    expect(body.usage).not.toHaveProperty("prompt_tokens_details");
  });

  test("/v1/responses streamed: the decode leg streams, response.completed carries the prefill's cached tokens", async () => {
    const client = { model: "m", input: "hi", stream: true };
    const res = await send("/v1/responses", client);
    expect(res.headers.get("content-type")).toContain("text/event-stream");
    expect(legs.prefill[0]!.body).toMatchObject({ stream: false, max_output_tokens: 1 });
    expect(legs.decode[0]!.body).toEqual({ ...client, kv_transfer_params: KV });
    const data = (await res.text()).split("\n").filter((l) => l.startsWith("data: ")).map((l) => JSON.parse(l.slice(6)));
    expect(data.map((d) => d.type)).toEqual(["response.created", "response.output_text.delta", "response.completed"]);
    expect(data[0].response.usage).toBeNull();
    expect(data[2].response.usage.input_tokens_details).toEqual({ cached_tokens: 32 });
  });

  test("/v1/messages: max_tokens 1 on the prefill leg; cache_read_input_tokens is the prefill's and input_tokens the rest of the prompt, JSON or streamed", async () => {
    const client = { model: "m", system: "be brief", messages: [{ role: "user", content: "hi" }], max_tokens: 20 };
    const res = await send("/v1/messages", client);
    expect(legs.prefill).toEqual([{ path: "/v1/messages", body: { ...client, max_tokens: 1, stream: false, kv_transfer_params: KV_PREFILL } }]);
    expect(legs.decode).toEqual([{ path: "/v1/messages", body: { ...client, kv_transfer_params: KV } }]);
    // The decode worker read 79 of the 80 tokens; the client is told the prefill's 32 and the other 48 as input.
    expect(((await res.json()) as any).usage).toEqual({ input_tokens: 48, output_tokens: 2, cache_read_input_tokens: 32, cache_creation_input_tokens: 0 });
    const streamed = await send("/v1/messages", { ...client, stream: true });
    const events = (await streamed.text()).split("\n").filter((l) => l.startsWith("data: ")).map((l) => JSON.parse(l.slice(6)));
    // message_start before the decode worker's cache counts (input_tokens the whole prompt), message_delta with them.
    expect(events[0].message.usage).toEqual({ input_tokens: 48, output_tokens: 0, cache_read_input_tokens: 32 });
    expect(events.find((e) => e.type === "message_delta").usage).toEqual({ input_tokens: 48, output_tokens: 2, cache_read_input_tokens: 32, cache_creation_input_tokens: 0 });
  });

  test("/v1/messages?beta=true (Claude Code's), under a gateway prefix or with a trailing slash is split, each leg sent the path and query the client sent", async () => {
    const client = { model: "m", messages: [{ role: "user", content: "hi" }], max_tokens: 20 };
    for (const path of ["/v1/messages?beta=true", "/llm/v1/messages", "/v1/messages/"]) {
      const res = await send(path, client);
      expect(res.status).toBe(200);
      expect(legs.prefill).toEqual([{ path, body: { ...client, max_tokens: 1, stream: false, kv_transfer_params: KV_PREFILL } }]);
      expect(legs.decode).toEqual([{ path, body: { ...client, kv_transfer_params: KV } }]);
    }
  });

  test("/inference/v1/generate: the limits in sampling_params on the prefill leg, the client's on the decode leg, the answer as the decode worker gave it", async () => {
    const client = { model: "m", token_ids: [1, 2, 3, 4], sampling_params: { max_tokens: 20, min_tokens: 2, temperature: 0 } };
    const res = await send("/inference/v1/generate", client);
    expect(legs.prefill).toEqual([{ path: "/inference/v1/generate", body: { ...client, sampling_params: { max_tokens: 1, temperature: 0 }, stream: false, kv_transfer_params: KV_PREFILL } }]);
    expect(legs.decode).toEqual([{ path: "/inference/v1/generate", body: { ...client, kv_transfer_params: KV } }]);
    expect(await res.json()).toEqual({ request_id: "g1", choices: [{ index: 0, token_ids: [7, 8], finish_reason: "length" }], kv_transfer_params: null });
  });

  test("a path it does not split goes to the decode worker whole, whatever the header names", async () => {
    const res = await send("/v1/embeddings", { model: "m", input: "hi" });
    expect(res.status).toBe(200);
    expect(legs.prefill).toEqual([]);
    expect(legs.decode).toEqual([{ path: "/v1/embeddings", body: { model: "m", input: "hi" } }]);
    // count_tokens is no Messages request: nothing to prefill.
    await send("/v1/messages/count_tokens?beta=true", { model: "m", messages: [{ role: "user", content: "hi" }] });
    expect(legs.prefill).toEqual([]);
    expect(legs.decode).toEqual([{ path: "/v1/messages/count_tokens?beta=true", body: { model: "m", messages: [{ role: "user", content: "hi" }] } }]);
  });
});
