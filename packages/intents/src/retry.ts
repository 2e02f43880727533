// Withdrawal retries: exponential backoff from 100 ms doubling to 5 s, until the withdrawal succeeds
// or the producer's lease ends (past that the store drops the record by itself). The sleep is
// injectable so tests run the schedule without waiting.
import { Backoff, type BackoffPolicy } from "@kv-epp/protocol";
import type { Logger } from "pino";
import type { Discovery, Registration } from "./discovery/types.ts";

/** Resolves after `ms`, or at once when `signal` aborts (never rejects); the default is the protocol's pause. */
export type Sleep = (ms: number, signal: AbortSignal) => Promise<unknown>;

export const WITHDRAW_BACKOFF = { initialMs: 100, maxMs: 5_000 } as const satisfies BackoffPolicy;

/** Retrying a registration that cannot happen yet (no host, API unreachable or forbidden). */
export const REGISTER_BACKOFF = { initialMs: 1_000, maxMs: 30_000 } as const satisfies BackoffPolicy;

export type WithdrawOutcome = "removed" | "missing" | "lease-ended";

export async function withdrawWithRetry(discovery: Discovery, reg: Registration, o: { sleep: Sleep; log: Logger }): Promise<WithdrawOutcome> {
  const backoff = new Backoff(WITHDRAW_BACKOFF);
  for (let attempt = 1; ; attempt++) {
    if (discovery.lease.aborted) return "lease-ended";
    try {
      // "Already missing" is success: someone (or the lease) withdrew it first.
      return await discovery.unregister(reg);
    } catch (err) {
      if (attempt === 1) o.log.warn({ record: reg.name, err: String(err) }, "withdrawing intent failed, retrying");
    }
    await o.sleep(backoff.next(), discovery.lease);
  }
}
