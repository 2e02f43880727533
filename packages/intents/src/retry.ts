// Withdrawal retries: exponential backoff from 100 ms doubling to 5 s, until the withdrawal succeeds
// or the producer's lease ends (past that the store drops the record by itself). The sleep is
// injectable so tests run the schedule without waiting.
import type { Logger } from "pino";
import type { Discovery, Registration } from "./discovery/types.ts";

/** Resolves after `ms`, or at once when `signal` aborts. */
export type Sleep = (ms: number, signal: AbortSignal) => Promise<void>;

export const realSleep: Sleep = (ms, signal) =>
  new Promise((resolve) => {
    if (signal.aborted) return resolve();
    const done = () => {
      clearTimeout(t);
      signal.removeEventListener("abort", done);
      resolve();
    };
    const t = setTimeout(done, ms);
    signal.addEventListener("abort", done, { once: true });
  });

export const WITHDRAW_BACKOFF = { initialMs: 100, maxMs: 5_000 } as const;

/** Retrying a registration that cannot happen yet (no host, API unreachable or forbidden). */
export const REGISTER_BACKOFF = { initialMs: 1_000, maxMs: 30_000 } as const;

export type Backoff = { initialMs: number; maxMs: number };

export type WithdrawOutcome = "removed" | "missing" | "lease-ended";

export async function withdrawWithRetry(discovery: Discovery, reg: Registration, o: { sleep: Sleep; log: Logger }): Promise<WithdrawOutcome> {
  let delay: number = WITHDRAW_BACKOFF.initialMs;
  for (let attempt = 1; ; attempt++) {
    if (discovery.lease.aborted) return "lease-ended";
    try {
      // "Already missing" is success: someone (or the lease) withdrew it first.
      return await discovery.unregister(reg);
    } catch (err) {
      if (attempt === 1) o.log.warn({ record: reg.name, err: String(err) }, "withdrawing intent failed, retrying");
    }
    await o.sleep(delay, discovery.lease);
    delay = Math.min(delay * 2, WITHDRAW_BACKOFF.maxMs);
  }
}
