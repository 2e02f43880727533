import { sleep } from "@kv-epp/protocol";
import type { AcquireIdentity, PrefixCacheSim } from "../cache/prefix-cache.ts";
import { Admission } from "./admission.ts";
import { TimingModel } from "./timing.ts";

/**
 * One data-parallel rank: its own prefix cache, its own running/waiting queue, driven by the timing
 * model. Requests wait for a running slot, reference their cached prefix for as long as they run,
 * spend prefill time on the uncached part and then decode output tokens one by one.
 */

export type Generation = {
  promptTokens: number;
  cachedTokens: number;
  outputTokens: number;
  /** Output token texts; the first is ready at once (it ended prefill), later ones take decode time. */
  tokens(): AsyncGenerator<string>;
  /** Releases the request's blocks and running slot; idempotent, call it in a finally. */
  finish(): void;
};

export type RankObserver = { onFirstToken?: (seconds: number) => void; onFinished?: (outputTokens: number) => void };

// Deterministic filler output: the mock has no model, only token counts matter.
const WORDS = [" the", " cache", " holds", " a", " prefix", " of", " blocks", " and", " tokens", " flow"];

export class RankEngine {
  readonly admission: Admission;

  constructor(
    readonly rank: number,
    readonly cache: PrefixCacheSim,
    readonly timing: TimingModel,
    private readonly observer: RankObserver = {},
  ) {
    this.admission = new Admission(timing.params.maxRunning);
  }

  /** Requests running plus waiting: the load used to pick a rank. */
  get load(): number {
    return this.admission.running + this.admission.waiting;
  }

  /** Queues, admits and prefills a prompt; resolves at the first token. */
  async start(prompt: Uint32Array, maxTokens: number, signal?: AbortSignal, identity?: AcquireIdentity): Promise<Generation> {
    const arrived = performance.now();
    await this.admission.enter(signal);
    const acq = this.cache.acquire(prompt, identity);
    let finished = false;
    const finish = () => {
      if (finished) return;
      finished = true;
      this.cache.release(acq.lease);
      this.admission.leave();
    };
    try {
      await sleep(this.timing.prefillMs(prompt.length, acq.cachedTokens), signal);
    } catch (e) {
      finish();
      throw e;
    }
    this.observer.onFirstToken?.((performance.now() - arrived) / 1000);
    const engine = this;
    return {
      promptTokens: prompt.length,
      cachedTokens: acq.cachedTokens,
      outputTokens: maxTokens,
      finish,
      async *tokens() {
        try {
          for (let i = 0; i < maxTokens; i++) {
            if (i > 0) await sleep(engine.timing.decodeMsPerToken(engine.admission.running), signal);
            yield WORDS[i % WORDS.length]!;
          }
          engine.observer.onFinished?.(maxTokens);
        } finally {
          finish();
        }
      },
    };
  }
}
