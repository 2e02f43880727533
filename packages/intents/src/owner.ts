// The worker side: registers one attachment intent per DP rank as a transaction, and withdraws them
// on close. Either every rank's intent is registered or none is left behind.
import { pause } from "@kv-epp/protocol";
import pino, { type Logger } from "pino";
import type { Discovery, Registration } from "./discovery/types.ts";
import { findHost } from "./host-lookup.ts";
import { newIntentId } from "./ids.ts";
import { encodeIntent, INTENT_RECORD_VERSION, intentRecordName, type AttachmentIntent, type IntentDescriptor } from "./protocol.ts";
import { withdrawWithRetry, type Sleep } from "./retry.ts";
import { validateDescriptors } from "./validate.ts";

export type RegisterIntentsOptions = {
  discovery: Discovery;
  /** This process's worker id; every descriptor must carry it. */
  workerId: string;
  /** The host instance the intents are addressed to. */
  controlTarget: string;
  descriptors: readonly IntentDescriptor[];
  /** The caller going away: registration stops and everything registered is withdrawn. */
  signal?: AbortSignal;
  log?: Logger;
  /** Injectable for tests (backoff schedule, id source, registration time). */
  sleep?: Sleep;
  newId?: () => number;
  now?: () => number;
};

/** Registration failed at one rank; everything registered before it was withdrawn. */
export class IntentRegistrationError extends Error {
  override name = "IntentRegistrationError";
  constructor(
    readonly dpRank: number,
    override readonly cause: unknown,
  ) {
    super(`registering the intent of rank ${dpRank} failed (all intents withdrawn): ${String(cause)}`);
  }
}

type Owned = { intent: AttachmentIntent; reg: Registration };

export class IntentOwner {
  private closing: Promise<void> | undefined;

  /** @internal built by registerIntents */
  constructor(
    private readonly discovery: Discovery,
    private readonly owned: readonly Owned[],
    private readonly log: Logger,
    private readonly sleep: Sleep,
  ) {}

  /** The registered intents, in rank order. */
  get intents(): readonly AttachmentIntent[] {
    return this.owned.map((o) => o.intent);
  }

  managedRanks(): number[] {
    return this.owned.map((o) => o.intent.dpRank);
  }

  /** Idempotent: withdraws every intent in reverse order, each retried until done or the lease ends. */
  close(): Promise<void> {
    return (this.closing ??= withdrawAll(this.discovery, this.owned.map((o) => o.reg), this.log, this.sleep));
  }
}

async function withdrawAll(discovery: Discovery, regs: readonly Registration[], log: Logger, sleep: Sleep): Promise<void> {
  for (const reg of [...regs].reverse()) {
    const outcome = await withdrawWithRetry(discovery, reg, { sleep, log });
    log.debug({ record: reg.name, outcome }, "intent withdrawn");
  }
}

function abortError(signal: AbortSignal): Error {
  return signal.reason instanceof Error ? signal.reason : new DOMException("registration abandoned by the caller", "AbortError");
}

/** Rejects as soon as `signal` aborts, without waiting for `p` (which may never settle). */
function untilAborted<T>(p: Promise<T>, signal: AbortSignal | undefined): Promise<T> {
  if (!signal) return p;
  return new Promise<T>((resolve, reject) => {
    if (signal.aborted) return reject(abortError(signal));
    const onAbort = () => reject(abortError(signal));
    signal.addEventListener("abort", onAbort, { once: true });
    p.then(resolve, reject).finally(() => signal.removeEventListener("abort", onAbort));
  });
}

/**
 * Validates, finds the host, then registers the descriptors in rank order. On the k-th failure, or when
 * `signal` aborts mid-flight, every intent registered so far (the failing or in-flight one too, in case
 * it half-landed) is withdrawn before the error is thrown.
 */
export async function registerIntents(o: RegisterIntentsOptions): Promise<IntentOwner> {
  const log = o.log ?? pino({ level: "silent" });
  const sleep = o.sleep ?? pause;
  const newId = o.newId ?? (() => newIntentId());
  const now = o.now ?? Date.now;
  validateDescriptors(o.descriptors, o.workerId);
  if (o.signal?.aborted) throw abortError(o.signal);
  const host = await untilAborted(findHost(o.discovery, o.controlTarget, log), o.signal);

  const ordered = [...o.descriptors].sort((a, b) => a.dpRank - b.dpRank);
  const owned: Owned[] = [];
  for (const d of ordered) {
    const intent: AttachmentIntent = { ...d, intentId: newId(), host: host.hostInstance, producer: o.discovery.producer, registeredAt: now() };
    const reg: Registration = { kind: "intent", name: intentRecordName(intent), producer: o.discovery.producer };
    try {
      if (o.signal?.aborted) throw abortError(o.signal);
      const spec = { kind: "intent" as const, name: reg.name, payload: encodeIntent(intent), host: intent.host, version: INTENT_RECORD_VERSION };
      const inFlight = o.discovery.register(spec, { signal: o.signal });
      // A registration the caller abandoned may still land later: withdraw it then too.
      inFlight.then(
        () => {
          if (o.signal?.aborted) void withdrawWithRetry(o.discovery, reg, { sleep, log });
        },
        () => {},
      );
      await untilAborted(inFlight, o.signal);
      owned.push({ intent, reg });
      log.info({ worker: d.workerId, rank: d.dpRank, intent: intent.intentId, endpoint: d.endpoint, host: host.hostInstance }, "intent registered");
    } catch (err) {
      log.warn({ worker: d.workerId, rank: d.dpRank, err: String(err), withdrawing: owned.length + 1 }, "intent registration failed, rolling back");
      await withdrawAll(o.discovery, [...owned.map((x) => x.reg), reg], log, sleep);
      if (o.signal?.aborted) throw abortError(o.signal);
      throw new IntentRegistrationError(d.dpRank, err);
    }
  }
  return new IntentOwner(o.discovery, owned, log, sleep);
}
