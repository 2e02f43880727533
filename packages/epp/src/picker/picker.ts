// Picks the worker for a request: local block hashes (WASM) -> overlap per worker from the model's
// index -> cost per eligible candidate (picker/cost.ts) -> choice.
import { computeBlockHashes, MatchList } from "@kv-epp/index-wasm";
import type { Indexer, Indexers } from "../indexer.ts";
import type { Candidate } from "../workers/registry.ts";
import { choose, cost, type Weights } from "./cost.ts";
import type { LoadView } from "./load.ts";
import type { WorkerMetrics } from "./worker-metrics.ts";

export type PickerOptions = Weights & {
  /** A worker with more scraped waiting requests than this is skipped unless all are (0: off). */
  queueThreshold: number;
};

export type PickRequest = {
  model?: string;
  tokens: Uint32Array;
  /** Endpoints (ip:port) the gateway allows for this request (GAIE subset hint). */
  subset?: ReadonlySet<string>;
  /** Include every worker's overlap and tree size in the decision (POST /select); costs two Maps. */
  detail?: boolean;
};

type Match = { requestBlocks: number; scores: Map<string, number>; treeSizes: Map<string, number> };

export type ScoredCandidate = { candidate: Candidate; overlap: number; cost: number };

export type Decision =
  | {
      kind: "picked";
      chosen: ScoredCandidate;
      model: string;
      blockSize: number;
      requestBlocks: number;
      /** With `detail`: overlap blocks per worker key, as the index reported them (all workers, not only candidates). */
      scores?: Map<string, number>;
      treeSizes?: Map<string, number>;
      scored: ScoredCandidate[];
    }
  | { kind: "no_endpoint"; reason: "no_workers" | "subset_empty" | "unknown_model" };

export class Picker {
  readonly #list = new MatchList();
  /** Overlap by worker key for the pick in progress (cleared and refilled: no Map per request). */
  readonly #overlaps = new Map<string, number>();

  constructor(
    private readonly deps: {
      indexers: Indexers;
      candidates: () => readonly Candidate[];
      /** In-flight load per worker: this replica's own plus what its siblings attributed (replica-agg). */
      load: LoadView;
      workerMetrics: (workerId: string) => WorkerMetrics | undefined;
      options: PickerOptions;
      random?: () => number;
    },
  ) {}

  /** Pure decision: records no load (the caller acquires a lease for a real routing). */
  pick(req: PickRequest): Decision {
    const indexer = this.deps.indexers.lookup(req.model);
    if (!indexer) return { kind: "no_endpoint", reason: "unknown_model" };
    let candidates = this.deps.candidates();
    if (candidates.length === 0) return { kind: "no_endpoint", reason: "no_workers" };
    if (req.subset) {
      const subset = req.subset;
      candidates = candidates.filter((c) => subset.has(c.endpoint));
      if (candidates.length === 0) return { kind: "no_endpoint", reason: "subset_empty" };
    }
    candidates = this.#queueFilter(candidates);

    // The request path allocates no match Maps: findMatchesInto fills the reused list, read here at once.
    const requestBlocks = this.#matchInto(indexer, req.tokens);
    const overlaps = this.#overlaps;
    overlaps.clear();
    const list = this.#list;
    for (let i = 0; i < list.count; i++) overlaps.set(list.keys[i]!, list.scores[i]!);
    const o = this.deps.options;
    const scored: ScoredCandidate[] = candidates.map((candidate) => {
      const overlap = overlaps.get(candidate.key) ?? 0;
      const waiting = o.queueWeight > 0 ? (this.deps.workerMetrics(candidate.workerId)?.waiting ?? 0) : 0;
      const activeBlocks = this.deps.load.blocks(candidate.key);
      return { candidate, overlap, cost: cost(o, requestBlocks, { overlap, activeBlocks, waiting }) };
    });
    const i = choose(
      scored.map((s) => s.cost),
      o.temperature,
      this.deps.random ?? Math.random,
    );
    return {
      kind: "picked",
      chosen: scored[i]!,
      model: indexer.key,
      blockSize: indexer.blockSize,
      requestBlocks,
      ...(req.detail ? list.toMaps() : {}),
      scored,
    };
  }

  /** Overlap per worker for the request's tokens, read-only (POST /score). */
  score(model: string | undefined, tokens: Uint32Array): (Match & { indexer: Indexer }) | undefined {
    const indexer = this.deps.indexers.lookup(model);
    return indexer ? { indexer, ...this.#match(indexer, tokens) } : undefined;
  }

  #match(indexer: Indexer, tokens: Uint32Array): Match {
    const requestBlocks = this.#matchInto(indexer, tokens);
    return { requestBlocks, ...this.#list.toMaps() };
  }

  /** Fills the reused MatchList (valid until the next call); returns the request's full blocks. */
  #matchInto(indexer: Indexer, tokens: Uint32Array): number {
    const hashes = computeBlockHashes(tokens, indexer.blockSize);
    if (hashes.length > 0) indexer.index.findMatchesInto(hashes, this.#list);
    else this.#list.count = 0;
    return hashes.length;
  }

  #queueFilter(candidates: readonly Candidate[]): readonly Candidate[] {
    const threshold = this.deps.options.queueThreshold;
    if (threshold <= 0) return candidates;
    const under = candidates.filter((c) => (this.deps.workerMetrics(c.workerId)?.waiting ?? 0) <= threshold);
    return under.length > 0 ? under : candidates;
  }
}
