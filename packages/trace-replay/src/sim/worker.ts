// One simulated worker rank in virtual time: mock-worker's PrefixCacheSim and StepScheduler, the same
// engine as its RankEngine (vLLM's step scheduler: a token budget per step shared by decodes and
// chunked prefills, FIFO admission under a running cap, the cache looked up when a request is admitted
// and its blocks cached chunk by chunk as they are scheduled, blocks referenced until the request
// ends), with each step's end an event on the queue instead of a sleep, so a whole trace replays in
// seconds and identically every run.
import { PrefixCacheSim, StepScheduler, DEFAULT_TIMING, type CacheEvent, type Lease, type TimingParams } from "@kv-epp/mock-worker";
import { uncachedTokens } from "@kv-epp/routing";
import type { EventQueue } from "./event-queue.ts";
import { cacheIdentity, type SimRequest } from "./request.ts";

/** A request's first token: `cachedTokens` is what its admission found in the cache. */
export type FirstToken = { req: SimRequest; worker: number; atMs: number; cachedTokens: number; leg: Leg };

export type WorkerHooks = {
  onFirstToken(f: FirstToken): void;
  /** the request's last token: it leaves the worker */
  onFinished(req: SimRequest, worker: number, now: number, leg: Leg): void;
};

/**
 * A request's part on this worker. A P/D pool splits one request in two (pd-replay.ts): a `prefill`
 * leg (one output token, its prompt kept for the decode leg) and a `pulled` decode leg, whose prompt
 * was read from the prefill worker: admitted as computed but for its last token, as vLLM's
 * NixlConnector leaves it (the mock worker's `--role decode`).
 */
export type Leg = "whole" | "prefill" | "pulled";

type Job = { req: SimRequest; leg: Leg; lease?: Lease; cachedTokens?: number };

export class SimWorker {
  readonly cache: PrefixCacheSim;
  readonly timing: TimingParams;
  private readonly scheduler: StepScheduler<Job>;
  /** virtual ms at which the step in progress ends; null while the engine is idle */
  private stepEndsAt: number | null = null;
  /** blocks of the requests on this worker (running or waiting): the true decode load (exact-index reads it) */
  activeBlocks = 0;

  constructor(
    readonly index: number,
    opts: { blockSize: number; capacityBlocks: number; timing: Partial<TimingParams> },
    private readonly queue: EventQueue,
    private readonly hooks: WorkerHooks,
  ) {
    this.cache = new PrefixCacheSim({ blockSize: opts.blockSize, capacityBlocks: opts.capacityBlocks });
    this.timing = { ...DEFAULT_TIMING, ...opts.timing };
    this.scheduler = new StepScheduler<Job>(
      this.timing,
      (job) => {
        const acq = this.cache.admit(job.req.tokens!, cacheIdentity(job.req));
        job.lease = acq.lease;
        // A pulled prompt's first admission has it all but the last token; a resumption finds the
        // pulled blocks in the cache like any other.
        const computed = job.leg === "pulled" && job.cachedTokens === undefined ? job.req.promptTokens - 1 : acq.cachedTokens;
        // A resumption (after a preemption) reports its first admission's hit, as vLLM does.
        job.cachedTokens ??= computed;
        return computed;
      },
      { allocate: (job, tokens) => this.cache.allocate(job.lease!, tokens), release: (job) => this.cache.release(job.lease!) },
    );
  }

  /** Requests routed here and not finished (running + waiting). */
  get inflight(): number {
    return this.scheduler.runningCount + this.scheduler.waitingCount;
  }

  get waitingCount(): number {
    return this.scheduler.waitingCount;
  }

  onCacheEvents(listener: (events: CacheEvent[]) => void): void {
    this.cache.subscribe(listener);
  }

  /** Queues a request; an idle engine starts a step at once (a busy one takes it at its next step). */
  submit(req: SimRequest, now: number, leg: Leg = "whole"): void {
    this.activeBlocks += req.requestBlocks;
    this.scheduler.add({ req, leg }, req.promptTokens, leg === "prefill" ? 1 : req.outputTokens);
    if (this.stepEndsAt === null) this.runStep(now);
  }

  /**
   * The TTFT a request with these tokens would see if submitted now, nothing else arriving: the rest of
   * the step in progress, then the scheduler run ahead on a copy (the queued requests' hits as of now).
   * Infinity once past `limitMs`.
   */
  ttftIfSubmitted(tokens: Uint32Array, cachedTokens: number, now: number, limitMs = Number.POSITIVE_INFINITY): number {
    const rest = this.stepEndsAt === null ? 0 : this.stepEndsAt - now;
    // What acquire will find: whole blocks, at most those before the prompt's last token.
    const bs = this.cache.blockSize;
    const peek = (job: Job) => job.req.promptTokens - uncachedTokens(job.req.promptTokens, this.cache.peekHitBlocks(job.req.tokens!, cacheIdentity(job.req)), bs);
    return rest + this.scheduler.forecastFirstTokenMs(tokens.length, cachedTokens, 1, peek, limitMs - rest);
  }

  private runStep(now: number): void {
    const r = this.scheduler.step();
    if (!r) {
      this.stepEndsAt = null;
      return;
    }
    const end = now + r.ms;
    this.stepEndsAt = end;
    this.queue.schedule(end, (t) => {
      for (const job of r.first) this.hooks.onFirstToken({ req: job.req, worker: this.index, atMs: t, cachedTokens: job.cachedTokens ?? 0, leg: job.leg });
      for (const job of r.finished) {
        this.cache.release(job.lease!);
        // Kept until now: a preempted request is looked up again when it is readmitted (and a
        // prefill leg's prompt is the decode leg's).
        if (job.leg !== "prefill") job.req.tokens = null;
        this.activeBlocks -= job.req.requestBlocks;
        this.hooks.onFinished(job.req, this.index, t, job.leg);
      }
      this.runStep(t);
    });
  }
}
