import type { KvIndex } from "@kv-epp/index-wasm";
import type { ActiveLoad, Candidate, Clock, EvictionRegret, LatencySettings, LoadView, PendingView, ReplicaSet, Weights } from "@kv-epp/routing";
import type { SimRequest } from "../sim/request.ts";
import type { SimWorker } from "../sim/worker.ts";

export const POLICY_NAMES = ["kv-aware", "kv-latency", "round-robin", "random", "least-loaded", "approx-prefix", "exact-index", "ttft-oracle"] as const;
export type PolicyName = (typeof POLICY_NAMES)[number];

/** What one router replica knows and may use. */
export type ReplicaContext = {
  workers: readonly SimWorker[];
  /** index-wasm worker keys, by worker position */
  workerKeys: readonly string[];
  /** the workers as routing's candidates, by worker position (endpoint = worker key) */
  candidates: readonly Candidate[];
  /** virtual time */
  clock: Clock;
  random: () => number;
  /**
   * this replica's own routing decisions (leases taken at pick, released at finish); with in-flight
   * prefixes its `pending` holds the prefixes of the requests they lease
   */
  ownLoad: ActiveLoad;
  /** the in-flight prefixes it reads: its own requests' and, with replica-agg, its peers' as delivered */
  pending?: PendingView;
  /** the model's index key: scopes the in-flight prefix keys as the EPP's indexer key does */
  modelKey: string;
  /** the load it picks on: its own, plus its peers' as replica-agg delivers them when that is on */
  load: LoadView;
  /** the KV index fed by the workers' KV events (every replica subscribes to every worker) */
  index: KvIndex;
  weights: Weights;
  /** the latency cost's settings (the EPP's --latency-* options) */
  latency: LatencySettings;
  /** this replica and the peers it follows over replica-agg, as the EPP's picker reads them (absent: no replica-agg) */
  replicas?: () => ReplicaSet;
  /** the eviction regret read from the same KV events as the index (every replica sees the same) */
  regret: EvictionRegret;
  /** the EPP's --queue-threshold (0: off) */
  queueThreshold: number;
  blockSize: number;
  capacityBlocks: number;
  /** the EPP's --pd-threshold-tokens, for a pool whose candidates carry roles */
  pdThresholdTokens?: number;
};

/** One router replica under some policy. */
export interface Router {
  /** Worker position for this request. */
  pick(req: SimRequest): number;
  /** The request was sent to `worker` (after pick). */
  routed?(req: SimRequest, worker: number): void;
  /** The request's first token came back (the EPP sees its first response byte). */
  firstToken?(req: SimRequest): void;
  /** The request's response ended on `worker`: its TTFT and cached tokens, as the EPP reads them from it. */
  finished?(req: SimRequest, worker: number, seen: { ttftMs: number; cachedTokens: number }): void;
  /** Leading blocks of the last picked request it believes `worker` holds (what llm-d's P/D decider reads). */
  matchedBlocks?(worker: number): number;
  /** In a pool with roles, the prefill worker its last pick named (undefined: the destination prefills). */
  prefillWorker?(): number | undefined;
}

export type PolicySpec = {
  name: PolicyName;
  /** one line for the report: what the policy knows */
  knows: string;
  /** whether it reads the load of its routing decisions (so replica-agg changes it) */
  usesRouterLoad: boolean;
  /** whether it reads the KV index (so the run must feed one) */
  usesIndex: boolean;
  create(ctx: ReplicaContext): Router;
};
