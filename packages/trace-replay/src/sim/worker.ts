// One simulated worker rank in virtual time: mock-worker's PrefixCacheSim and TimingModel driven by the
// same admission rule as its RankEngine (a bounded running set, a FIFO waiting queue, the cache looked
// up when a request is admitted, blocks referenced until the request ends), but scheduled on the event
// queue instead of sleeping, so a whole trace replays in seconds and identically every run.
import { PrefixCacheSim, TimingModel, type CacheEvent, type TimingParams } from "../upstream.ts";
import type { EventQueue } from "./event-queue.ts";
import { cacheIdentity, type SimRequest } from "./request.ts";

export type Admitted = { req: SimRequest; worker: number; admittedMs: number; cachedTokens: number; ttftMs: number };

export type WorkerHooks = {
  /** the request got a running slot and looked up the cache */
  onAdmitted(a: Admitted): void;
  /** the request's last token: it leaves the worker */
  onFinished(req: SimRequest, worker: number, now: number): void;
};

export class SimWorker {
  readonly cache: PrefixCacheSim;
  readonly timing: TimingModel;
  private running = 0;
  private readonly waiting: SimRequest[] = [];
  /** virtual ms at which each running request ends, for the TTFT a new request would see */
  private readonly endsAt = new Set<number[]>();
  /** blocks of the requests on this worker (running or waiting): the true decode load (exact-index reads it) */
  activeBlocks = 0;

  constructor(
    readonly index: number,
    opts: { blockSize: number; capacityBlocks: number; timing: Partial<TimingParams> },
    private readonly queue: EventQueue,
    private readonly hooks: WorkerHooks,
  ) {
    this.cache = new PrefixCacheSim({ blockSize: opts.blockSize, capacityBlocks: opts.capacityBlocks });
    this.timing = new TimingModel(opts.timing);
  }

  /** Requests routed here and not finished (running + waiting). */
  get inflight(): number {
    return this.running + this.waiting.length;
  }

  get waitingCount(): number {
    return this.waiting.length;
  }

  onCacheEvents(listener: (events: CacheEvent[]) => void): void {
    this.cache.subscribe(listener);
  }

  submit(req: SimRequest, now: number): void {
    this.activeBlocks += req.requestBlocks;
    if (this.running < this.timing.params.maxRunning && this.waiting.length === 0) this.admit(req, now);
    else this.waiting.push(req);
  }

  /**
   * The TTFT a request with these tokens would see if submitted now: its wait for a running slot (the
   * requests ahead of it admitted in FIFO order as the running ones end, their cache hits as of now)
   * plus its prefill of what this cache does not hold now.
   */
  ttftIfSubmitted(tokens: Uint32Array, cachedTokens: number, now: number): number {
    const prefill = this.timing.prefillMs(tokens.length, cachedTokens);
    const max = this.timing.params.maxRunning;
    if (this.running < max && this.waiting.length === 0) return prefill;
    // Slot free times: the running requests' ends, and now for every free slot.
    const slots = [...this.endsAt].map((e) => e[0]!);
    for (let i = this.running; i < max; i++) slots.push(now);
    const takeSlot = () => {
      let at = 0;
      for (let i = 1; i < slots.length; i++) if (slots[i]! < slots[at]!) at = i;
      return slots.splice(at, 1)[0]!;
    };
    for (const w of this.waiting) {
      const start = takeSlot();
      const cached = this.cache.peekHitBlocks(w.tokens!, cacheIdentity(w)) * this.cache.blockSize;
      slots.push(start + this.timing.requestMs(w.promptTokens, cached, w.outputTokens, max).totalMs);
    }
    return takeSlot() - now + prefill;
  }

  private admit(req: SimRequest, now: number): void {
    this.running++;
    const acq = this.cache.acquire(req.tokens!, cacheIdentity(req));
    req.tokens = null;
    const { ttftMs, totalMs } = this.timing.requestMs(req.promptTokens, acq.cachedTokens, req.outputTokens, this.running);
    this.hooks.onAdmitted({ req, worker: this.index, admittedMs: now, cachedTokens: acq.cachedTokens, ttftMs });
    const end = [now + totalMs];
    this.endsAt.add(end);
    this.queue.schedule(now + totalMs, (t) => {
      this.endsAt.delete(end);
      this.cache.release(acq.lease);
      this.activeBlocks -= req.requestBlocks;
      this.running--;
      this.hooks.onFinished(req, this.index, t);
      const next = this.waiting.shift();
      if (next) this.admit(next, t);
    });
  }
}
