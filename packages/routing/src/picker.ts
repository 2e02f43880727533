// Picks the worker for a request: local block hashes (WASM) -> overlap per worker from the model's
// index, and the leading blocks pending there (pending.ts) -> the decision (decide.ts:
// filters, cost per eligible candidate, choice).
import { computeBlockHashes, MatchList, requestBlockExtras } from "@kv-epp/index-wasm";
import { prefixLeadLoss, type Weights } from "./cost.ts";
import { decide, overlapOf, ttftInput, type CandidateState } from "./decide.ts";
import { decideDisagg, roleSets, type Disaggregation } from "./disagg.ts";
import { AwayWorkers, type ReplicaSet } from "./home.ts";
import type { CostInput, LatencyModel } from "./latency.ts";
import type { LoadView } from "./load.ts";
import { prefixKeys, type PendingView, type PrefixKeys } from "./pending.ts";
import { affinityOf } from "./lora.ts";
import { planCost } from "./plan.ts";
import type { Candidate, IndexLookup, ModelIndex, WorkerSignals } from "./ports.ts";

/** `weights`: Weights in their shape (score or blocks); `latency`: the lowest predicted TTFT (latency.ts). */
export type CostModel = "weights" | "latency";

/** The EPP's default: the latency cost wins on both bench:trace traces (packages/epp/README.md, "Latency-aware cost"). */
export const DEFAULT_COST: CostModel = "latency";

export type PickerOptions = Weights & {
  /** A worker with more scraped waiting requests than this is skipped unless all are (0: off). */
  queueThreshold: number;
  /** Absent: weights. */
  cost?: CostModel;
  /**
   * In a pool with prefill ranks (disagg.ts): a request is disaggregated when the decode rank it goes to
   * would prefill at least this many tokens itself (0 or absent: never).
   */
  pdThresholdTokens?: number;
};

export type PickRequest = {
  model?: string;
  /** vLLM's cache_salt of the request: folded into its first block. */
  cacheSalt?: string;
  tokens: Uint32Array;
  /**
   * The prompt's length when `tokens` is only its known prefix (tokenization past its budget): an estimate. The
   * prefix is matched; the request is charged (load, predicted TTFT, the prefill/decode split) for this length.
   */
  promptTokens?: number;
  /**
   * With `promptTokens`: of those, the tokens at the end no worker holds yet, most likely (a chat's turn from its
   * last reply on, see newTurnChars), estimated. A candidate alone holding the whole known prefix may hold
   * everything before them (the conversation so far): its lease counts only them as prefill still to do
   * (Decision.newTurnBlocks).
   */
  newTurnTokens?: number;
  /** The tokens' local block hashes in the request's identity, when the caller has them already (the simulation). */
  hashes?: BigUint64Array;
  /** Pod IPs (every endpoint of the pod) or `ip:port` endpoints the request may go to (GAIE subset hint). */
  subset?: ReadonlySet<string>;
  /** Include every worker's overlap and tree size in the decision (POST /select); costs two Maps. */
  detail?: boolean;
  /**
   * False: the decode side's sidecar passes the request's path through whole (@kv-epp/protocol's
   * splitPath), so it is a plain decode pick, never disaggregated. Absent: split.
   */
  pathSplit?: boolean;
};

type Match = { requestBlocks: number; scores: Map<string, number>; treeSizes: Map<string, number> };

export type ScoredCandidate = {
  candidate: Candidate;
  /** Leading blocks the decision counted as cached: the index's overlap or the pending one, the longer. */
  overlap: number;
  /**
   * The overlap reaches the end of the tokens the pick was given, which were a known prefix of a longer prompt
   * (`PickRequest.promptTokens`): the candidate may hold more of the prompt than `overlap` says.
   */
  openEnded: boolean;
  /** Leading blocks pending on the candidate (requests routed there, not yet ended); 0 without in-flight prefixes. */
  pendingOverlap: number;
  cost: number;
  /** Scraped waiting requests at the pick. */
  waiting: number;
  /** Of those, the ones beyond the requests the load holds as prefilling there: the latency model's queue term. */
  unexplainedWaiting: number;
  /** Prefill tokens ahead of the request on the candidate at the pick (its load's prefill blocks x block size). */
  aheadTokens: number;
  /** The latency model's TTFT for this request on this worker, ms. */
  predictedTtftMs: number;
  /** How well the candidate fits the request's LoRA adapter as charged (lora.ts; 0 when it reports none); absent: no charge. */
  loraAffinity?: number;
};

/** A registry candidate with what the decision reads about it, and what its TTFT is predicted from (once per pick). */
type Known = CandidateState & { ref: Candidate; ttft: CostInput };

/**
 * A pick in a pool with prefill ranks: the decider's verdict on the destination (`chosen`, a decode
 * rank) and, when it disaggregates, the prefill rank the gateway's header names.
 */
export type PrefillDecision = {
  disagg: Disaggregation;
  /** The prefill rank and the prefill candidates as scored: present exactly when `disagg.disaggregate`. */
  prefill?: { chosen: ScoredCandidate; scored: ScoredCandidate[] };
};

/** What besides its tokens names a request's blocks. */
type Identity = { loraName: string | null; cacheSalt?: string };

export type Decision =
  | {
      kind: "picked";
      chosen: ScoredCandidate;
      model: string;
      blockSize: number;
      requestBlocks: number;
      promptTokens: number;
      /** PickRequest.newTurnTokens in blocks (rounded up, at least one), when given. */
      newTurnBlocks?: number;
      /** With `detail`: overlap blocks per worker key, as the index reported them (all workers, not only candidates). */
      scores?: Map<string, number>;
      treeSizes?: Map<string, number>;
      scored: ScoredCandidate[];
      /** The request's prefix keys, for the lease to record as pending on the chosen rank (with in-flight prefixes). */
      prefix?: PrefixKeys;
      /** Only in a pool with prefill ranks: whether (and where) the request's prefill runs apart from `chosen`. */
      pd?: PrefillDecision;
    }
  | { kind: "no_endpoint"; reason: "no_workers" | "subset_empty" | "unknown_model" };

export type PickerDeps = {
  indexers: IndexLookup;
  candidates: () => readonly Candidate[];
  /** In-flight load per worker: this replica's own plus what its peers attributed (replica-agg). */
  load: LoadView;
  /** What the rank's engine says of its queue (the EPP: its API server's scraped /metrics, that engine's series). */
  signals: (c: Candidate) => WorkerSignals | undefined;
  options: PickerOptions;
  /** Predicts each candidate's TTFT (the latency cost, and what a decision explains). */
  latency: LatencyModel;
  /** In-flight prefixes of this replica's routed requests (absent: the index's overlap alone). */
  pending?: PendingView;
  /** This replica and the peers it follows over replica-agg (absent or no peers: every worker is home). */
  replicas?: () => ReplicaSet | undefined;
  random?: () => number;
};

export class Picker {
  private readonly list = new MatchList();
  /** Overlap by worker key for the pick in progress (cleared and refilled: no Map per request). */
  private readonly overlaps = new Map<string, number>();
  /** Pending prefix blocks by worker key, likewise reused. */
  private readonly pendingOverlaps = new Map<string, number>();

  private readonly deps: PickerDeps;
  private readonly away = new AwayWorkers();
  /** The prefill ranks' home share (a set of its own, so the two sets do not evict each other's). */
  private readonly prefillAway = new AwayWorkers();

  constructor(deps: PickerDeps) {
    this.deps = deps;
  }

  /** Pure decision: records no load (the caller acquires a lease for a real routing). */
  pick(req: PickRequest): Decision {
    const indexer = this.deps.indexers.lookup(req.model);
    if (!indexer) return { kind: "no_endpoint", reason: "unknown_model" };
    const all = this.deps.candidates();
    // Roles split the pool into destinations and prefill ranks; a pool without prefill ranks is one set, as before.
    const sets = roleSets(all);
    const candidates = sets ? sets.decode : all;
    if (candidates.length === 0) return { kind: "no_endpoint", reason: "no_workers" };
    const promptTokens = Math.max(req.promptTokens ?? 0, req.tokens.length);

    // The request path allocates no match Maps: findMatchesInto fills the reused list, read here at once.
    const id = this.identity(req.model, req.cacheSalt);
    const pendingView = this.deps.pending;
    let prefix: PrefixKeys | undefined;
    let requestBlocks: number;
    if (pendingView || req.hashes) {
      // The prefix keys chain the request's local hashes, so they are hashed here once and the index
      // is queried with them (instead of hashing inside the index's module).
      const hashes = req.hashes ?? this.hashes(indexer, req.tokens, id);
      requestBlocks = hashes.length;
      if (requestBlocks > 0) indexer.index.findMatchesInto(hashes, this.list);
      else this.list.count = 0;
      if (pendingView) {
        prefix = prefixKeys(indexer.key, hashes);
        pendingView.overlapsInto(prefix, this.pendingOverlaps);
      }
    } else requestBlocks = this.matchInto(indexer, req.tokens, id);
    // Past the known prefix every block is uncached everywhere: it counts for the load, not for the overlap.
    requestBlocks = Math.max(requestBlocks, Math.floor(promptTokens / indexer.blockSize));
    const overlaps = this.overlaps;
    overlaps.clear();
    const list = this.list;
    for (let i = 0; i < list.count; i++) overlaps.set(list.keys[i]!, list.scores[i]!);
    const pendingOverlaps = this.pendingOverlaps;
    const bs = indexer.blockSize;
    const knownOf = (prefillSide: boolean) => (ref: Candidate): Known => {
      const load = this.deps.load.of(ref.key);
      const signals = this.deps.signals(ref);
      const c = {
        ref,
        endpoint: ref.endpoint,
        overlap: overlaps.get(ref.key) ?? 0,
        pendingOverlap: pendingView ? (pendingOverlaps.get(ref.key) ?? 0) : 0,
        // A prefill rank is loaded by the prompts it still has to compute: its in-flight prefill tokens.
        activeBlocks: prefillSide ? load.prefillBlocks : load.blocks,
        activeRequests: prefillSide ? load.prefillRequests : load.requests,
        prefillBlocks: load.prefillBlocks,
        prefillRequests: load.prefillRequests,
        waiting: signals?.waiting ?? 0,
        loraAffinity: affinityOf(signals?.lora, id.loraName),
      };
      // Added in place, not spread into a copy of the candidate: this runs per candidate per pick.
      return Object.assign(c, { ttft: ttftInput(c, promptTokens, bs) });
    };
    const known = candidates.map(knownOf(false));
    const o = this.deps.options;
    const latency = this.deps.latency;
    // The whole prompt's prefill at the pool's rate: what the latency cost charges a rank that cannot take the adapter.
    const prefillMs = latency.params().msPerToken * promptTokens;
    let destinationCost: ((c: Known) => number) | undefined;
    // The prefill ranks' states, when the latency cost read them: the prefill pick reads the same ones.
    let prefillRanks: Known[] | undefined;
    // The prefill ranks' latency cost, likewise: the plan prices them, and the prefill pick decides on it.
    let prefillCost: ((c: Known) => number) | undefined;
    if (o.cost === "latency") {
      const local = this.latencyCost(candidates, this.away);
      // A path not split is prefilled where it goes: the destination's own cost, no plan.
      if (sets && req.pathSplit !== false) {
        prefillRanks = sets.prefill.map(knownOf(true));
        prefillCost = this.latencyCost(sets.prefill, this.prefillAway);
        const thresholdTokens = o.pdThresholdTokens ?? 0;
        const msPerToken = latency.params().msPerToken;
        destinationCost = planCost({ promptTokens, blockSize: bs, thresholdTokens, msPerToken, prefillRanks, prefillCosts: prefillRanks.map(prefillCost) }, local);
      } else destinationCost = local;
    }
    const d = decide({
      requestBlocks,
      candidates: known,
      subset: req.subset,
      weights: o,
      queueThreshold: o.queueThreshold,
      random: this.deps.random ?? Math.random,
      latency: destinationCost,
      prefillMs,
    });
    if (d.kind === "none") return { kind: "no_endpoint", reason: d.reason };
    const knownBlocks = Math.floor(req.tokens.length / bs);
    // A known prefix without a full block (a fallback) says nothing of what a candidate holds: not open-ended.
    const prefixOnly = promptTokens > req.tokens.length;
    // `lora`: the decision charged the adapter's fit, a rank that reports none counted as no fit (decide()).
    const scoredOf = (s: { candidate: Known; cost: number }, lora: boolean): ScoredCandidate => ({
      candidate: s.candidate.ref,
      overlap: overlapOf(s.candidate),
      openEnded: prefixOnly && knownBlocks > 0 && overlapOf(s.candidate) >= knownBlocks,
      pendingOverlap: s.candidate.pendingOverlap ?? 0,
      cost: s.cost,
      waiting: s.candidate.waiting,
      unexplainedWaiting: s.candidate.ttft.waiting,
      aheadTokens: s.candidate.ttft.aheadTokens,
      predictedTtftMs: latency.predictTtftMs(s.candidate.ttft),
      loraAffinity: lora ? (s.candidate.loraAffinity ?? 0) : undefined,
    });
    const scored = d.scored.map((s) => scoredOf(s, d.lora));
    let pd: PrefillDecision | undefined;
    if (sets) {
      // Decode first (llm-d's order): the decider reads what the chosen destination holds. A prefill on
      // the destination's own worker would be a local prefill with a detour, so that worker is left out.
      const decodeWorker = d.chosen.candidate.ref.workerId;
      const others = sets.prefill.filter((c) => c.workerId !== decodeWorker);
      const disagg = decideDisagg({
        promptTokens,
        decodeOverlap: overlapOf(d.chosen.candidate),
        blockSize: bs,
        thresholdTokens: o.pdThresholdTokens ?? 0,
        prefillCandidates: others.length,
        pathSplit: req.pathSplit,
      });
      pd = { disagg };
      if (disagg.disaggregate) {
        const p = decide({
          requestBlocks,
          candidates: prefillRanks ? prefillRanks.filter((c) => c.ref.workerId !== decodeWorker) : others.map(knownOf(true)),
          weights: o,
          queueThreshold: o.queueThreshold,
          random: this.deps.random ?? Math.random,
          // The home share is dealt over every prefill rank, so it does not change with the decode pick.
          latency: prefillCost,
          prefillMs,
        });
        if (p.kind === "chosen") pd.prefill = { chosen: scoredOf(p.chosen, p.lora), scored: p.scored.map((s) => scoredOf(s, p.lora)) };
        else pd.disagg = { ...disagg, disaggregate: false, reason: "no_prefill_worker" };
      }
    }
    return {
      kind: "picked",
      chosen: scoredOf(d.chosen, d.lora),
      model: indexer.key,
      blockSize: indexer.blockSize,
      requestBlocks,
      promptTokens,
      // At least a block: the last one is computed whatever is cached (vLLM's last-token rule).
      ...(req.newTurnTokens !== undefined ? { newTurnBlocks: Math.max(1, Math.ceil(req.newTurnTokens / bs)) } : {}),
      ...(req.detail ? list.toMaps() : {}),
      scored,
      prefix,
      ...(pd ? { pd } : {}),
    };
  }

  /** The latency cost per candidate, with the home share's charge over `candidates` (only this cost reads the replica set). */
  private latencyCost(candidates: readonly Candidate[], home: AwayWorkers): (c: Known) => number {
    const away = home.of(candidates, this.deps.replicas?.());
    const latency = this.deps.latency;
    return (c) => latency.costMs(c.ttft, away(c.ref.key));
  }

  /**
   * Whether `req.tokens`, a known prefix of a request's prompt (charged as `req.promptTokens`, the whole prompt's
   * estimated length), settles its pick already: the pick on this prefix is the pick on the whole prompt, so the
   * rest need not be tokenized. Either of two reasons:
   * - one of its full blocks is held by no worker and is in no in-flight prefix: no later token lengthens any
   *   candidate's overlap (an overlap is a chain of leading blocks);
   * - the pick on the prefix chooses, at a cost strictly below every other candidate's, the only candidate holding
   *   all of it: later tokens can lengthen its overlap alone, and no cost (either shape, or the latency cost)
   *   rises with a candidate's own overlap, so it stays chosen. A long conversation whose earlier turns one worker
   *   holds is then routed once its known prefix reaches past what the others share (a system prompt), not after
   *   its whole history is tokenized. A few terms move with the prompt's length, which `promptTokens` may misjudge
   *   either way, so the chosen candidate's lead must hold at any length: under the score shape the prefix term's
   *   share (its divisor, the request's blocks, grows up to the cap) is taken at the cap (cost.ts prefixLeadLoss);
   *   the LoRA charge (decide.ts) and, under the latency cost, the away charge (home.ts) grow with the prompt, so
   *   no other candidate may fit the request's adapter better than the chosen one, nor be home when the chosen one
   *   is away: each other's charge then exceeds the chosen one's by an amount a longer prompt only widens. Not
   *   where the choice is sampled (a temperature), nor in a pool with prefill ranks (whether to split a request
   *   reads its destination's overlap against the whole prompt).
   * The chosen candidate's overlap is then a lower bound (`ScoredCandidate.openEnded`).
   */
  settles(req: PickRequest): boolean {
    const indexer = this.deps.indexers.lookup(req.model);
    if (!indexer) return true; // no endpoint, whatever follows
    const n = Math.floor(req.tokens.length / indexer.blockSize);
    if (n === 0) return false;
    const hashes = this.hashes(indexer, req.tokens, this.identity(req.model, req.cacheSalt));
    indexer.index.findMatchesInto(hashes, this.list);
    let longest = 0;
    for (let i = 0; i < this.list.count; i++) longest = Math.max(longest, this.list.scores[i]!);
    if (this.deps.pending && longest < n) {
      this.deps.pending.overlapsInto(prefixKeys(indexer.key, hashes), this.pendingOverlaps);
      for (const v of this.pendingOverlaps.values()) longest = Math.max(longest, v);
    }
    if (longest < n) return true;
    if (this.deps.options.temperature > 0 || roleSets(this.deps.candidates())) return false;
    const d = this.pick({ ...req, hashes, detail: false });
    if (d.kind !== "picked") return true;
    const { chosen, scored } = d;
    const o = this.deps.options;
    const fit = chosen.loraAffinity ?? 0;
    // The terms that move with the prompt's length, which `promptTokens` may misjudge (see above).
    const shape = o.cost !== "latency" && o.shape?.kind === "score" ? o.shape : undefined;
    const away = o.cost === "latency" ? this.away.of(this.deps.candidates(), this.deps.replicas?.()) : () => false;
    const awayChosen = away(chosen.candidate.key);
    const loss = (s: ScoredCandidate) => (shape ? prefixLeadLoss(shape, d.requestBlocks, chosen.overlap, s.overlap) : 0);
    return scored.every(
      (s) =>
        s.candidate.key === chosen.candidate.key ||
        (s.cost - loss(s) > chosen.cost && s.overlap < n && (s.loraAffinity ?? 0) <= fit && (away(s.candidate.key) || !awayChosen)),
    );
  }

  /** Overlap per worker for the request's tokens, read-only (POST /score). */
  score(model: string | undefined, tokens: Uint32Array, cacheSalt?: string): (Match & { indexer: ModelIndex }) | undefined {
    const indexer = this.deps.indexers.lookup(model);
    if (!indexer) return undefined;
    const requestBlocks = this.matchInto(indexer, tokens, this.identity(model, cacheSalt));
    return { indexer, requestBlocks, ...this.list.toMaps() };
  }

  private identity(model: string | undefined, cacheSalt: string | undefined): Identity {
    return { loraName: this.deps.indexers.adapterOf?.(model) ?? null, cacheSalt };
  }

  /** The request's local block hashes in its identity, as the stored events carry them. */
  private hashes(indexer: ModelIndex, tokens: Uint32Array, id: Identity): BigUint64Array {
    const n = Math.floor(tokens.length / indexer.blockSize);
    return computeBlockHashes(tokens, indexer.blockSize, this.extras(n, indexer.blockSize, id));
  }

  private extras(n: number, blockSize: number, id: Identity) {
    // vLLM's extra keys (the adapter on every block, the salt on block 0), as the stored events carry them.
    return id.loraName || id.cacheSalt ? requestBlockExtras(n, blockSize, { loraName: id.loraName, cacheSalt: id.cacheSalt }) : undefined;
  }

  /** Fills the reused MatchList (valid until the next call); returns the request's full blocks. */
  private matchInto(indexer: ModelIndex, tokens: Uint32Array, id: Identity): number {
    const n = Math.floor(tokens.length / indexer.blockSize);
    const extras = this.extras(n, indexer.blockSize, id);
    // hashed inside the index's module, where the query runs
    if (n > 0) indexer.index.findMatchesInto({ tokenIds: tokens, extras }, this.list);
    else this.list.count = 0;
    return n;
  }
}
