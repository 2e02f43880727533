// Restart pauses: doubling from initialMs to maxMs, each with +-20% jitter so that replicas restarted by
// the same API-server outage do not relist in step.

export function restartDelayMs(failures: number, b: { initialMs: number; maxMs: number }): number {
  const base = Math.min(b.maxMs, b.initialMs * 2 ** Math.min(failures, 30));
  return Math.round(base * (0.8 + 0.4 * Math.random()));
}

/** Resolves after `ms`, or at once when `signal` aborts. */
export function sleep(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal.aborted) return resolve();
    const done = () => {
      clearTimeout(t);
      signal.removeEventListener("abort", done);
      resolve();
    };
    const t = setTimeout(done, ms);
    signal.addEventListener("abort", done, { once: true });
  });
}
