import { Counter, Gauge, Histogram, type Registry } from "prom-client";
import { registerPreprocessorMetrics } from "../metrics";
import type { PoolObserver, TokenizerPool } from "./tokenizer-pool";

/**
 * The pool's metrics: queue depth and wait, fresh (uncached) tokens per answered job, work per member (busy
 * seconds and fresh tokens: their rates' ratio is tokens/s per thread), budget fallbacks by cause, requests by
 * placement, and the tokens picks found cached only because a reply was warmed. Returns the observer to hand the pool; `attach`
 * makes the queue gauges read that pool at scrape time, and the segment cache metrics (hits, misses, bytes, as
 * an in-process preprocessor reports them, labelled `model`) its members' caches summed.
 */
export function poolMetrics(registry: Registry, model = ""): PoolObserver & { attach(pool: TokenizerPool): void } {
  let pool: TokenizerPool | null = null;
  new Gauge({
    name: "dynamo_epp_tokenizer_pool_queue_depth", help: "Tokenization jobs waiting for a pool member (warm: background jobs)",
    labelNames: ["priority"], registers: [registry],
    collect() {
      this.reset();
      const members = pool?.stats().members ?? [];
      this.set({ priority: "request" }, members.reduce((n, m) => n + m.queued, 0));
      this.set({ priority: "warm" }, members.reduce((n, m) => n + m.warmQueued, 0));
    },
  });
  new Gauge({
    name: "dynamo_epp_tokenizer_pool_members", help: "Worker threads configured to tokenize for this process (see ..._pool_members_live)", registers: [registry],
    collect() {
      this.set(pool?.size ?? 0);
    },
  });
  new Gauge({
    name: "dynamo_epp_tokenizer_pool_members_live",
    help: "Worker threads ready to tokenize for this process: fewer than configured while lost ones are being replaced (starting, or in a crash loop's backoff)",
    registers: [registry],
    collect() {
      this.set(pool?.stats().members.filter((m) => m.live).length ?? 0);
    },
  });
  const wait = new Histogram({
    name: "dynamo_epp_tokenizer_pool_wait_seconds", help: "Time a request's tokenization waited for its pool member",
    // Up to seconds: --tokenize-budget-ms has no upper bound, and a body the caller reads past the budget waits longer.
    buckets: [0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5], registers: [registry],
  });
  const fresh = new Histogram({
    name: "dynamo_epp_tokenizer_fresh_tokens", help: "Tokens of a pick that were not in the segment cache (tokenized for it); only picks whose tokenization completed, not budget fallbacks or picks decided early",
    buckets: [0, 16, 64, 256, 1024, 4096, 16384, 65536, 262144], registers: [registry],
  });
  const warmed = new Counter({
    name: "dynamo_epp_tokenizer_warmed_tokens_total",
    help: "Tokens of answered picks found in the segment cache only because a background warm (the previous turn's reply) put them there: without warming they would have been fresh",
    registers: [registry],
  });
  const busy = new Counter({
    name: "dynamo_epp_tokenizer_pool_busy_seconds_total", help: "Time each pool member spent tokenizing",
    labelNames: ["member"], registers: [registry],
  });
  const memberFresh = new Counter({
    name: "dynamo_epp_tokenizer_pool_fresh_tokens_total", help: "Fresh tokens each pool member tokenized (rate / busy rate = tokens/s per thread)",
    labelNames: ["member"], registers: [registry],
  });
  const fallbacks = new Counter({
    name: "dynamo_epp_tokenizer_budget_fallbacks_total",
    help: "Picks answered on the known prefix because tokenization would exceed the budget (budget) or the member was busy past it (queue)",
    labelNames: ["cause"], registers: [registry],
  });
  const decided = new Counter({
    name: "dynamo_epp_tokenizer_decided_early_total",
    help: "Picks answered before their tokenization finished: the prefix known by then held a block no worker or in-flight request has, so the rest could not change the match (its member stops there)",
    registers: [registry],
  });
  const warmJobs = new Counter({
    name: "dynamo_epp_tokenizer_warm_jobs_total",
    help: "Background warm jobs (replies, bodies past the budget) a request made stop midway to resume later (preempted), dropped from a full warm queue (dropped), not run (or not run again once stopped, when its member kept nothing to resume from) for a body past the largest the pool reads on the caller's thread (too_large), lost with their member's thread while stopped, a body too large to read again whose resume only that thread held (lost), or released by their member on reading a reply with nothing to warm with (nothing: not finished, several choices, empty, an error), its body unread",
    labelNames: ["outcome"], registers: [registry],
  });
  const placements = new Counter({
    name: "dynamo_epp_tokenizer_pool_placements_total",
    help: "Requests by placement: on the member holding their conversation (affine), moved off a jammed one (moved), a conversation not seen (new)",
    labelNames: ["placement"], registers: [registry],
  });
  const restarts = new Counter({
    name: "dynamo_epp_tokenizer_pool_restarts_total",
    help: "Pool members lost (an uncaught error in the thread, or it exited) and replaced, a replacement that failed to start counted again; the request a lost member was running failed",
    registers: [registry],
  });
  return {
    attach: (p) => {
      pool = p;
      registerPreprocessorMetrics(registry, { model, kind: "hf", cacheStats: () => p.cacheStats() });
    },
    wait: (ms) => wait.observe(ms / 1000),
    fresh: (tokens, warmedTokens) => {
      fresh.observe(tokens);
      warmed.inc(warmedTokens);
    },
    fallback: (cause) => fallbacks.inc({ cause }),
    warm: (outcome) => warmJobs.inc({ outcome }),
    decided: () => decided.inc(),
    placed: (kind) => placements.inc({ placement: kind }),
    restarted: () => restarts.inc(),
    reset: () => {
      for (const m of [wait, fresh, warmed, fallbacks, warmJobs, placements, busy, memberFresh, decided]) m.reset();
    },
    work: (member, busyMs, freshTokens) => {
      busy.inc({ member: String(member) }, busyMs / 1000);
      memberFresh.inc({ member: String(member) }, freshTokens);
    },
  };
}

/**
 * How late the event loop runs a timer (sampled every `intervalMs`): the time every stream on this thread
 * waits behind whatever work holds it. `dynamo_epp_event_loop_lag_seconds`. Returns a stop function.
 */
export function eventLoopLag(registry: Registry, intervalMs = 20): () => void {
  const lag = new Histogram({
    name: "dynamo_epp_event_loop_lag_seconds", help: "Delay of a timer on the decision thread's event loop beyond its due time",
    buckets: [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1], registers: [registry],
  });
  let due = performance.now() + intervalMs;
  const timer = setInterval(() => {
    const now = performance.now();
    lag.observe(Math.max(0, now - due) / 1000);
    due = now + intervalMs;
  }, intervalMs);
  timer.unref();
  return () => clearInterval(timer);
}
