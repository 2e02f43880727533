import { z } from "zod";

/**
 * vLLM's `kv_transfer_params` as its NixlConnector reads and writes them (the request field and the
 * response field of the OpenAI server, `nixl/scheduler.py`):
 *
 * - a request with `do_remote_decode: true` is a prefill for another worker: it runs as usual (the
 *   P/D sidecar sends it with max_tokens 1) and, finished by its length, answers with the parameters
 *   the decode worker needs, `do_remote_prefill: true, do_remote_decode: false, remote_block_ids,
 *   remote_engine_id, remote_request_id, remote_host, remote_port, tp_size`, while its blocks stay
 *   held for the decode worker to read (`request_finished`, delay_free_blocks);
 * - a request with `do_remote_prefill: true` and a non-empty `remote_block_ids` reads the prompt's
 *   blocks from that worker instead of computing them (`get_num_new_matched_tokens` counts every
 *   prompt token it lacks as external; `update_state_after_alloc` needs all of remote_engine_id,
 *   remote_request_id, remote_host and remote_port, else it warns and the request runs without a
 *   transfer).
 *
 * `remote_block_ids` is one list per KV cache group in vLLM today (BlockIds, `[[1, 2, 3]]`) and a flat
 * list in older releases; both are read. The mock's side channel is its own HTTP server: `remote_host`
 * and `remote_port` name it, and the decode side tells it the blocks were read with
 * `POST /nixl/notify` (NIXL sends that notification over its own transport).
 */

export const KvTransferParams = z.looseObject({
  do_remote_decode: z.boolean().nullish(),
  do_remote_prefill: z.boolean().nullish(),
  remote_block_ids: z.union([z.array(z.number().int()), z.array(z.array(z.number().int()))]).nullish(),
  remote_engine_id: z.string().nullish(),
  remote_request_id: z.string().nullish(),
  remote_host: z.string().nullish(),
  remote_port: z.union([z.number().int().min(0).max(65535), z.string().regex(/^\d{1,5}$/).transform(Number)]).nullish(),
  // vLLM's MooncakeConnector's (mooncake-params.ts)
  transfer_id: z.string().nullish(),
  remote_bootstrap_addr: z.string().nullish(),
});
export type KvTransferParams = z.output<typeof KvTransferParams>;

/** What the request asks of the connector. */
export type TransferRequest =
  | { kind: "none" }
  | { kind: "send" }
  | { kind: "receive"; remoteBlocks: number; engineId: string; requestId: string; host: string; port: number }
  /** do_remote_prefill without what a pull needs: vLLM warns and computes the prompt itself */
  | { kind: "invalid"; why: string };

export function transferRequest(params: KvTransferParams | null | undefined): TransferRequest {
  if (!params) return { kind: "none" };
  if (params.do_remote_decode) return { kind: "send" };
  if (!params.do_remote_prefill) return { kind: "none" };
  const ids = params.remote_block_ids;
  // vLLM keeps one list per KV cache group; the mock has one group, the first.
  const remoteBlocks = !ids || ids.length === 0 ? 0 : Array.isArray(ids[0]) ? (ids[0] as number[]).length : ids.length;
  if (remoteBlocks === 0) return { kind: "invalid", why: "remote_block_ids is empty" };
  const { remote_engine_id: engineId, remote_request_id: requestId, remote_host: host, remote_port: port } = params;
  if (engineId == null || requestId == null || host == null || port == null)
    return { kind: "invalid", why: "remote_engine_id, remote_request_id, remote_host and remote_port are all required" };
  return { kind: "receive", remoteBlocks, engineId, requestId, host, port };
}

/** The parameters a finished prefill answers with (NixlConnectorScheduler.request_finished). */
export function decodeParams(p: { blockIds: number[]; engineId: string; requestId: string; host: string; port: number }) {
  return {
    do_remote_prefill: true,
    do_remote_decode: false,
    remote_block_ids: [p.blockIds],
    remote_engine_id: p.engineId,
    remote_request_id: p.requestId,
    remote_host: p.host,
    remote_port: p.port,
    tp_size: 1,
  };
}
