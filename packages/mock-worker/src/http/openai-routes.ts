import { Hono, type Context } from "hono";
import { createHash } from "node:crypto";
import {
  BadRequest, ChatTemplateError, ChatUnrenderable, mediaPositions, parseBody as parseRequestBody, parseJsonKeepingFloats, readChatBody, replyRole, responsesChat, ResponsesInputError, responsesTemplateKwargs,
  type ChatMessage, type ChatOptions, type Preprocessor,
} from "@kv-epp/tokenizer";
import type { MediaItem } from "../cache/block-hash.ts";
import type { AcquireIdentity } from "../cache/prefix-cache.ts";
import type { RankEngine } from "../engine/rank-engine.ts";
import type { MockNixlConnector } from "../kv-transfer/connector.ts";
import { KvTransferParams, transferRequest } from "../kv-transfer/params.ts";
import type { MockSglangConnector } from "../kv-transfer/sglang-connector.ts";
import type { MockMooncakeConnector } from "../kv-transfer/mooncake-connector.ts";
import { mooncakeRequest } from "../kv-transfer/mooncake-params.ts";
import { NO_ROOM_MESSAGE, readBootstrap } from "../kv-transfer/sglang-params.ts";
import { openAiError, parseBody } from "./errors.ts";
import { generate, type Endpoint, type GenerateRequest } from "./generate.ts";
import type { EngineKind } from "../config.ts";
import { RANK_HEADER, requestedRank, type BodyRanks, type RankNumbering } from "./rank-header.ts";
import { answerMessages, anthropicError, refusedBody } from "./messages.ts";
import { ChatRequest, CompletionRequest, DEFAULT_MAX_TOKENS, MAX_OUTPUT_TOKENS, ResponsesRequest } from "./schemas.ts";

export type OpenAiDeps = {
  model: string;
  preprocessor: Preprocessor;
  /** Chooses the rank for a request; `requested` is the `x-data-parallel-rank` header, when sent. */
  pickRank: (requested: number | undefined) => RankEngine;
  /** The ranks this server serves and how `x-data-parallel-rank` numbers them. */
  ranks: RankNumbering;
  /** LoRA adapters by name; a request naming one in `model` runs in its identity (lora_int_id = index + 1). */
  loraModules: readonly string[];
  /** With --role prefill|decode: vLLM's NixlConnector stand-in (absent: kv_transfer_params ignored). */
  connector?: MockNixlConnector;
  /** With --disaggregation-mode prefill|decode: SGLang's disaggregation stand-in (requests must carry a room). */
  sglang?: MockSglangConnector;
  /** With --role and --kv-connector mooncake: vLLM's MooncakeConnector stand-in. */
  mooncake?: MockMooncakeConnector;
  dpSize: number;
  /** The engine stood in for: how the rank a request names is read, and /v1/models' owned_by. */
  engine: EngineKind;
};

/** vLLM's placeholder for an image in Qwen's vocabulary (<|image_pad|>) and how many stand for one item. */
export const MEDIA_TOKEN_ID = 151655;
export const MEDIA_TOKENS = 64;

export function openAiRoutes(deps: OpenAiDeps): Hono {
  const app = new Hono();

  const ownedBy = deps.engine === "sglang" ? "sglang" : "kv-epp-mock";
  type Common = {
    model?: string | undefined; cache_salt?: string | null; stream: boolean; stream_options?: { include_usage?: boolean } | null;
    kv_transfer_params?: KvTransferParams | null;
  } & BodyRanks;
  const rankPicker = (header: string | undefined, body: Common): { ok: true; pick: () => RankEngine } | { ok: false; message: string } => {
    const r = requestedRank(header, deps.ranks, deps.engine, body);
    return r.ok ? { ok: true, pick: () => deps.pickRank(r.rank) } : r;
  };

  /** What generate() runs for a request, or why the rank it names cannot serve it. */
  const generation = (
    c: Context, endpoint: Endpoint, body: Common, prompts: Uint32Array[], maxTokens: number, media: readonly MediaItem[] = [], replyRole?: string,
  ): { ok: true; req: GenerateRequest } | { ok: false; message: string } => {
    const rank = rankPicker(c.req.header(RANK_HEADER), body);
    if (!rank.ok) return rank;
    // A model naming an adapter runs in its identity; any other name is the base model (echoed, not checked).
    const lora = body.model !== undefined ? deps.loraModules.indexOf(body.model) : -1;
    const identity: AcquireIdentity = {
      loraName: lora >= 0 ? body.model! : null, loraId: lora >= 0 ? lora + 1 : null, cacheSalt: body.cache_salt ?? null, media,
    };
    return {
      ok: true,
      req: {
        endpoint, model: body.model ?? deps.model, prompts, maxTokens, stream: body.stream, replyRole,
        includeUsage: body.stream_options?.include_usage === true, pick: rank.pick, identity,
        kv: deps.connector ? { connector: deps.connector, request: transferRequest(body.kv_transfer_params), dpSize: deps.dpSize } : undefined,
        mooncake: deps.mooncake ? { connector: deps.mooncake, request: mooncakeRequest(body.kv_transfer_params) } : undefined,
      },
    };
  };
  const run = async (...args: Parameters<typeof generation>) => {
    const [c, endpoint] = args;
    const g = generation(...args);
    if (!g.ok) return openAiError(c, 400, g.message, RANK_HEADER);
    if (!deps.sglang) return generate(c, g.req);
    // A disaggregated SGLang server serves only requests paired by a room; its Responses request model has no
    // bootstrap fields (pydantic drops them), so a Responses request never has one.
    const b = endpoint === "responses" ? ({ kind: "none" } as const) : readBootstrap(await c.req.text(), deps.sglang.ownBootstrapPort);
    if (b.kind === "none") return openAiError(c, 400, NO_ROOM_MESSAGE);
    if (b.kind === "invalid") return openAiError(c, 400, `${b.param}: ${b.why}`, b.param);
    if (g.req.prompts.length !== 1) return openAiError(c, 400, "a batch of prompts needs one bootstrap_room each, which the mock does not model", "prompt");
    const mode = deps.sglang.opts.mode;
    // SGLang's prefill server ends a request after its first token (FINISH_LENGTH(length=0)), whatever it asked.
    const req = { ...g.req, maxTokens: mode === "prefill" ? 1 : g.req.maxTokens, sglang: { connector: deps.sglang, bootstrap: b.bootstrap } };
    return generate(c, req);
  };

  app.get("/v1/models", (c) =>
    c.json({
      object: "list",
      data: [
        { id: deps.model, object: "model", created: 0, owned_by: ownedBy, root: deps.model, parent: null, max_model_len: 1 << 20 },
        ...deps.loraModules.map((id) => ({ id, object: "model", created: 0, owned_by: ownedBy, root: id, parent: deps.model, max_model_len: 1 << 20 })),
      ],
    }),
  );

  app.post("/v1/completions", async (c) => {
    const parsed = await parseBody(c, CompletionRequest);
    if (!parsed.ok) return parsed.res;
    const body = parsed.data;
    // A single prompt (text or ids) or a list of them; ids are used as given.
    const p = body.prompt;
    const prompts: (string | number[])[] =
      typeof p === "string" ? [p] : typeof p[0] === "number" ? [p as number[]] : (p as (string | number[])[]);
    const opts = tokenizeOptions(body);
    return run(c, "completion", body, prompts.map((x) => deps.preprocessor.encodeCompletion(x, opts)), body.max_tokens ?? DEFAULT_MAX_TOKENS);
  });

  app.post("/v1/chat/completions", async (c) => {
    const parsed = await parseBody(c, ChatRequest);
    if (!parsed.ok) return parsed.res;
    const body = parsed.data;
    // What the template prints is read as Python reads it: `1.0` in tools or kwargs stays a float.
    const py = parseJsonKeepingFloats(await c.req.text()) as Record<string, unknown>;
    let chat: { prompt: Uint32Array; media: MediaItem[] };
    let role: string;
    try {
      // The chat as the engine stood in for reads it (the preprocessor's rules: vLLM's, or SGLang's in an SGLang
      // mode), as the EPP reads it.
      const { kind: _, messages, ...opts } = readChatBody(py, deps.preprocessor.rules);
      chat = withMedia(deps.preprocessor, messages, opts);
      // vLLM's answer to a chat without messages is an error, not a role: the response role stands in.
      role = replyRole(messages, opts, deps.preprocessor.rules.responseRole) ?? deps.preprocessor.rules.responseRole;
    } catch (e) {
      // A chat template can reject a conversation (e.g. roles out of order): the client's fault, as in vLLM; so
      // is a documents or reasoning_effort vLLM's schema refuses. vLLM answers any template failure as a 400 (its
      // renderer's errors are ValueErrors), so one our engine cannot render is a 400 here too.
      if (e instanceof ChatTemplateError || e instanceof ChatUnrenderable) return openAiError(c, 400, e.message, "messages");
      if (e instanceof BadRequest) return openAiError(c, 400, e.message, refusedField(e));
      throw e;
    }
    return run(c, "chat", body, [chat.prompt], body.max_completion_tokens ?? body.max_tokens ?? DEFAULT_MAX_TOKENS, chat.media, role);
  });

  // vLLM renders a Responses request as the chat built from `instructions` and `input`, with the generation
  // prompt unless the last item is an assistant turn still in progress (which it continues).
  app.post("/v1/responses", async (c) => {
    const parsed = await parseBody(c, ResponsesRequest);
    if (!parsed.ok) return parsed.res;
    const body = parsed.data;
    const py = parseJsonKeepingFloats(await c.req.text()) as Pick<ResponsesRequest, "instructions" | "input" | "tools"> & Record<string, unknown>;
    let chat: { prompt: Uint32Array; media: MediaItem[] };
    try {
      const r = responsesChat(py.instructions, py.input, py.tools);
      chat = withMedia(deps.preprocessor, r.messages, {
        tools: r.tools, toolChoice: py.tool_choice, templateKwargs: responsesTemplateKwargs(py), addGenerationPrompt: !r.continueFinalMessage, continueFinalMessage: r.continueFinalMessage,
      });
    } catch (e) {
      if (e instanceof BadRequest) return openAiError(c, 400, e.message, refusedField(e));
      if (e instanceof ResponsesInputError || e instanceof ChatTemplateError || e instanceof ChatUnrenderable) return openAiError(c, 400, e.message, "input");
      throw e;
    }
    return run(c, "responses", body, [chat.prompt], body.max_output_tokens ?? DEFAULT_MAX_TOKENS, chat.media);
  });

  // vLLM's Anthropic endpoints (SGLang mode has none): the body is read as the chat vLLM converts it to, by
  // @kv-epp/tokenizer's converter (the EPP's own reading), and runs as a chat; messages.ts shapes the answer.
  if (deps.engine === "vllm") {
    app.post("/v1/messages", async (c) => {
      const read = await readMessages(c, deps.preprocessor);
      if (!read.ok) return read.res;
      if (read.maxTokens > MAX_OUTPUT_TOKENS) return anthropicError(c, 400, `max_tokens must be at most ${MAX_OUTPUT_TOKENS}`);
      // vLLM's Anthropic request has kv_transfer_params (its P/D sidecar's two legs), passed on to the chat it runs.
      const kv = KvTransferParams.nullish().safeParse(read.kvTransferParams);
      if (!kv.success) return refusedBody(c, `kv_transfer_params: ${kv.error.issues[0]!.message}`, "kv_transfer_params");
      // vLLM passes the body's cache_salt on to the chat it runs: it salts the first block, as a chat's does.
      const body = { model: read.model, stream: read.stream, cache_salt: read.cacheSalt, kv_transfer_params: kv.data };
      const g = generation(c, "chat", body, [read.chat.prompt], read.maxTokens, read.chat.media);
      return g.ok ? answerMessages(c, g.req) : anthropicError(c, 400, g.message);
    });
    app.post("/v1/messages/count_tokens", async (c) => {
      const read = await readMessages(c, deps.preprocessor);
      if (!read.ok) return read.res;
      const n = read.chat.prompt.length;
      return c.json({ input_tokens: n, context_management: { original_input_tokens: n } });
    });
  }

  return app;
}

type MessagesRead =
  | { ok: true; model: string; stream: boolean; maxTokens: number; cacheSalt?: string; kvTransferParams: unknown; chat: { prompt: Uint32Array; media: MediaItem[] } }
  | { ok: false; res: Response };

/**
 * A /v1/messages (or count_tokens) body, converted and tokenized. What vLLM's request model refuses is answered as
 * its validation handler answers it; a chat the template cannot render, in Anthropic's error shape.
 */
async function readMessages(c: Context, pre: Preprocessor): Promise<MessagesRead> {
  let doc: unknown;
  try {
    doc = parseJsonKeepingFloats(await c.req.text());
  } catch (e) {
    return { ok: false, res: refusedBody(c, `request body is not valid JSON: ${(e as Error).message}`) };
  }
  try {
    const parsed = parseRequestBody(doc, c.req.path, pre.rules);
    // Only under SGLang's rules is a Messages body no chat, and SGLang mode serves no /v1/messages.
    if (parsed.input.kind !== "chat") throw new Error(`a /v1/messages body read as ${parsed.input.kind}`);
    const o = doc as Record<string, unknown>;
    if (o.stream !== undefined && o.stream !== null && typeof o.stream !== "boolean") throw new BadRequest("stream must be a boolean");
    // Checked a positive int by the converter (count_tokens reads none); a float 5.0 reaches here as a PyFloat.
    const max = o.max_tokens === undefined ? 0 : ((o.max_tokens as { value?: number }).value ?? Number(o.max_tokens));
    const { kind: _, messages, ...opts } = parsed.input;
    return {
      ok: true, model: parsed.model!, stream: o.stream === true, maxTokens: max, cacheSalt: parsed.cacheSalt, kvTransferParams: o.kv_transfer_params,
      chat: withMedia(pre, messages, opts),
    };
  } catch (e) {
    if (e instanceof BadRequest) return { ok: false, res: refusedBody(c, e.message, /^(\S+) (?:must|is) /.exec(e.message)?.[1]) };
    if (e instanceof ChatTemplateError || e instanceof ChatUnrenderable) return { ok: false, res: anthropicError(c, 400, e.message) };
    throw e;
  }
}

function tokenizeOptions(body: CompletionRequest) {
  return {
    addSpecialTokens: body.add_special_tokens ?? undefined,
    truncatePromptTokens: body.truncate_prompt_tokens ?? undefined,
    truncationSide: body.truncation_side ?? undefined,
  };
}

/**
 * The chat's tokens as a multimodal vLLM sees them: the text rendering with MEDIA_TOKENS placeholders
 * for each image/audio/video part at its position (as @kv-epp/tokenizer locates it), and one media
 * item per part whose identifier is a digest of the part (vLLM hashes the item's content).
 */
function withMedia(pre: Preprocessor, messages: ChatMessage[], opts: ChatOptions): { prompt: Uint32Array; media: MediaItem[] } {
  const at = mediaPositions(pre, messages, opts);
  // A chat with media is not truncated here: its placeholders would have to move with the cut.
  const text = pre.encodeChat(messages, at.length === 0 ? opts : { ...opts, truncatePromptTokens: undefined });
  if (at.length === 0) return { prompt: text, media: [] };
  const out = new Uint32Array(text.length + at.length * MEDIA_TOKENS);
  const media: MediaItem[] = [];
  let from = 0, to = 0;
  for (const p of at) {
    out.set(text.subarray(from, p.at), to);
    to += p.at - from;
    from = p.at;
    const part = (messages[p.message]!.content as unknown[])[p.part];
    media.push({ identifier: createHash("sha256").update(JSON.stringify(part)).digest("hex"), offset: to, length: MEDIA_TOKENS });
    out.fill(MEDIA_TOKEN_ID, to, to + MEDIA_TOKENS);
    to += MEDIA_TOKENS;
  }
  out.set(text.subarray(from), to);
  return { prompt: out, media };
}

/** The field a request reader refused: its message opens with it ("documents must be ..."). */
const refusedField = (e: BadRequest): string => e.message.split(" ", 1)[0]!;
