import type { Context } from "hono";
import { streamSSE } from "hono/streaming";
import type { AcquireIdentity } from "../cache/prefix-cache.ts";
import type { Generation, RankEngine, TransferPlan } from "../engine/rank-engine.ts";
import type { MockNixlConnector } from "../kv-transfer/connector.ts";
import type { TransferRequest } from "../kv-transfer/params.ts";
import { KvTransferFailed, type MockSglangConnector } from "../kv-transfer/sglang-connector.ts";
import type { Bootstrap } from "../kv-transfer/sglang-params.ts";
import type { MockMooncakeConnector } from "../kv-transfer/mooncake-connector.ts";
import type { MooncakeRequest } from "../kv-transfer/mooncake-params.ts";
import { openAiError } from "./errors.ts";

/**
 * Runs prompts on ranks and shapes the OpenAI answer: a JSON body, or SSE chunks ending with
 * `data: [DONE]` (plus a usage chunk when `stream_options.include_usage` is set, as OpenAI and vLLM do);
 * for /v1/responses a Response object, or its typed events ending with `response.completed`.
 */

export type Endpoint = "completion" | "chat" | "responses";

export type GenerateRequest = {
  endpoint: Endpoint;
  model: string;
  prompts: Uint32Array[];
  maxTokens: number;
  stream: boolean;
  includeUsage: boolean;
  /** A chat's: the role its reply comes in (replyRole in openai-routes.ts). */
  replyRole?: string;
  /** Picks the rank for each prompt. */
  pick: () => RankEngine;
  /** Adapter, salt and media the prompts' blocks are named with. */
  identity: AcquireIdentity;
  /**
   * With `--role prefill|decode`: the worker's connector and what the request's `kv_transfer_params`
   * ask. A JSON answer then carries `kv_transfer_params` (null unless it is a prefill for a remote
   * decode), as vLLM's does (a Messages one only when not null: messages.ts). Only a single prompt
   * transfers; a streamed prefill is not held (the P/D sidecar asks for a JSON one).
   */
  kv?: { connector: MockNixlConnector; request: TransferRequest; dpSize: number };
  /**
   * With `--disaggregation-mode prefill|decode` (a completion or chat of one prompt): the room it is paired by. A
   * prefill holds its blocks under the room and answers once a decode server took them; a decode takes the room's
   * KV before it runs. Either failure is SGLang's 500 (sglang-connector.ts).
   */
  sglang?: { connector: MockSglangConnector; bootstrap: Bootstrap };
  /**
   * With `--kv-connector mooncake`: the worker's MooncakeConnector and what the request's `kv_transfer_params` ask. A
   * JSON answer carries `kv_transfer_params: null` (a Mooncake prefill names nothing: the router pairs the legs by
   * transfer id). A prefill's blocks are held under its transfer id (a streamed one's are not); a decode on a
   * completion or chat takes the prompt's KV first, and fails with a 500 when it cannot (on Responses and Messages
   * the mock does not pull: the decode computes the prompt itself).
   */
  mooncake?: { connector: MockMooncakeConnector; request: MooncakeRequest };
};

type Usage = {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
  /**
   * vLLM (with --enable-prompt-tokens-details, releases before cached_tokens 0 was written) sets it only
   * when something was cached: null on a miss in a JSON body; the streamed usage chunk is dumped with
   * exclude_none, so there a miss has no prompt_tokens_details at all.
   */
  prompt_tokens_details?: { cached_tokens: number } | null;
};

let nextId = 0;

/** A response id: `prefix-mock<n>`, n counted across every endpoint. */
export const newId = (prefix: string) => `${prefix}-mock${(++nextId).toString(16)}`;

function usageOf(gens: { promptTokens: number; cachedTokens: number; outputTokens: number }[]): Usage {
  let prompt = 0, cached = 0, output = 0;
  for (const g of gens) {
    prompt += g.promptTokens;
    cached += g.cachedTokens;
    output += g.outputTokens;
  }
  return { prompt_tokens: prompt, completion_tokens: output, total_tokens: prompt + output, prompt_tokens_details: cached > 0 ? { cached_tokens: cached } : null };
}

export async function collect(gen: Generation): Promise<string> {
  let text = "";
  try {
    for await (const t of gen.tokens()) text += t;
  } finally {
    gen.finish();
  }
  return text;
}

/** What the request's `kv_transfer_params` ask of its generation (see GenerateRequest.kv); undefined: no transfer. */
export function transferPlan(req: GenerateRequest, stream: boolean): TransferPlan | undefined {
  if (req.mooncake) return req.prompts.length !== 1 || (stream && req.mooncake.request.kind === "send") ? undefined : req.mooncake.connector.plan(req.mooncake.request);
  if (!req.kv || req.prompts.length !== 1 || (stream && req.kv.request.kind === "send")) return undefined;
  return req.kv.connector.plan(req.kv.request);
}

/**
 * One prompt run to its end under `transfer`. A prefill for a remote decode holds its blocks for the decode worker
 * and answers with the `kvTransferParams` naming them (`requestId`: vLLM's request id, which the decode worker's
 * notification names); null for any other.
 */
export async function runToEnd(req: GenerateRequest, prompt: Uint32Array, transfer: TransferPlan | undefined, requestId: string, signal: AbortSignal) {
  const engine = req.pick();
  const gen = await engine.start(prompt, req.maxTokens, signal, req.identity, transfer);
  let kvTransferParams: object | null = null;
  let kept = false;
  try {
    const text = await collect(gen);
    const mooncake = req.mooncake?.request;
    if (transfer?.kind === "send" && req.sglang) {
      // offer() frees the blocks itself once the room is taken, timed out or abandoned.
      kept = true;
      await req.sglang.connector.offer(req.sglang.bootstrap.room, gen, requestId, signal);
    } else if (transfer?.kind === "send" && mooncake?.kind === "send") kept = req.mooncake!.connector.offer(mooncake.transferId, gen, engine.rank);
    else if (transfer?.kind === "send") kept = (kvTransferParams = req.kv!.connector.offer(gen, requestId, engine.rank, req.kv!.dpSize)) !== null;
    return { gen, text, kvTransferParams };
  } finally {
    // Not handed to a connector (nothing to transfer, a NIXL offer refused, or a failure before the offer): nobody
    // will read the blocks.
    if (!kept) gen.held?.release();
  }
}

/**
 * The SGLang room's part before the engine: a prefill's blocks are to be held (`send`), a decode takes the room's KV
 * from the prefill server first (`receive`, or SGLang's 500 when it cannot).
 */
async function sglangPlan(sglang: NonNullable<GenerateRequest["sglang"]>, rid: string, signal: AbortSignal): Promise<TransferPlan> {
  return sglang.connector.opts.mode === "prefill" ? { kind: "send" } : sglang.connector.receive(sglang.bootstrap, rid, signal);
}

export async function generate(c: Context, req: GenerateRequest): Promise<Response> {
  if (req.endpoint === "responses") return respond(c, req);
  const signal = c.req.raw.signal;
  const id = newId(req.endpoint === "chat" ? "chatcmpl" : "cmpl");
  const created = Math.floor(Date.now() / 1000);
  const head = { id, object: req.endpoint === "chat" ? "chat.completion" : "text_completion", created, model: req.model };
  // An SGLang room's transfer failure aborts the request with a 500, as SGLang's prepare_abort does; a Mooncake
  // load's fails it (vLLM's kv_load_failure_policy "fail").
  let pulledTransfer: TransferPlan | undefined;
  const mooncakePull = req.mooncake?.request.kind === "receive" && req.prompts.length === 1 ? req.mooncake.request : undefined;
  try {
    if (req.sglang) pulledTransfer = await sglangPlan(req.sglang, id, signal);
    else if (mooncakePull) pulledTransfer = await req.mooncake!.connector.receive(mooncakePull, signal);
  } catch (e) {
    if (e instanceof KvTransferFailed) return openAiError(c, 500, e.message);
    throw e;
  }
  const pulled = req.sglang !== undefined || mooncakePull !== undefined;

  if (!req.stream) {
    const transfer = pulled ? pulledTransfer : transferPlan(req, false);
    let done: Awaited<ReturnType<typeof runToEnd>>[];
    try {
      done = await Promise.all(req.prompts.map((p) => runToEnd(req, p, transfer, `${id}-0`, signal)));
    } catch (e) {
      if (e instanceof KvTransferFailed) return openAiError(c, 500, e.message);
      throw e;
    }
    // Only a single prompt transfers.
    const kvTransferParams = done[0]?.kvTransferParams ?? null;
    const choices = done.map(({ text }, index) =>
      req.endpoint === "chat"
        ? { index, message: { role: req.replyRole, content: text }, logprobs: null, finish_reason: "length" }
        : { index, text, logprobs: null, finish_reason: "length", stop_reason: null },
    );
    const usage = usageOf(done.map((d) => d.gen));
    return c.json(req.kv || req.mooncake ? { ...head, choices, usage, kv_transfer_params: kvTransferParams } : { ...head, choices, usage });
  }

  const chunkHead = { ...head, object: req.endpoint === "chat" ? "chat.completion.chunk" : "text_completion" };
  return streamSSE(c, async (sse) => {
    const send = (body: object) => sse.writeSSE({ data: JSON.stringify(body) });
    const gens: Generation[] = [];
    // Prompts of a list are streamed one after another, each chunk tagged with its choice index.
    const transfer = pulled ? pulledTransfer : transferPlan(req, true);
    // An SGLang prefill sends its output only once a decode server took its room (its scheduler streams a
    // disaggregated prefill when the transfer is done): its chunks wait until then.
    const heldBack = req.sglang !== undefined && transfer?.kind === "send";
    const pending: object[] = [];
    const emit = (body: object) => (heldBack ? void pending.push(body) : send(body));
    for (let index = 0; index < req.prompts.length && !sse.aborted; index++) {
      const gen = await req.pick().start(req.prompts[index]!, req.maxTokens, signal, req.identity, transfer);
      gens.push(gen);
      try {
        if (req.endpoint === "chat") await emit({ ...chunkHead, choices: [{ index, delta: { role: req.replyRole, content: "" }, logprobs: null, finish_reason: null }] });
        let n = 0;
        for await (const t of gen.tokens()) {
          if (sse.aborted) break;
          const last = ++n === gen.outputTokens;
          const finish_reason = last ? "length" : null;
          await emit({
            ...chunkHead,
            choices: [req.endpoint === "chat" ? { index, delta: { content: t }, logprobs: null, finish_reason } : { index, text: t, logprobs: null, finish_reason }],
          });
        }
      } finally {
        gen.finish();
      }
      // A streamed SGLang prefill's chunks go out once a decode server took its room (offer() frees the blocks
      // either way); failing that, the stream is the error alone.
      if (heldBack && !sse.aborted) {
        try {
          await req.sglang!.connector.offer(req.sglang!.bootstrap.room, gen, id, signal);
        } catch (e) {
          if (!(e instanceof KvTransferFailed)) throw e;
          await send({ error: { message: e.message, type: "InternalServerError", param: null, code: 500 } });
          return;
        }
        for (const body of pending.splice(0)) await send(body);
      } else gen.held?.release();
    }
    if (sse.aborted) return;
    if (req.includeUsage) {
      const { prompt_tokens_details, ...usage } = usageOf(gens);
      await send({ ...chunkHead, choices: [], usage: prompt_tokens_details ? { ...usage, prompt_tokens_details } : usage });
    }
    await sse.writeSSE({ data: "[DONE]" });
  }, async () => {
    // The client went away mid-stream (or aborted while waiting); its blocks were released in finally.
  });
}

/**
 * A /v1/responses answer (one prompt): vLLM's Response object, its usage in Responses terms. With a role it carries
 * `kv_transfer_params` at its top, after `usage`, as vLLM's ResponsesResponse does (null unless a prefill for a
 * remote decode); streamed, in the responses of `response.created` and `response.completed`, which are never a held
 * prefill's (GenerateRequest.kv). The request id a prefill's blocks are offered under is the response's, as vLLM's is.
 */
function respond(c: Context, req: GenerateRequest): Promise<Response> | Response {
  const signal = c.req.raw.signal;
  const id = `resp_mock${(++nextId).toString(16)}`;
  const created_at = Math.floor(Date.now() / 1000);
  const shape = (status: "in_progress" | "completed", text: string, gen?: Generation, kvTransferParams: object | null = null) => ({
    id, object: "response", created_at, model: req.model, status,
    output: text === "" && status === "in_progress" ? [] : [{
      id: `msg_${id}`, type: "message", role: "assistant", status,
      content: [{ type: "output_text", text, annotations: [] }],
    }],
    usage: gen ? responsesUsage(gen) : null,
    ...(req.kv || req.mooncake ? { kv_transfer_params: kvTransferParams } : {}),
  });
  if (!req.stream) {
    return (async () => {
      const { gen, text, kvTransferParams } = await runToEnd(req, req.prompts[0]!, transferPlan(req, false), id, signal);
      return c.json(shape("completed", text, gen, kvTransferParams));
    })();
  }
  return streamSSE(c, async (sse) => {
    let seq = 0;
    const send = (type: string, body: object) => sse.writeSSE({ event: type, data: JSON.stringify({ type, sequence_number: seq++, ...body }) });
    const gen = await req.pick().start(req.prompts[0]!, req.maxTokens, signal, req.identity, transferPlan(req, true));
    let text = "";
    try {
      await send("response.created", { response: shape("in_progress", "") });
      for await (const t of gen.tokens()) {
        if (sse.aborted) return;
        text += t;
        await send("response.output_text.delta", { item_id: `msg_${id}`, output_index: 0, content_index: 0, delta: t });
      }
    } finally {
      gen.finish();
    }
    if (!sse.aborted) await send("response.completed", { response: shape("completed", text, gen) });
  });
}

function responsesUsage(g: { promptTokens: number; cachedTokens: number; outputTokens: number }) {
  return {
    input_tokens: g.promptTokens, input_tokens_details: { cached_tokens: g.cachedTokens },
    output_tokens: g.outputTokens, output_tokens_details: { reasoning_tokens: 0 }, total_tokens: g.promptTokens + g.outputTokens,
  };
}
