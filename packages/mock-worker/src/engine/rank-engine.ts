import type { AcquireIdentity, Lease, PrefixCacheSim } from "../cache/prefix-cache.ts";
import { StepScheduler, type TimingParams } from "./scheduler.ts";

/**
 * One data-parallel rank: its own prefix cache and one engine loop that runs the step scheduler in
 * real time, sleeping each step's duration and handing out the tokens it produced. A request looks up
 * its cached prefix when the scheduler admits it, takes its blocks step by step as they are scheduled
 * (its full prompt blocks cached; it waits, or is preempted, when the cache cannot make room), and
 * references them all until it ends.
 */

export type Generation = {
  promptTokens: number;
  cachedTokens: number;
  outputTokens: number;
  /** Output token texts, each as the engine step that produced it ends; the first is ready at once. */
  tokens(): AsyncGenerator<string>;
  /** Ends the request (releases its blocks and running slot if the engine still has it); idempotent. */
  finish(): void;
};

export type RankObserver = { onFirstToken?: (seconds: number) => void; onFinished?: (outputTokens: number) => void };

// Deterministic filler output: the mock has no model, only token counts matter.
const WORDS = [" the", " cache", " holds", " a", " prefix", " of", " blocks", " and", " tokens", " flow"];

/** A request inside the engine, from queueing to its last token or its abandonment. */
type Live = {
  readonly prompt: Uint32Array;
  readonly identity?: AcquireIdentity;
  readonly outputTokens: number;
  readonly arrived: number;
  lease?: Lease;
  /** what its first admission found cached; unset until then */
  cachedTokens?: number;
  /** tokens produced and not yet seen by the consumer are those past its read position */
  produced: number;
  /** the engine is done with it: finished, or dropped (then `error` says why if it was an abort) */
  ended: boolean;
  error?: unknown;
  wake?: () => void;
  onFirst(): void;
  /** before its first token: the start() promise rejects */
  onFail(e: unknown): void;
  onAbort(): void;
};

// Sleeps until `deadline` (performance.now() ms). Steps are timed against absolute deadlines, so a
// timer's lateness (about a millisecond each) does not add up over a decode's hundreds of steps; a step
// already due still yields to the event loop, so speed 0 answers at once without starving I/O.
const sleepUntil = (deadline: number) =>
  new Promise<void>((resolve) => {
    const ms = deadline - performance.now();
    if (ms > 0) setTimeout(resolve, ms);
    else setImmediate(resolve);
  });

export class RankEngine {
  private readonly scheduler: StepScheduler<Live>;
  private looping = false;

  constructor(
    readonly rank: number,
    readonly cache: PrefixCacheSim,
    readonly timing: TimingParams,
    private readonly observer: RankObserver = {},
  ) {
    this.scheduler = new StepScheduler<Live>(
      timing,
      (live) => {
        const acq = this.cache.admit(live.prompt, live.identity);
        live.lease = acq.lease;
        // vLLM reports the hit of the request's first admission (num_cached_tokens), not a resumption's.
        live.cachedTokens ??= acq.cachedTokens;
        return acq.cachedTokens;
      },
      { allocate: (live, tokens) => this.cache.allocate(live.lease!, tokens), release: (live) => this.cache.release(live.lease!) },
    );
  }

  /** Requests preempted for want of KV blocks (vLLM's num_preemptions). */
  get preemptions(): number {
    return this.scheduler.preemptions;
  }

  get running(): number {
    return this.scheduler.runningCount;
  }

  get waiting(): number {
    return this.scheduler.waitingCount;
  }

  /** Requests running plus waiting: the load used to pick a rank. */
  get load(): number {
    return this.running + this.waiting;
  }

  /** Queues a prompt; resolves at its first token, rejects with the signal's reason on an abort before it. */
  start(prompt: Uint32Array, maxTokens: number, signal?: AbortSignal, identity?: AcquireIdentity): Promise<Generation> {
    if (signal?.aborted) return Promise.reject(signal.reason);
    return new Promise<Generation>((resolve, reject) => {
      const live: Live = {
        prompt, identity, outputTokens: Math.max(1, maxTokens), arrived: performance.now(), produced: 0, ended: false,
        onFirst: () => resolve(this.generation(live, signal)),
        onFail: (e) => {
          signal?.removeEventListener("abort", live.onAbort);
          reject(e);
        },
        onAbort: () => {
          const first = live.produced === 0;
          this.drop(live, signal!.reason);
          if (first) reject(signal!.reason);
        },
      };
      signal?.addEventListener("abort", live.onAbort, { once: true });
      this.scheduler.add(live, prompt.length, live.outputTokens);
      this.kick();
    });
  }

  private generation(live: Live, signal?: AbortSignal): Generation {
    const finish = () => {
      signal?.removeEventListener("abort", live.onAbort);
      this.drop(live);
    };
    return {
      promptTokens: live.prompt.length,
      cachedTokens: live.cachedTokens ?? 0,
      outputTokens: live.outputTokens,
      finish,
      async *tokens() {
        try {
          for (let read = 0; read < live.outputTokens; read++) {
            while (live.produced <= read) {
              if (live.error !== undefined) throw live.error;
              if (live.ended) return;
              await new Promise<void>((wake) => (live.wake = wake));
            }
            yield WORDS[read % WORDS.length]!;
          }
        } finally {
          finish();
        }
      },
    };
  }

  /** Takes a request out of the engine and frees its blocks; a no-op once it ended. */
  private drop(live: Live, error?: unknown): void {
    if (live.ended) return;
    live.ended = true;
    live.error = error;
    this.scheduler.remove(live);
    if (live.lease) this.cache.release(live.lease);
    live.wake?.();
  }

  private kick(): void {
    if (this.looping) return;
    this.looping = true;
    void this.loop();
  }

  private async loop(): Promise<void> {
    try {
      let deadline = performance.now();
      for (let r = this.scheduler.step(); r; r = this.scheduler.step()) {
        deadline += r.ms;
        await sleepUntil(deadline);
        for (const live of r.first) {
          if (live.ended) continue;
          live.produced++;
          this.observer.onFirstToken?.((performance.now() - live.arrived) / 1000);
          live.onFirst();
        }
        for (const live of r.next) {
          if (live.ended) continue;
          live.produced++;
          live.wake?.();
        }
        for (const live of r.finished) {
          if (live.ended) continue;
          this.observer.onFinished?.(live.outputTokens);
          // Finished in the engine: its blocks are free now, whenever the client reads the tokens.
          live.ended = true;
          if (live.lease) this.cache.release(live.lease);
          live.wake?.();
        }
      }
    } catch (e) {
      // A step that threw (a cache listener, say) must not leave its requests waiting forever.
      for (const live of this.scheduler.clear()) {
        const first = live.produced === 0;
        this.drop(live, e);
        if (first) live.onFail(e);
      }
    } finally {
      this.looping = false;
    }
  }
}
