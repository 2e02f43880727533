// Prefill/decode disaggregation as llm-d's P/D path spells it: a worker's role (its pod label), and the
// request headers an EPP answers with for the decode side's sidecar to read.
import { apiOfPath, type ApiPath } from "./api-path.ts";

/**
 * What a worker does in disaggregated serving: `prefill` computes prompts for other workers (it is only
 * ever named in `x-prefiller-host-port`, never a destination); `decode` is a destination that prefills
 * locally unless told of a prefill worker; `both` is either. A worker with no role is a destination
 * only, as llm-d's decode filter takes an unlabelled pod, so a pool without roles routes as before.
 */
export type WorkerRole = "prefill" | "decode" | "both";
export const WORKER_ROLES: readonly WorkerRole[] = ["prefill", "decode", "both"];

/** The pod label llm-d names a model server's role by (Kubernetes mode reads it; so may a static entry's `role`). */
export const ROLE_LABEL = "llm-d.ai/role";

/**
 * A role from the label's value: `prefill`, `decode`, `prefill-decode` (and `both`, llm-d's deprecated
 * spelling of it). undefined for anything else, encode roles included (the caller says it ignored it).
 */
export function roleOfLabel(value: string | undefined): WorkerRole | undefined {
  switch (value) {
    case "prefill":
    case "decode":
      return value;
    case "prefill-decode":
    case "both":
      return "both";
    default:
      return undefined;
  }
}

/** A destination of whole requests (and of the decode half of disaggregated ones). */
export function decodes(role: WorkerRole | undefined): boolean {
  return role !== "prefill";
}

/** May be named as the prefill worker of a disaggregated request. */
export function prefills(role: WorkerRole | undefined): boolean {
  return role === "prefill" || role === "both";
}

/**
 * The prefill worker's API server (`ip:port`), on a request routed to a decode worker whose sidecar
 * runs the prefill there first (llm-d's pkg/common/routing PrefillEndpointHeader). Absent: the decode
 * worker prefills locally.
 */
export const PREFILLER_HOST_PORT_HEADER = "x-prefiller-host-port";

/**
 * kv-epp's own, beside it: the prefill rank's `x-data-parallel-rank` on that server, when the server
 * fronts several ranks (vLLM's internal or hybrid DP load balancing). llm-d's sidecar does not read it
 * (its prefill leg is a copy of the request, with the decode rank's header); a sidecar that does sets
 * it as the prefill request's x-data-parallel-rank.
 */
export const PREFILL_RANK_HEADER = "x-kv-epp-prefill-data-parallel-rank";

/**
 * The APIs the decode side's sidecar runs in two legs (prefill worker, then decode worker), as llm-d's sidecar
 * does: OpenAI completions, chat and Responses, Anthropic Messages and vLLM's token-in generate. Any other path
 * goes to the decode worker whole, so an EPP names a prefill worker only for these.
 */
export const PD_SPLIT_PATHS = ["/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/messages", "/inference/v1/generate"] as const satisfies readonly ApiPath[];

export type PdSplitPath = (typeof PD_SPLIT_PATHS)[number];

/** The split API a request's `:path` names (by apiOfPath's rule), or undefined for a path the sidecar passes through whole. */
export function splitPath(path: string | undefined): PdSplitPath | undefined {
  const api = apiOfPath(path);
  return PD_SPLIT_PATHS.find((p) => p === api);
}
