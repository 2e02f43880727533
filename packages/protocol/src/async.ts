// Waiting: a capped exponential backoff and sleeps that end early on an abort signal.

/**
 * Delays start at `initialMs` and grow by `factor` (default 2) up to `maxMs`. `jitter` (default 0) spreads
 * each delay uniformly over ±jitter of it, so that many clients retrying after one outage do not
 * retry in lockstep.
 */
export type BackoffPolicy = { initialMs: number; maxMs: number; factor?: number; jitter?: number };

export class Backoff {
  private current: number;
  private readonly factor: number;
  private readonly jitter: number;

  constructor(readonly policy: BackoffPolicy) {
    this.current = policy.initialMs;
    this.factor = policy.factor ?? 2;
    this.jitter = policy.jitter ?? 0;
  }

  /** The delay to wait now (jittered); the following one grows. */
  next(): number {
    const d = this.current;
    this.current = Math.min(d * this.factor, this.policy.maxMs);
    return this.jitter === 0 ? d : d * (1 - this.jitter + Math.random() * 2 * this.jitter);
  }

  /** The next delay before jitter, without taking it. */
  peek(): number {
    return this.current;
  }

  reset(): void {
    this.current = this.policy.initialMs;
  }
}

/**
 * Resolves after `ms`; rejects with the signal's reason as soon as it aborts. `ms <= 0` resolves without a
 * timer. The abort listener is removed when the timer fires (a caller sleeping once per token on one long
 * signal would otherwise pile listeners on it).
 */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  if (signal?.aborted) return Promise.reject(signal.reason);
  if (ms <= 0) return Promise.resolve();
  return new Promise<void>((resolve, reject) => {
    const onAbort = () => (clearTimeout(t), reject(signal!.reason));
    const t = setTimeout(() => (signal?.removeEventListener("abort", onAbort), resolve()), ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/** Like sleep, but an abort ends the wait instead of failing it: resolves true after `ms`, false on abort. */
export function pause(ms: number, signal: AbortSignal): Promise<boolean> {
  return sleep(ms, signal).then(
    () => true,
    () => false,
  );
}
