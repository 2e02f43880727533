import type { KvTransferParams } from "./params.ts";

/**
 * vLLM's `kv_transfer_params` as its MooncakeConnector reads them (`MooncakeConnectorScheduler.
 * update_state_after_alloc`, `request_finished`), checked in its order:
 *
 * - `do_remote_prefill: true` is a decode whose prompt another worker computes: it needs all of
 *   `remote_engine_id`, `remote_bootstrap_addr` and `transfer_id`, else vLLM warns ("Got invalid KVTransferParams")
 *   and the request runs without a transfer;
 * - `do_remote_decode: true` is a prefill for another worker: with a `transfer_id` its blocks are held under it once
 *   it finished by its length (the router asks for one token); without one vLLM warns ("Missing transfer_id") and
 *   frees them as usual.
 *
 * Unlike the NixlConnector, a Mooncake prefill answers with no parameters (`request_finished` returns none): the
 * router gives the decode leg the transfer id and the prefill's bootstrap address itself.
 */
export type MooncakeRequest =
  | { kind: "none" }
  | { kind: "send"; transferId: string }
  | { kind: "receive"; transferId: string; bootstrapAddr: string; engineId: string }
  | { kind: "invalid"; why: string };

export function mooncakeRequest(params: KvTransferParams | null | undefined): MooncakeRequest {
  if (!params) return { kind: "none" };
  if (params.do_remote_prefill) {
    const { transfer_id: transferId, remote_bootstrap_addr: bootstrapAddr, remote_engine_id: engineId } = params;
    if (transferId == null || bootstrapAddr == null || engineId == null)
      return { kind: "invalid", why: "do_remote_prefill needs remote_engine_id, remote_bootstrap_addr and transfer_id" };
    return { kind: "receive", transferId, bootstrapAddr, engineId };
  }
  if (params.do_remote_decode) {
    if (!params.transfer_id) return { kind: "invalid", why: "Missing transfer_id in kv_transfer_params from router" };
    return { kind: "send", transferId: params.transfer_id };
  }
  return { kind: "none" };
}
