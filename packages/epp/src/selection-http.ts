// selection-http (Hono on Bun.serve): GET /dump for peers, and read-only views of the picker:
// POST /score, POST /select (a dry run: records no load), GET /workers. Shapes: docs/CONTRACTS.md §10.
// Their bodies are read where ext_proc bodies are (tokenizeBody: in a tokenizer pool member by default), so
// this thread only receives the bytes and picks.
import { dumpHandler, type DumpSource, type RecoveryOutcome } from "@kv-epp/recovery";
import { Hono } from "hono";
import { bodyLimit } from "hono/body-limit";
import type { Logger } from "pino";
import { BadRequest, MAX_BODY_BYTES, threadScheduling, TokenizeCancelled, TooDeep, type PoolStats, type RewriteRules } from "@kv-epp/tokenizer";
import type { StreamHandoff } from "./handoff/handoff.ts";
import type { Indexers } from "./indexers/indexers.ts";
import type { Metrics } from "./metrics.ts";
import type { LoadView, LatencyModel, Picker, PrefillDecision, RoutingQuality } from "@kv-epp/routing";
import type { RoutedBody, TokenizeBody } from "./tokens.ts";
import { scoredAs, unmatched } from "./indexers/sglang-adapter.ts";
import { DUMP_PATH, parseWorkerKey, workerKeyOf } from "@kv-epp/protocol";
import type { WorkerSet } from "./workers/worker-set.ts";

export type SelectionDeps = {
  picker: Picker;
  indexers: Indexers;
  /** The worker ranks, their listeners and health (GET /workers). */
  workers: WorkerSet;
  /** Reads and tokenizes a request body, as ext_proc's (each route's reads counted under its own name). */
  tokenizeBody: { score: TokenizeBody; select: TokenizeBody };
  /** The pool's InferenceModelRewrite rules, applied to the body's model as ext_proc applies them. */
  rewriteRules?: () => RewriteRules | undefined;
  /** The workers are SGLang's: a body's `lora_path` and `extra_key` (BodyFields `loraPath`, `namespaced`) count as ext_proc counts them. */
  sglangBodies?: boolean;
  /** The tokenizer pool, when tokenization runs off the event loop (GET /debug/tokenizer). */
  tokenizerPool?: { stats(): PoolStats };
  dumpSource: DumpSource;
  /** Each rank's stream position and handoff state (GET /workers, GET /recovery). */
  handoff: StreamHandoff;
  /** How recovery ended; null while it runs. */
  recoveryOutcome: () => RecoveryOutcome | null;
  metrics: Metrics;
  /** In-flight load: this replica's own routing, and its peers' (replica-agg, when on). */
  load: { own: LoadView; peers?: LoadView };
  /** Recent prediction accuracy and observed TTFT per worker rank. */
  quality?: RoutingQuality;
  latency?: LatencyModel;
  /** /dump answers 503 until this replica's recovery has ended. */
  recovered: () => boolean;
  peerToken?: string;
  log: Logger;
};

/** {"<worker_id>": {"<dp_rank>": n}} from a map keyed by workerKey. */
function byWorker(m: Map<string, number>): Record<string, Record<string, number>> {
  const out: Record<string, Record<string, number>> = {};
  for (const [key, n] of m) {
    const w = parseWorkerKey(key);
    (out[w.workerId] ??= {})[String(w.dpRank)] = n;
  }
  return out;
}

/**
 * GET /workers' view of a rank's KV events: the block size they use (null until one was indexed or
 * refused) against the index's, and the KV cache groups they revealed.
 */
function kvShapeFields(indexers: Indexers, w: { workerId: string; dpRank: number }, indexBlockSize: number | undefined) {
  const info = indexers.live.rankInfo(w);
  return {
    block_size: info?.blockSize ?? null,
    index_block_size: indexBlockSize ?? null,
    block_size_mismatch: info?.blockSizeMismatch ?? false,
    kv_groups: info?.kvGroups ?? null,
  };
}

/** /select's `pd`: the decider's verdict and the prefill rank (`prefill: null` when the decode worker prefills). */
function pdFields(pd: PrefillDecision) {
  const p = pd.prefill?.chosen;
  return {
    disaggregated: pd.disagg.disaggregate,
    reason: pd.disagg.reason,
    uncached_tokens: pd.disagg.uncachedTokens,
    threshold_tokens: pd.disagg.thresholdTokens,
    prefill: p ? { endpoint: p.candidate.endpoint, worker_id: p.candidate.workerId, dp_rank: p.candidate.dpRank, overlap_blocks: p.overlap } : null,
  };
}

/** GET /workers' load columns, beside the contract's fields (docs/CONTRACTS.md §10). */
function loadFields(load: SelectionDeps["load"], key: string) {
  return {
    active_requests: load.own.of(key).requests,
    active_blocks: load.own.of(key).blocks,
    sibling_requests: load.peers?.of(key).requests ?? 0,
    sibling_blocks: load.peers?.of(key).blocks ?? 0,
    // Blocks still to prefill there (a prefill worker's whole load under disaggregation, until the first byte).
    active_prefill_blocks: load.own.of(key).prefillBlocks,
    sibling_prefill_blocks: load.peers?.of(key).prefillBlocks ?? 0,
  };
}

/**
 * GET /workers' stream columns: where this replica's view of the rank stands (the cursor its /dump
 * carries; u64 as decimal strings), what its listener met (gaps, replays, resets) and its handoff.
 */
function streamFields(d: SelectionDeps, w: { workerId: string; dpRank: number }) {
  const r = d.handoff.get(w);
  const l = d.workers.listenerCounters(w);
  const str = (v: bigint | null | undefined) => (v === null || v === undefined ? null : v.toString());
  return {
    cursor: str(r?.cursor.seq),
    baseline: str(r?.cursor.baseline),
    complete: r?.cursor.complete ?? false,
    // The publisher's lifetime id the cursor's seq belongs to, when its frames carry one.
    epoch: r?.cursor.epoch ?? null,
    gaps: l?.gaps ?? 0,
    replays: (l?.replays ?? 0) + (r?.counters.replays ?? 0),
    replay_failures: (l?.replayFailures ?? 0) + (r?.counters.replayFailures ?? 0),
    resets: l?.resets ?? 0,
    restarts: l?.restarts ?? 0,
    handoff: r?.handoff ?? null,
    handoff_skipped: r?.counters.skipped ?? 0,
  };
}

/** GET /workers' routing-quality columns: the last responses' predicted vs reported cached tokens, TTFT. */
function qualityFields(d: SelectionDeps, key: string) {
  const a = d.quality?.accuracy(key);
  const l = d.latency?.params();
  return {
    prediction: a && {
      samples: a.samples,
      mispredicted: a.mispredicted,
      accuracy: a.accuracy,
      mean_abs_error_tokens: a.meanAbsErrorTokens,
    },
    observed_ttft_ms: a?.meanTtftMs ?? null,
    latency_model: l && { base_ms: l.baseMs, ms_per_token: l.msPerToken, ms_per_waiting: l.msPerWaiting, samples: l.samples },
  };
}

/**
 * The body read as ext_proc reads it (depth-limited, validated, tokenized by `read`; a request whose client has gone
 * cancels its tokenization), with the pool's rewrite rules: `model` is what the pick scores, a rule's target when one
 * matches the body's model (weighted, as a request would be sent), and to SGLang workers its `lora_path` adapter;
 * `namespaced`: to SGLang workers, its `extra_key` puts its blocks in a namespace of its own (matched on nothing).
 * BadRequest (TooDeep) for a body vLLM would refuse, or when a rule without targets applies.
 */
async function readRequest(read: TokenizeBody, req: Request, rules: RewriteRules | undefined, sglang: boolean): Promise<RoutedBody & { model: string | undefined; namespaced: boolean }> {
  const r = await read({ body: new Uint8Array(await req.arrayBuffer()), ...(rules ? { rewriteRules: rules } : {}) }, req.signal);
  if (r.fields.target === "") throw new BadRequest("model not found in request body");
  return { ...r, ...scoredAs(r.fields.target ?? r.fields.model, r.fields, sglang) };
}

export function selectionApp(d: SelectionDeps): Hono {
  const app = new Hono();
  const dump = dumpHandler({ source: d.dumpSource, ready: d.recovered, token: d.peerToken, logger: d.log });
  app.on(["GET", "HEAD"], DUMP_PATH, (c) => dump(c.req.raw));

  // The ext_proc body cap: a larger body is refused (413) as it arrives, not buffered first.
  const limit = bodyLimit({ maxSize: MAX_BODY_BYTES, onError: (c) => c.json({ error: `request body over ${MAX_BODY_BYTES} bytes` }, 413) });
  app.post("/score", limit);
  app.post("/select", limit);

  app.post("/score", async (c) => {
    const { fields, tokens, model, namespaced } = await readRequest(d.tokenizeBody.score, c.req.raw, d.rewriteRules?.(), d.sglangBodies === true);
    if (fields.kind !== "tokens") throw new BadRequest("token_ids is required");
    const r = d.picker.score(model, tokens, fields.cacheSalt);
    if (!r) return c.json({ error: `unknown model ${JSON.stringify(model)}` }, 404);
    // In a namespace of its own no worker's blocks count for it, as on /select.
    const { scores, treeSizes } = namespaced ? NO_MATCHES : r;
    return c.json({ block_size: r.indexer.blockSize, request_blocks: r.requestBlocks, scores: byWorker(scores), tree_sizes: byWorker(treeSizes) });
  });

  app.post("/select", async (c) => {
    const { fields, tokens, model, namespaced } = await readRequest(d.tokenizeBody.select, c.req.raw, d.rewriteRules?.(), d.sglangBodies === true);
    const prompt = namespaced ? unmatched(tokens) : { tokens };
    const decision = d.picker.pick({ model, cacheSalt: fields.cacheSalt, ...prompt, detail: true });
    if (decision.kind === "no_endpoint") return c.json({ error: `no endpoint eligible (${decision.reason})` }, 503);
    const { chosen } = decision;
    return c.json({
      endpoint: chosen.candidate.endpoint,
      worker_id: chosen.candidate.workerId,
      dp_rank: chosen.candidate.dpRank,
      overlap_blocks: chosen.overlap,
      request_blocks: decision.requestBlocks,
      scores: byWorker(decision.scores!),
      // In a pool with prefill workers: the decider's verdict, and the prefill rank it would name.
      ...(decision.pd ? { pd: pdFields(decision.pd) } : {}),
    });
  });

  app.get("/workers", (c) => {
    const ix = d.indexers.models.lookup();
    return c.json(
      d.workers.ranks().map((r) => {
        const w = { workerId: r.workerId, dpRank: r.dpRank };
        const key = workerKeyOf(r.workerId, r.dpRank);
        return {
          worker_id: r.workerId,
          dp_rank: r.dpRank,
          address: r.address,
          kv_events: r.kvEvents,
          connected: r.connected,
          // Why a listed rank may not be picked: its worker is down (failed /metrics scrapes, static mode).
          routable: r.routable,
          failed_scrapes: r.failedScrapes,
          // Prefill/decode disaggregation: prefill | decode | both; null: no role (a destination only).
          role: r.role ?? null,
          blocks: ix ? ix.index.treeSize(w) : 0,
          ...kvShapeFields(d.indexers, w, ix?.blockSize),
          ...streamFields(d, w),
          ...loadFields(d.load, key),
          ...qualityFields(d, key),
        };
      }),
    );
  });

  // The tokenizer pool: members, their queues and work, budget fallbacks, cancellations.
  // The decision thread (the process's main thread: its tid is the pid) as the kernel schedules it now.
  app.get("/debug/tokenizer", (c) => c.json({
    decisionThread: threadScheduling(process.pid),
    ...(d.tokenizerPool ? { pool: d.tokenizerPool.stats() } : { pool: null, note: "tokenization runs on the event loop (--tokenizer-threads 0 or no --tokenizer-dir)" }),
  }));
  // How recovery ended and what became of every rank taken over from the peer, as data.
  app.get("/recovery", (c) => c.json({ outcome: d.recoveryOutcome(), handoff: d.handoff.summary() }));

  app.onError((err, c) => {
    if (err instanceof TooDeep) d.metrics.jsonDepthRefusals.inc({ where: c.req.path.slice(1) });
    if (err instanceof BadRequest) return c.json({ error: err.message }, 400);
    // The client left while its body was in the pool, which cancelled it: no one to answer, nothing failed.
    if (err instanceof TokenizeCancelled) return new Response(null, { status: 499 });
    d.metrics.ioErrors.inc({ where: "selection_http" });
    d.log.error({ err: String(err), path: c.req.path }, "selection-http handler failed");
    return c.json({ error: "internal error" }, 500);
  });
  return app;
}

const NO_MATCHES = { scores: new Map<string, number>(), treeSizes: new Map<string, number>() };
