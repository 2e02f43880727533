import type { Context } from "hono";
import { streamSSE } from "hono/streaming";
import type { ContentfulStatusCode } from "hono/utils/http-status";
import { newId, runToEnd, transferPlan, type GenerateRequest } from "./generate.ts";

/**
 * The answer of vLLM's Anthropic server (vllm/entrypoints/anthropic/serving.py) to a /v1/messages request: it runs
 * the converted chat as a chat completion and rewrites that completion in Anthropic's shape. So the message keeps
 * the chat's id (`chatcmpl-...`), its role is always "assistant" (whatever the chat's role), and the stop reason is
 * the chat's finish reason renamed ("length" is "max_tokens": the mock always generates max_tokens).
 */

type Counts = { promptTokens: number; cachedTokens: number; outputTokens: number };

/**
 * vLLM's usage: input_tokens leaves out what the prefix cache supplied, reported as cache_read_input_tokens; both
 * only when the chat's usage carried cached tokens (vLLM with --enable-prompt-tokens-details writes them on a hit
 * alone, as the mock's chats do), else input_tokens is the whole prompt and no cache field is written.
 */
export function anthropicUsage(g: Counts) {
  return g.cachedTokens > 0
    ? { input_tokens: g.promptTokens - g.cachedTokens, output_tokens: g.outputTokens, cache_read_input_tokens: g.cachedTokens }
    : { input_tokens: g.promptTokens, output_tokens: g.outputTokens };
}

/** An error the chat pipeline answers (a template that fails, a rank out of range): Anthropic's envelope, vLLM's type. */
export function anthropicError(c: Context, status: ContentfulStatusCode, message: string) {
  const type = status === 400 ? "BadRequestError" : "InternalServerError";
  return c.json({ type: "error", error: { type, message } }, status);
}

/**
 * A body the request model refuses never reaches the Anthropic handler: vLLM's validation handler answers it, in
 * the OpenAI error shape with HTTP's phrase as its type and the field's path under `body` as its param.
 */
export function refusedBody(c: Context, message: string, field?: string) {
  const param = field === undefined ? "body" : `body.${field.replace(/\[(\d+)\]/g, ".$1")}`;
  return c.json({ error: { message, type: "Bad Request", param, code: 400 } }, 400);
}

/**
 * The message as JSON, or with `stream` vLLM's named events (one text block: the mock's reply is text only). The
 * chat runs with the body's `kv_transfer_params` as a chat completion's (GenerateRequest.kv): a prefill for a remote
 * decode answers with the parameters naming its held blocks at the message's top, after `usage`, as vLLM's
 * AnthropicMessagesResponse carries them (absent when null, the message being dumped without its None fields); a
 * decode of a remote prefill pulls the prompt's blocks, JSON or streamed. Its events carry none (their message is
 * built from the chat's first chunk, which has none).
 */
export function answerMessages(c: Context, req: GenerateRequest): Promise<Response> | Response {
  const signal = c.req.raw.signal;
  const id = newId("chatcmpl");
  if (!req.stream) {
    return (async () => {
      const { gen, text, kvTransferParams } = await runToEnd(req, req.prompts[0]!, transferPlan(req, false), `${id}-0`, signal);
      // Dumped without its None fields: no stop_sequence.
      return c.json({
        id, type: "message", role: "assistant", content: [{ type: "text", text }], model: req.model, stop_reason: "max_tokens", usage: anthropicUsage(gen),
        ...(kvTransferParams === null ? {} : { kv_transfer_params: kvTransferParams }),
      });
    })();
  }
  return streamSSE(c, async (sse) => {
    // Each event's fields in the order vLLM's models declare them (type, message, delta, content_block, index, usage).
    const send = (type: string, body: object = {}) => sse.writeSSE({ event: type, data: JSON.stringify({ type, ...body }) });
    const gen = await req.pick().start(req.prompts[0]!, req.maxTokens, signal, req.identity, transferPlan(req, true));
    let opened = false;
    try {
      // From the chat's first chunk, whose running usage has the prompt and no cache details yet.
      const usage = { input_tokens: gen.promptTokens, output_tokens: 0 };
      await send("message_start", { message: { id, type: "message", role: "assistant", content: [], model: req.model, stop_reason: null, stop_sequence: null, usage } });
      for await (const t of gen.tokens()) {
        if (sse.aborted) return;
        if (t === "") continue; // vLLM opens no block for an empty delta
        if (!opened) await send("content_block_start", { content_block: { type: "text", text: "" }, index: 0 });
        opened = true;
        await send("content_block_delta", { delta: { type: "text_delta", text: t }, index: 0 });
      }
    } finally {
      gen.finish();
    }
    if (sse.aborted) return;
    // The chat's usage chunk closes the open block and carries the stop reason; its [DONE] is message_stop.
    if (opened) await send("content_block_stop", { index: 0 });
    await send("message_delta", { delta: { stop_reason: "max_tokens", stop_sequence: null }, usage: anthropicUsage(gen) });
    await send("message_stop");
  });
}
