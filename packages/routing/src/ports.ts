// What routing asks of whoever runs it: the EPP implements these over its live index, worker set and
// Prometheus metrics; the trace simulation over its simulated workers, in virtual time. Routing itself
// opens no socket, starts no timer of its own and reads no flag.
import type { KvIndex } from "@kv-epp/index-wasm";
import type { DisaggReason } from "./disagg.ts";
import type { LoraAdapters } from "./lora.ts";
import type { WorkerRef, WorkerRole } from "@kv-epp/protocol";

/**
 * A worker rank the gateway can route to: its key in the index, the endpoint the gateway calls, the rank
 * header it gets, and its worker's role in prefill/decode disaggregation (absent: a destination only).
 */
export type Candidate = WorkerRef & { key: string; endpoint: string; rankHeader: number | undefined; role?: WorkerRole };

/** One model's index: its key (which also scopes its prefix keys), its block size, the index itself. */
export type ModelIndex = { key: string; blockSize: number; index: KvIndex };

/** Where the picker finds a request model's index, and the LoRA adapter the model names (absent: none ever does). */
export type IndexLookup = { lookup(model?: string): ModelIndex | undefined; adapterOf?(model?: string): string | null };

/**
 * What a rank's engine says of itself beside the load routing counts: its queue (vLLM's num_requests_waiting)
 * and, when it serves LoRA adapters, which it runs and queues (vLLM's lora_requests_info; absent: not reported).
 */
export type WorkerSignals = { waiting: number; lora?: LoraAdapters };

/**
 * Why a routed request's response is not compared with its prediction: `batched_prompts`, its usage adds up a batch's
 * prompts; `cache_namespace`, it was routed by load into a cache namespace no event names (SGLang's extra_key).
 */
export type UnscoredReason = "batched_prompts" | "cache_namespace";

/** Time as the runner keeps it: wall time in the EPP, virtual time in the simulation. */
export type Clock = {
  /** ms, monotonic. */
  now(): number;
  /**
   * Runs `fn` after `ms` unless the returned cancel runs first (absent: the runner keeps no timers; nothing is
   * scheduled). A request that is answered cancels its deadline, so no timer outlives it.
   */
  after?(ms: number, fn: () => void): () => void;
};

/** The few figures routing records; the EPP exports them to Prometheus, the simulation drops them. */
export interface RoutingMetrics {
  /** A request routed: the share of its blocks the chosen rank was counted to hold (absent: no full block). */
  routed(overlapRatio: number | undefined): void;
  /** This replica's requests in flight, after each change. */
  inflight(n: number): void;
  /** The data plane reported another endpoint served the request: its load moved, or the endpoint is unknown. */
  servedElsewhere(result: "moved" | "unknown_endpoint"): void;
  /** A response that is not compared with its prediction, and why. */
  unscored(reason: UnscoredReason): void;
  /** A response reported its cached tokens: the prediction's error (predicted - reported), and whether it is off by more than a block. */
  cachedTokens(rank: WorkerRef, error: number, mispredicted: boolean): void;
  /** A streamed response's first token came `seconds` after its decision. */
  observedTtft(rank: WorkerRef, seconds: number): void;
  /** In a pool with prefill ranks: the decider's verdict on a routed request, and why. */
  disaggregation(disaggregated: boolean, reason: DisaggReason): void;
  /** The rank left the pool: its figures go (a pod gone for good would keep its series forever). */
  forgetRank(rank: WorkerRef): void;
}

/** Records nothing (the simulation, tests). */
export const NO_METRICS: RoutingMetrics = {
  routed() {},
  inflight() {},
  servedElsewhere() {},
  unscored() {},
  cachedTokens() {},
  observedTtft() {},
  disaggregation() {},
  forgetRank() {},
};
