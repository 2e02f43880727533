import { z } from "zod";
import { KvTransferParams } from "../kv-transfer/params.ts";

/** The request fields the mock reads; everything else in an OpenAI body is accepted and ignored. */

const tokenId = z.number().int().min(0).max(0xffffffff);
/**
 * Output tokens per request, at most: a mock has no context length to bound them, and with
 * `--speed 0` a huge value would spin the process building one enormous answer.
 */
export const MAX_OUTPUT_TOKENS = 131_072;
const outputTokens = z.number().int().min(1).max(MAX_OUTPUT_TOKENS).nullish();
const common = {
  model: z.string().optional(),
  /** vLLM's cache_salt: folded into the first block's hash, so only requests with the same salt share blocks. */
  cache_salt: z.string().min(1).nullish(),
  stream: z.boolean().optional().default(false),
  stream_options: z.object({ include_usage: z.boolean().optional() }).nullish(),
  /** What vLLM tokenizes with: add_special_tokens (default true for a completion, false for a chat) and truncation. */
  add_special_tokens: z.boolean().nullish(),
  truncate_prompt_tokens: z.number().int().min(-1).nullish(),
  truncation_side: z.enum(["left", "right"]).nullish(),
  /** vLLM's NixlConnector parameters (kv-transfer/params.ts); read only with --role prefill|decode. */
  kv_transfer_params: KvTransferParams.nullish(),
};

export const CompletionRequest = z.looseObject({
  ...common,
  prompt: z.union([
    z.string(),
    z.array(tokenId).min(1),
    z.array(z.string()).min(1),
    z.array(z.array(tokenId).min(1)).min(1),
  ], { error: (iss) => (iss.input === undefined ? "required" : "must be a string, a list of token ids, or a non-empty list of either") }),
  max_tokens: outputTokens,
});
export type CompletionRequest = z.output<typeof CompletionRequest>;

const contentPart = z.looseObject({ type: z.string(), text: z.string().optional() });
const message = z.looseObject({
  role: z.string().min(1),
  content: z.union([z.string(), z.array(contentPart), z.null()]).optional(),
});

export const ChatRequest = z.looseObject({
  ...common,
  messages: z.array(message).min(1),
  tools: z.array(z.unknown()).nullish(),
  chat_template_kwargs: z.record(z.string(), z.unknown()).nullish(),
  add_generation_prompt: z.boolean().nullish(),
  continue_final_message: z.boolean().nullish(),
  max_tokens: outputTokens,
  max_completion_tokens: outputTokens,
});
export type ChatRequest = z.output<typeof ChatRequest>;

/** /v1/responses: `instructions` and `input` become the chat (@kv-epp/tokenizer's responsesChat). */
export const ResponsesRequest = z.looseObject({
  model: common.model,
  cache_salt: common.cache_salt,
  stream: common.stream,
  kv_transfer_params: common.kv_transfer_params,
  instructions: z.string().nullish(),
  input: z.union([z.string(), z.array(z.looseObject({}))], { error: "must be a string or a list of input items" }),
  tools: z.array(z.unknown()).nullish(),
  max_output_tokens: outputTokens,
});
export type ResponsesRequest = z.output<typeof ResponsesRequest>;

export const DEFAULT_MAX_TOKENS = 16;
