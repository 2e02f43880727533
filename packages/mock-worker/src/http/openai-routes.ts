import { Hono, type Context } from "hono";
import { ChatTemplateError, type Preprocessor } from "@kv-epp/tokenizer";
import type { RankEngine } from "../engine/rank-engine.ts";
import { openAiError, parseBody } from "./errors.ts";
import { generate, type Endpoint } from "./generate.ts";
import { ChatRequest, CompletionRequest, DEFAULT_MAX_TOKENS } from "./schemas.ts";

export type OpenAiDeps = {
  model: string;
  preprocessor: Preprocessor;
  /** Chooses the rank for a request; `requested` is the `x-data-parallel-rank` header, when sent. */
  pickRank: (requested: number | undefined) => RankEngine;
  dpSize: number;
};

// vLLM's API server honours this header to pin a request to a DP rank (external DP load balancing).
const RANK_HEADER = "x-data-parallel-rank";

export function openAiRoutes(deps: OpenAiDeps): Hono {
  const app = new Hono();

  const rankPicker = (header: string | undefined): { ok: true; pick: () => RankEngine } | { ok: false; message: string } => {
    if (header === undefined) return { ok: true, pick: () => deps.pickRank(undefined) };
    const r = Number(header);
    if (!Number.isInteger(r) || r < 0 || r >= deps.dpSize) return { ok: false, message: `${RANK_HEADER} must be an integer in [0, ${deps.dpSize})` };
    return { ok: true, pick: () => deps.pickRank(r) };
  };

  type Common = { model?: string; stream: boolean; stream_options?: { include_usage?: boolean } | null };
  const run = (c: Context, endpoint: Endpoint, body: Common, prompts: Uint32Array[], maxTokens: number) => {
    const rank = rankPicker(c.req.header(RANK_HEADER));
    if (!rank.ok) return openAiError(c, 400, rank.message, RANK_HEADER);
    return generate(c, {
      endpoint, model: body.model ?? deps.model, prompts, maxTokens, stream: body.stream,
      includeUsage: body.stream_options?.include_usage === true, pick: rank.pick,
    });
  };

  app.get("/v1/models", (c) =>
    c.json({
      object: "list",
      data: [{ id: deps.model, object: "model", created: 0, owned_by: "kv-epp-mock", root: deps.model, parent: null, max_model_len: 1 << 20 }],
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
    return run(c, "completion", body, prompts.map((x) => deps.preprocessor.encodeCompletion(x)), body.max_tokens ?? DEFAULT_MAX_TOKENS);
  });

  app.post("/v1/chat/completions", async (c) => {
    const parsed = await parseBody(c, ChatRequest);
    if (!parsed.ok) return parsed.res;
    const body = parsed.data;
    // vLLM's defaults (add_generation_prompt true) and its check that the two do not contradict.
    const addGenerationPrompt = body.add_generation_prompt ?? true;
    if (body.continue_final_message && addGenerationPrompt)
      return openAiError(c, 400, "Cannot set both `continue_final_message` and `add_generation_prompt` to True.", "continue_final_message");
    let prompt: Uint32Array;
    try {
      prompt = deps.preprocessor.encodeChat(body.messages, {
        tools: body.tools ?? undefined,
        templateKwargs: body.chat_template_kwargs ?? undefined,
        addGenerationPrompt,
        continueFinalMessage: body.continue_final_message ?? false,
      });
    } catch (e) {
      // A chat template can reject a conversation (e.g. roles out of order): the client's fault, as in vLLM.
      if (e instanceof ChatTemplateError) return openAiError(c, 400, e.message, "messages");
      throw e;
    }
    return run(c, "chat", body, [prompt], body.max_completion_tokens ?? body.max_tokens ?? DEFAULT_MAX_TOKENS);
  });

  return app;
}
