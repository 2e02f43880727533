/**
 * The two legs of a disaggregated request, built from the client's OpenAI body as llm-d's P/D sidecar
 * builds them for vLLM's NixlConnector:
 *
 * - the prefill leg asks the prefill worker to compute the prompt and keep its KV for a remote
 *   decode: `kv_transfer_params` `{do_remote_decode: true, do_remote_prefill: false}` with the remote
 *   fields null, one output token (`max_tokens`, and `max_completion_tokens` for a chat), no
 *   `min_tokens` (vLLM refuses min_tokens > max_tokens), a JSON answer (`stream` false, no
 *   `stream_options`);
 * - the decode leg is the client's body unchanged but for the `kv_transfer_params` the prefill
 *   worker answered with.
 */

export type OpenAiPath = "/v1/completions" | "/v1/chat/completions";

export type Body = Record<string, unknown>;

export function prefillBody(client: Body, path: OpenAiPath): Body {
  const body: Body = {
    ...client,
    kv_transfer_params: {
      do_remote_decode: true, do_remote_prefill: false,
      remote_engine_id: null, remote_block_ids: null, remote_host: null, remote_port: null,
    },
    stream: false,
    max_tokens: 1,
  };
  if (path === "/v1/chat/completions") body.max_completion_tokens = 1;
  delete body.min_tokens;
  delete body.stream_options;
  return body;
}

export function decodeBody(client: Body, kvTransferParams: unknown): Body {
  return { ...client, kv_transfer_params: kvTransferParams };
}

/** What the decode leg needs of the prefill worker's answer. */
export function prefillOutcome(answer: unknown): { kvTransferParams: unknown; cachedTokens: number } {
  const a = (answer ?? {}) as { kv_transfer_params?: unknown; usage?: { prompt_tokens_details?: { cached_tokens?: unknown } | null } };
  const cached = a.usage?.prompt_tokens_details?.cached_tokens;
  // vLLM leaves prompt_tokens_details null when nothing was cached.
  return { kvTransferParams: a.kv_transfer_params ?? null, cachedTokens: typeof cached === "number" && Number.isInteger(cached) ? cached : 0 };
}
