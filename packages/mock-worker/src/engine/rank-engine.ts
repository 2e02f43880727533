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
  /**
   * A prefill for a remote decode (`transfer: "send"`) that ran to its length: its blocks stay
   * referenced for the decode worker to read, until `release()` (vLLM's delay_free_blocks). Null
   * otherwise, and for a request that ended early (vLLM frees an aborted prefill's blocks at once).
   */
  readonly held: { release(): void } | null;
  /** Output token texts, each as the engine step that produced it ends; the first is ready at once. */
  tokens(): AsyncGenerator<string>;
  /** Ends the request (releases its blocks and running slot if the engine still has it); idempotent. */
  finish(): void;
};

/** LoRA adapter names, each once in the order first met (vLLM's running_lora_adapters and waiting_lora_adapters). */
export type StepAdapters = { running: string[]; waiting: string[] };

export type RankObserver = {
  onFirstToken?: (seconds: number) => void;
  onFinished?: (outputTokens: number) => void;
  /**
   * After each engine step: the adapters of the batch it ran (the requests it finished included) and of the
   * requests left waiting, what vLLM records after each step. No step, no call: an idle engine is not asked.
   */
  onStep?: (adapters: StepAdapters) => void;
};

/**
 * What vLLM's NixlConnector does with a request (kv-transfer/params.ts builds it from `kv_transfer_params`):
 * `send`, a prefill whose blocks a remote decode will read (do_remote_decode); `receive`, a decode
 * that pulls up to `remoteBlocks` prompt blocks from the prefill worker instead of computing them
 * (do_remote_prefill), `onPulled` called once the pull is done (NIXL's notification to the prefill
 * side, sent also when nothing had to be pulled); none, an ordinary request.
 */
export type TransferPlan =
  | { kind: "send" }
  | { kind: "receive"; remoteBlocks: number; msPerBlock: number; onPulled(): void };

/** Prompt tokens by where their KV came from (vLLM's prompt_tokens_by_source), counted at first admission. */
export type PromptTokenSources = { local_compute: number; local_cache_hit: number; external_kv_transfer: number };

// Deterministic filler output: the mock has no model, only token counts matter.
const WORDS = [" the", " cache", " holds", " a", " prefix", " of", " blocks", " and", " tokens", " flow"];

/** A request inside the engine, from queueing to its last token or its abandonment. */
type Live = {
  readonly prompt: Uint32Array;
  readonly identity?: AcquireIdentity;
  readonly outputTokens: number;
  readonly arrived: number;
  /** the request's KV transfer; a `receive` whose pull ended has been admitted once with its pulled blocks */
  readonly transfer?: TransferPlan;
  lease?: Lease;
  /** a finished `send`: its blocks stay referenced until the decode side has read them */
  holding?: boolean;
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
  /** vLLM's prompt_tokens_by_source counters. */
  readonly promptTokens: PromptTokenSources = { local_compute: 0, local_cache_hit: 0, external_kv_transfer: 0 };
  /** Blocks pulled from prefill workers (decode side). */
  pulledBlocks = 0;
  /** Finished prefills whose blocks wait for their decode worker to read them (prefill side). */
  heldRequests = 0;

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
        const first = live.cachedTokens === undefined;
        // A pulled prompt is computed but for its last token (vLLM's _update_waiting_for_remote_kv);
        // its blocks are cached as the step that computes that token allocates them. A resumption after
        // a preemption finds them in the local cache like any other.
        const computed = live.transfer?.kind === "receive" && first ? live.prompt.length - 1 : acq.cachedTokens;
        if (first) {
          // vLLM reports the hit of the request's first admission (num_cached_tokens), not a resumption's.
          live.cachedTokens = computed;
          this.promptTokens.local_cache_hit += acq.cachedTokens;
          this.promptTokens.external_kv_transfer += computed - acq.cachedTokens;
          this.promptTokens.local_compute += live.prompt.length - computed;
        }
        return computed;
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
  async start(prompt: Uint32Array, maxTokens: number, signal?: AbortSignal, identity?: AcquireIdentity, transfer?: TransferPlan): Promise<Generation> {
    if (signal?.aborted) throw signal.reason;
    const arrived = performance.now();
    if (transfer?.kind === "receive") await this.pull(prompt, identity, transfer, signal);
    return new Promise<Generation>((resolve, reject) => {
      const live: Live = {
        prompt, identity, transfer, outputTokens: Math.max(1, maxTokens), arrived, produced: 0, ended: false,
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

  /**
   * The decode side of a remote prefill: the prompt blocks it lacks locally (its prefix hit, up to the
   * blocks the prefill worker holds) are read from the prefill worker, `msPerBlock` each, while the
   * request takes no engine step (vLLM's WAITING_FOR_REMOTE_KVS; the mock takes its KV slots after
   * the pull, vLLM at admission). Then the prefill side is told it may free them.
   */
  private async pull(prompt: Uint32Array, identity: AcquireIdentity | undefined, plan: Extract<TransferPlan, { kind: "receive" }>, signal?: AbortSignal): Promise<void> {
    const bs = this.cache.blockSize;
    const local = Math.min(this.cache.peekHitBlocks(prompt, identity), Math.floor(Math.max(0, prompt.length - 1) / bs));
    const blocks = Math.max(0, Math.min(plan.remoteBlocks, Math.ceil(prompt.length / bs)) - local);
    const ms = this.timing.speed * plan.msPerBlock * blocks;
    if (ms > 0) {
      await new Promise<void>((resolve, reject) => {
        const onAbort = () => {
          clearTimeout(timer);
          reject(signal!.reason);
        };
        const timer = setTimeout(() => {
          signal?.removeEventListener("abort", onAbort);
          resolve();
        }, ms);
        signal?.addEventListener("abort", onAbort, { once: true });
      });
    }
    this.pulledBlocks += blocks;
    plan.onPulled();
  }

  private generation(live: Live, signal?: AbortSignal): Generation {
    const finish = () => {
      signal?.removeEventListener("abort", live.onAbort);
      this.drop(live);
    };
    // Known only once the engine finished it (a max_tokens 1 prefill: in the step of its first token).
    const held = {
      release: () => {
        if (!live.holding) return;
        live.holding = false;
        this.heldRequests--;
        if (live.lease) this.cache.release(live.lease);
      },
    };
    return {
      promptTokens: live.prompt.length,
      cachedTokens: live.cachedTokens ?? 0,
      outputTokens: live.outputTokens,
      get held() {
        return live.holding ? held : null;
      },
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

  /** A step's adapters, just after it was scheduled: its batch (still running, or finished in it) and the queue. */
  private stepAdapters(finished: readonly Live[]): StepAdapters {
    const names = (items: readonly Live[]) => [...new Set(items.flatMap((l) => (l.identity?.loraName ? [l.identity.loraName] : [])))];
    return { running: names([...this.scheduler.runningItems(), ...finished]), waiting: names(this.scheduler.waitingItems()) };
  }

  private kick(): void {
    if (this.looping) return;
    this.looping = true;
    void this.loop();
  }

  private async loop(): Promise<void> {
    try {
      let deadline = performance.now();
      const onStep = this.observer.onStep;
      for (let r = this.scheduler.step(); r; r = this.scheduler.step()) {
        deadline += r.ms;
        // What the step runs, taken before its wait lets requests arrive and leave; recorded once it has run.
        const adapters = onStep && this.stepAdapters(r.finished);
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
          // Finished in the engine: its blocks are free now, whenever the client reads the tokens; a
          // prefill for a remote decode keeps them until the decode worker has read them.
          live.ended = true;
          if (live.transfer?.kind === "send" && live.lease) {
            live.holding = true;
            this.heldRequests++;
          } else if (live.lease) this.cache.release(live.lease);
          live.wake?.();
        }
        if (adapters) onStep?.(adapters);
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
