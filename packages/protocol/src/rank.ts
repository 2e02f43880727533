// A worker rank, the unit everything routes to and indexes by, and its one string key.
import type { WorkerRole } from "./disagg.ts";
import { rankEndpoint } from "./endpoint.ts";

/** One engine rank: the worker (vLLM instance, by id) and its global data-parallel rank. */
export type WorkerRef = { readonly workerId: string; readonly dpRank: number };

/**
 * The map key of a rank: `${workerId}\u0000${dpRank}`. NUL cannot occur in a worker id taken from
 * config, a pod name or an intent, so the key splits back without escaping (parseWorkerKey).
 */
export function workerKey(w: WorkerRef): string {
  return workerKeyOf(w.workerId, w.dpRank);
}

/** workerKey without building a WorkerRef (hot paths that hold the two fields apart). */
export function workerKeyOf(workerId: string, dpRank: number): string {
  return `${workerId}\u0000${dpRank}`;
}

export function parseWorkerKey(key: string): WorkerRef {
  const cut = key.lastIndexOf("\u0000");
  if (cut < 0) throw new Error(`not a worker key: ${JSON.stringify(key)}`);
  return { workerId: key.slice(0, cut), dpRank: Number(key.slice(cut + 1)) };
}

/**
 * Where one rank's KV events are read: its PUB endpoint, its replay (ROUTER) endpoint, the topic its
 * publisher uses (absent: the reader's default), whether the reader binds instead of dialing, and the
 * block size its intent states (absent: the model's).
 */
export type RankSource = {
  dpRank: number;
  kvEvents: string;
  replay?: string;
  topic?: string;
  bind?: boolean;
  blockSize?: number;
};

/**
 * vLLM's data-parallel load-balancing mode, which decides how an API server numbers the ranks named by
 * `x-data-parallel-rank` (vllm/v1/engine/core_client.py: `core_engines[request.data_parallel_rank]`
 * over the engines the server manages; input_processor.py checks the range):
 * - `internal` (the default): one API server, the head node's, fronts every rank, numbered globally
 *   0 .. dp_size - 1;
 * - `hybrid` (`--data-parallel-hybrid-lb`): one API server per node fronts that node's ranks
 *   `--data-parallel-start-rank` .. + `--data-parallel-size-local` - 1, numbered from 0 on it;
 * - `external` (`--data-parallel-external-lb`): one API server per rank (local size 1).
 * KV-event ports follow the global rank in every mode.
 */
export type DpLbMode = "internal" | "hybrid" | "external";
export const DP_LB_MODES: readonly DpLbMode[] = ["internal", "hybrid", "external"];

/**
 * One API server of a worker and the DP ranks it serves. vLLM's external DP load balancing runs one
 * API server per rank (rank r on targetPorts[r]), each its own endpoint for the gateway.
 */
export type ApiServer = { address: string; ranks: readonly number[] };

/**
 * A model-server pod (or static entry). Its ranks are dpStartRank .. dpStartRank + dpSize - 1 (global
 * ranks: vLLM numbers a multi-node DP group's ranks across nodes); rank r publishes KV events on
 * kvEvents port + r, as vLLM's offset_endpoint_port offsets by the global rank.
 */
export type WorkerSpec = {
  id: string;
  /** ip:port the gateway is told to call (the first API server's when there are several). */
  address: string;
  /** Several API servers (an InferencePool with several targetPorts); absent: every rank behind `address`. */
  servers?: readonly ApiServer[];
  kvEvents: string;
  replay?: string;
  dpSize: number;
  /** Global rank of the first rank (absent: 0). */
  dpStartRank?: number;
  /** The EPP binds kvEvents (port + rank) and the worker's publishers connect to it; absent: the EPP dials. */
  kvBind?: boolean;
  /** vLLM Prometheus endpoint, scraped for running/waiting/KV usage. */
  metricsUrl: string;
  /**
   * Ranks behind target ports the pod's active-ports annotation leaves out (numbered as `servers` numbers them):
   * not endpoints, so intents stating them do not add them back.
   */
  inactiveRanks?: readonly number[];
  /** Per-rank KV sources stated by attachment intents; overrides port + r. */
  ranks?: RankSource[];
  /** Its role in disaggregated serving (absent: a destination only; see WorkerRole). */
  role?: WorkerRole;
};

/** A worker's ranks: as its intents state them, else global ranks start..start+dpSize-1 on port + r. */
export function rankSources(spec: WorkerSpec): RankSource[] {
  const start = spec.dpStartRank ?? 0;
  return (
    spec.ranks ??
    Array.from({ length: spec.dpSize }, (_, i) => ({
      dpRank: start + i,
      kvEvents: rankEndpoint(spec.kvEvents, start + i),
      replay: spec.replay ? rankEndpoint(spec.replay, start + i) : undefined,
      ...(spec.kvBind ? { bind: true } : {}),
    }))
  );
}
