// Polling for a condition, the one way tests in this repo wait (never a bare sleep).

export type WaitOptions = { timeoutMs?: number; intervalMs?: number; message?: string };

/** Resolves with the predicate's first truthy value; rejects after `timeoutMs` (default 10 s). */
export async function waitFor<T>(predicate: () => T | Promise<T>, opts: WaitOptions = {}): Promise<NonNullable<T>> {
  const timeoutMs = opts.timeoutMs ?? 10_000;
  const intervalMs = opts.intervalMs ?? 20;
  const deadline = Date.now() + timeoutMs;
  let lastError: unknown;
  for (;;) {
    try {
      const v = await predicate();
      if (v) return v as NonNullable<T>;
      lastError = undefined;
    } catch (e) {
      lastError = e;
    }
    if (Date.now() >= deadline) {
      const why = lastError instanceof Error ? `: last error ${lastError.message}` : "";
      throw new Error(`waitFor timed out after ${timeoutMs} ms${opts.message ? ` (${opts.message})` : ""}${why}`);
    }
    await Bun.sleep(intervalMs);
  }
}
