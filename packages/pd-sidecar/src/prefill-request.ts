import type { PdSplitPath } from "@kv-epp/protocol";
import { isObject, SPLIT_APIS, type Body, type SplitApi } from "./apis.ts";
import { cachedIn } from "./usage-rewrite.ts";

/**
 * The two legs of a disaggregated request, built from the client's body as llm-d's P/D sidecar builds
 * them for vLLM's NixlConnector:
 *
 * - the prefill leg asks the prefill worker to compute the prompt and keep its KV for a remote
 *   decode: `kv_transfer_params` `{do_remote_decode: true, do_remote_prefill: false}` with the remote
 *   fields null, one output token (each of the API's limits, apis.ts), no `min_tokens` (vLLM refuses
 *   min_tokens > max_tokens), a JSON answer (`stream` false, no `stream_options`);
 * - the decode leg is the client's body unchanged but for the `kv_transfer_params` the prefill
 *   worker answered with.
 */

export type { Body };

/** A copy of `limits` (the client's body, or generate's sampling_params) asking for one output token and no minimum. */
function capped(limits: Body, api: SplitApi): Body {
  const out: Body = { ...limits };
  for (const field of api.limits) out[field] = 1;
  delete out.min_tokens;
  return out;
}

export function prefillBody(client: Body, path: PdSplitPath): Body {
  const api = SPLIT_APIS[path];
  const body: Body = {
    ...(api.inSamplingParams ? client : capped(client, api)),
    kv_transfer_params: {
      do_remote_decode: true, do_remote_prefill: false,
      remote_engine_id: null, remote_block_ids: null, remote_host: null, remote_port: null,
    },
    stream: false,
  };
  // vLLM requires sampling_params on generate; one is made for the prefill leg if the client left it out.
  if (api.inSamplingParams) body.sampling_params = capped(isObject(client.sampling_params) ? client.sampling_params : {}, api);
  delete body.stream_options;
  return body;
}

export function decodeBody(client: Body, kvTransferParams: unknown): Body {
  return { ...client, kv_transfer_params: kvTransferParams };
}

/** What the decode leg needs of the prefill worker's answer. */
export function prefillOutcome(answer: unknown, path: PdSplitPath): { kvTransferParams: unknown; cachedTokens: number } {
  const a = isObject(answer) ? answer : {};
  // A count the answer leaves out is 0: vLLM writes the details null when nothing was cached.
  return { kvTransferParams: a.kv_transfer_params ?? null, cachedTokens: cachedIn(a.usage, SPLIT_APIS[path]) ?? 0 };
}
