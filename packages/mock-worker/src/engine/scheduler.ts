/**
 * vLLM's V1 scheduler over token counts, with no clock. Each engine step first gives the running
 * requests, in admission order, the tokens each still needs (one for a decode, the rest of the prompt
 * for a chunked prefill) while the step's token budget lasts, then admits waiting requests in FIFO
 * order while budget and the running cap allow, looking up each one's cached prefix as it is admitted.
 * With KV slots, each request takes the blocks of a step's tokens as it is scheduled (vLLM caches a
 * chunk's full blocks then, before the step computes them, so a long prompt's blocks reach the cache,
 * and its KV events, step by step), and the cache's capacity bounds admission and preempts (`step`).
 * A step costs one pass over the weights plus a cost per scheduled token, so a long prefill on a rank
 * slows every request decoding beside it, and prompts arriving together share the budget.
 *
 * The rank engine sleeps each step's duration, the trace simulation schedules it in virtual time, and
 * `forecastFirstTokenMs` runs it ahead on a copy: one model of an engine step, three clocks.
 * The forecast runs without KV slots. Not modelled: the admission watermark, the long-prefill
 * threshold (0 by default in vLLM), speculative decoding.
 */
export type TimingParams = {
  /** time scale: 0 = instantaneous, 1 = the configured costs, 2 = twice as slow */
  speed: number;
  /** fixed cost of one engine step (reading the weights once) */
  stepBaseMs: number;
  /** cost of each token a step computes, prefill and decode alike */
  msPerToken: number;
  /** vLLM's --max-num-batched-tokens: tokens one step computes at most */
  maxNumBatchedTokens: number;
  /** vLLM's --max-num-seqs: requests running at once; the rest wait */
  maxNumSeqs: number;
};

/**
 * vLLM's OpenAI-server defaults on a GPU under 70 GiB (2048 batched tokens, 256 sequences); the step
 * costs are an 8B model's order of magnitude: 10k prefill tokens/s, 10 ms per decode step.
 */
export const DEFAULT_TIMING: TimingParams = {
  speed: 1,
  stepBaseMs: 10,
  msPerToken: 0.1,
  maxNumBatchedTokens: 2048,
  maxNumSeqs: 256,
};

/** What one step did, reported when it ends. */
export type StepResult<T> = {
  /** the step's duration, already scaled by speed */
  ms: number;
  /** requests whose first output token this step produced (their prefill ended) */
  first: T[];
  /** requests that got a later output token */
  next: T[];
  /** requests whose last token this step produced; they left the running set */
  finished: T[];
};

type Seq<T> = {
  readonly item: T;
  readonly prompt: number;
  readonly output: number;
  /** tokens whose KV exists: the cached prefix, computed chunks and fed-back outputs */
  computed: number;
  /** output tokens sampled so far */
  produced: number;
  /** admitted alone without the slots it needs: runs without them from then on */
  unbounded?: boolean;
};

/** The KV cache's side of scheduling: a request's slots, reserved step by step and handed back. */
export type KvSlots<T> = {
  allocate(item: T, tokens: number): boolean;
  release(item: T): void;
};

export class StepScheduler<T> {
  private waiting: Seq<T>[] = [];
  private running: Seq<T>[] = [];

  /**
   * `admit` is called as a request leaves the waiting queue and returns its cached prompt tokens;
   * `blocks`, when given, holds the KV cache's slots: `allocate` before each step a request is
   * scheduled in, for the tokens it will hold once the step ran (false: not enough free blocks), and
   * `release` when a preemption or an admission that did not fit hands them all back.
   */
  constructor(
    readonly params: TimingParams,
    private readonly admit: (item: T) => number,
    private readonly blocks?: KvSlots<T>,
  ) {}

  /** Requests preempted since the start (vLLM's num_preemptions). */
  preemptions = 0;

  private allocate(s: Seq<T>, tokens: number): boolean {
    return !this.blocks || s.unbounded === true || this.blocks.allocate(s.item, tokens);
  }

  /** Back to the head of the queue with its slots handed back; it recomputes its prompt and outputs. */
  private preempt(s: Seq<T>): void {
    this.blocks!.release(s.item);
    s.computed = 0;
    this.waiting.unshift(s);
    this.preemptions++;
  }

  get runningCount(): number {
    return this.running.length;
  }

  get waitingCount(): number {
    return this.waiting.length;
  }

  /** The requests of the running batch. */
  runningItems(): T[] {
    return this.running.map((s) => s.item);
  }

  /** The requests waiting to be admitted (preempted ones first). */
  waitingItems(): T[] {
    return this.waiting.map((s) => s.item);
  }

  get idle(): boolean {
    return this.running.length === 0 && this.waiting.length === 0;
  }

  /** Queues a request; at least one output token is always produced, as vLLM's max_tokens >= 1. */
  add(item: T, promptTokens: number, outputTokens: number): void {
    this.waiting.push({ item, prompt: Math.max(1, promptTokens), output: Math.max(1, outputTokens), computed: 0, produced: 0 });
  }

  /** Takes every request out (the engine failed): the ones it held, running first. */
  clear(): T[] {
    const all = [...this.running, ...this.waiting].map((s) => s.item);
    this.running = [];
    this.waiting = [];
    return all;
  }

  /** Drops a request wherever it is (a client went away); false if it is not here. */
  remove(item: T): boolean {
    for (const list of [this.waiting, this.running]) {
      const i = list.findIndex((s) => s.item === item);
      if (i >= 0) {
        list.splice(i, 1);
        return true;
      }
    }
    return false;
  }

  /**
   * Schedules the next step and applies it; null when there is nothing to run. With KV slots, as vLLM's
   * schedule(): a running request whose blocks cannot be had preempts the newest running request
   * (its blocks handed back, its KV recomputed when it is admitted again, at the head of the queue)
   * until it fits or is the one preempted; a step that preempted admits no one; a waiting request that
   * does not fit stays at the head of the queue, and admission stops there. One that cannot fit even
   * alone runs without its slots from then on (vLLM refuses prompts, and sizes max_model_len, so that
   * one request always fits).
   */
  step(): StepResult<T> | null {
    const p = this.params;
    let budget = p.maxNumBatchedTokens;
    const scheduled: [Seq<T>, number][] = [];
    let preempted = false;
    for (let i = 0; i < this.running.length && budget > 0; i++) {
      const s = this.running[i]!;
      const n = Math.min(s.prompt + s.produced - s.computed, budget);
      if (n <= 0) continue;
      let fits = this.allocate(s, s.computed + n);
      while (!fits) {
        // Alone and still short: past its slots it runs without them (vLLM sizes max_model_len to fit).
        if (this.running.length === 1) {
          s.unbounded = fits = true;
          break;
        }
        const victim = this.running.pop()!;
        this.preempt(victim);
        preempted = true;
        if (victim === s) break;
        fits = this.allocate(s, s.computed + n);
      }
      if (!fits) break;
      scheduled.push([s, n]);
      budget -= n;
    }
    while (!preempted && budget > 0 && this.waiting.length > 0 && this.running.length < p.maxNumSeqs) {
      const s = this.waiting[0]!;
      // vLLM recomputes at least the prompt's last token, so a hit never covers the whole prompt.
      s.computed = Math.min(Math.max(0, this.admit(s.item)), s.prompt - 1);
      const n = Math.min(s.prompt + s.produced - s.computed, budget);
      if (!this.allocate(s, s.computed + n)) {
        if (this.running.length > 0) {
          this.blocks!.release(s.item);
          s.computed = 0;
          break;
        }
        s.unbounded = true;
      }
      this.waiting.shift();
      this.running.push(s);
      scheduled.push([s, n]);
      budget -= n;
    }
    if (scheduled.length === 0) return null;
    const result: StepResult<T> = { ms: p.speed * (p.stepBaseMs + p.msPerToken * (p.maxNumBatchedTokens - budget)), first: [], next: [], finished: [] };
    let done = false;
    for (const [s, n] of scheduled) {
      s.computed += n;
      // Caught up with every token it has: the step samples one more.
      if (s.computed < s.prompt + s.produced) continue;
      s.produced++;
      (s.produced === 1 ? result.first : result.next).push(s.item);
      if (s.produced === s.output) {
        result.finished.push(s.item);
        done = true;
      }
    }
    if (done) this.running = this.running.filter((s) => s.produced < s.output);
    return result;
  }

  /**
   * Milliseconds until a request queued now would get its first token, if nothing else arrived: this
   * scheduler run ahead on a copy, the queued requests' hits read with `peek` (the cache as of now).
   * Gives up with Infinity past `limitMs` (a caller looking for the least needs no more).
   */
  forecastFirstTokenMs(promptTokens: number, cachedTokens: number, outputTokens: number, peek: (item: T) => number, limitMs = Number.POSITIVE_INFINITY): number {
    const probe = Symbol("probe");
    type Item = T | typeof probe;
    const copy = new StepScheduler<Item>(this.params, (it) => (it === probe ? cachedTokens : peek(it as T)));
    copy.running = this.running.map((s) => ({ ...s }));
    copy.waiting = this.waiting.map((s) => ({ ...s }));
    copy.add(probe, promptTokens, outputTokens);
    let elapsed = 0;
    for (;;) {
      const r = copy.step();
      // Unreachable while the probe is queued; a finite answer here would be a wrong one.
      if (!r) return Number.POSITIVE_INFINITY;
      elapsed += r.ms;
      if (elapsed > limitMs) return Number.POSITIVE_INFINITY;
      if (r.first.includes(probe)) return elapsed;
    }
  }
}

/**
 * The TTFT of a request alone on an idle engine: its uncached tokens (at least the last one) in chunks
 * of the token budget, one step each. No request can do better, so it bounds every policy's TTFT.
 */
export function idleTtftMs(p: TimingParams, promptTokens: number, cachedTokens: number): number {
  const uncached = Math.max(1, promptTokens - cachedTokens);
  return p.speed * (Math.ceil(uncached / p.maxNumBatchedTokens) * p.stepBaseMs + uncached * p.msPerToken);
}
