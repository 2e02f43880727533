// The host side (the EPP): advertise this process as the KV-state host, and turn the live intents
// addressed to it into a desired set of attachments, level-triggered.
import pino, { type Logger } from "pino";
import { Backoff, pause, workerKey, type BackoffPolicy } from "@kv-epp/protocol";
import { REGISTER_BACKOFF, type Sleep } from "./retry.ts";
import type { Discovery, DiscoveryRecord, Registration, WatchHandle } from "./discovery/types.ts";
import { decodeIntent, encodeHost, HOST_PROTOCOL_VERSION, hostRecordName, VLLM_KV_EVENTS_PROTOCOL, type AttachmentIntent } from "./protocol.ts";

export type HostAdvertiser = { readonly registration: Registration; close(): Promise<void> };

/**
 * Registers the host advertisement. Replicas of one host share it (one record, several holders), so a
 * worker finds exactly one host whatever the replica count.
 */
export async function advertiseHost(o: { discovery: Discovery; hostInstance: string; log?: Logger }): Promise<HostAdvertiser> {
  const payload = encodeHost({ version: HOST_PROTOCOL_VERSION, hostInstance: o.hostInstance, producer: o.discovery.producer });
  const registration = await o.discovery.register({
    kind: "host",
    name: hostRecordName(o.hostInstance),
    payload,
    shared: true,
    host: o.hostInstance,
    version: HOST_PROTOCOL_VERSION,
  });
  o.log?.info({ host: o.hostInstance, record: registration.name }, "advertising as KV host");
  let closed: Promise<void> | undefined;
  return {
    registration,
    close: () =>
      (closed ??= o.discovery.unregister(registration).then(
        () => {},
        (err) => o.log?.warn({ err: String(err) }, "withdrawing the host advertisement failed (the lease will)"),
      )),
  };
}

export type IntentWatcherOptions = {
  discovery: Discovery;
  /** Only intents addressed to this host instance are attached. */
  hostInstance: string;
  /** Called with the whole desired set whenever it changes (sorted by worker, then rank). */
  onChange: (desired: AttachmentIntent[]) => void;
  log?: Logger;
};

/** Turns live intents into the desired attachments: one per (worker, rank), the newest intent wins. */
export function desiredAttachments(records: readonly DiscoveryRecord[], hostInstance: string, onSkip?: (name: string, why: string) => void): AttachmentIntent[] {
  const byRank = new Map<string, AttachmentIntent>();
  for (const rec of records) {
    let intent: AttachmentIntent;
    try {
      intent = decodeIntent(rec.payload);
    } catch (err) {
      onSkip?.(rec.name, String(err));
      continue;
    }
    if (intent.host !== hostInstance) continue;
    if (intent.protocol !== VLLM_KV_EVENTS_PROTOCOL) {
      onSkip?.(rec.name, `unsupported protocol ${intent.protocol}`);
      continue;
    }
    // A restarted worker process registers afresh before its old records are collected.
    const key = workerKey(intent);
    const seen = byRank.get(key);
    if (!seen || intent.registeredAt > seen.registeredAt || (intent.registeredAt === seen.registeredAt && intent.intentId > seen.intentId))
      byRank.set(key, intent);
  }
  return [...byRank.values()].sort((a, b) => (a.workerId < b.workerId ? -1 : a.workerId > b.workerId ? 1 : a.dpRank - b.dpRank));
}

export class IntentWatcher {
  private readonly log: Logger;
  private readonly skipped = new Set<string>();
  private desiredSet: AttachmentIntent[] = [];
  private fingerprint = "";
  private watch: WatchHandle | undefined;

  constructor(private readonly o: IntentWatcherOptions) {
    this.log = o.log ?? pino({ level: "silent" });
  }

  /** Resolves once the first snapshot has been reconciled (onChange called with it). */
  start(): Promise<void> {
    this.watch ??= this.o.discovery.listAndWatch({ kind: "intent", host: this.o.hostInstance }, (records) => this.reconcile(records));
    return this.watch.ready;
  }

  desired(): readonly AttachmentIntent[] {
    return this.desiredSet;
  }

  /** Stops watching; `start()` may be called again (a fresh list and watch). */
  close(): void {
    this.watch?.close();
    this.watch = undefined;
  }

  private reconcile(records: DiscoveryRecord[]): void {
    const desired = desiredAttachments(records, this.o.hostInstance, (name, why) => {
      // Warn once per record, not on every snapshot.
      if (this.skipped.has(name)) return;
      this.skipped.add(name);
      this.log.warn({ record: name, err: why }, "skipping intent");
    });
    for (const name of this.skipped) if (!records.some((r) => r.name === name)) this.skipped.delete(name);
    const fingerprint = JSON.stringify(desired);
    if (fingerprint === this.fingerprint) return; // "" at first, so the first snapshot always goes out
    this.fingerprint = fingerprint;
    this.desiredSet = desired;
    this.log.info({ attachments: desired.map((d) => `${d.workerId}/${d.dpRank}`) }, "intent attachments changed");
    this.o.onChange(desired);
  }
}

export type IntentHostState =
  | { kind: "starting" }
  | { kind: "ready" }
  /** The last attempt failed (advertising or the first list); the next one runs in `retryInMs`. */
  | { kind: "retrying"; attempt: number; error: string; retryInMs: number }
  /** The discovery's lease ended: nothing can be registered through it any more. */
  | { kind: "failed"; error: string }
  | { kind: "stopped" };

export type IntentHostOptions = IntentWatcherOptions & {
  /**
   * Backoff between start attempts (default 1 s doubling to 30 s); `false`: reject on the first
   * failure, as a one-shot start.
   */
  retry?: BackoffPolicy | false;
  /** Every state change (for a metric or a log line beside the host's own). */
  onState?: (s: IntentHostState) => void;
  sleep?: Sleep;
};

export type IntentHost = {
  readonly watcher: IntentWatcher;
  state(): IntentHostState;
  /** Resolves once advertised and the first desired set has been handed to `onChange` (never rejects). */
  readonly ready: Promise<void>;
  stop(): Promise<void>;
};

/**
 * The whole host side in one call: advertise, then watch. When the first attempt succeeds it resolves
 * after the first desired set has been handed to `onChange`, so a caller that subscribes before
 * recovery sees every live intent. When it fails (API unreachable, RBAC not yet applied), it still
 * resolves, in state `retrying`, and keeps trying in the background with backoff: a caller that only
 * logs and carries on (the EPP serving the pods it knows) gets the intents through `onChange` later.
 * An advertisement that went through is kept across attempts; only what failed is redone.
 */
export async function startIntentHost(o: IntentHostOptions): Promise<IntentHost> {
  const log = o.log ?? pino({ level: "silent" });
  const sleep = o.sleep ?? pause;
  const backoff = o.retry === false ? undefined : (o.retry ?? REGISTER_BACKOFF);
  const watcher = new IntentWatcher(o);
  const stopping = new AbortController();
  let ad: HostAdvertiser | undefined;
  let state: IntentHostState = { kind: "starting" };
  const setState = (s: IntentHostState) => {
    state = s;
    o.onState?.(s);
  };
  const attempt = async () => {
    ad ??= await advertiseHost(o);
    try {
      await watcher.start();
    } catch (err) {
      watcher.close(); // the next attempt lists and watches afresh
      throw err;
    }
  };
  let ready: Promise<void>;
  try {
    await attempt();
    setState({ kind: "ready" });
    ready = Promise.resolve();
  } catch (err) {
    if (!backoff) {
      await ad?.close();
      throw err;
    }
    ready = (async () => {
      const delays = new Backoff(backoff);
      let error = err;
      for (let n = 1; ; n++) {
        if (o.discovery.lease.aborted) {
          setState({ kind: "failed", error: String(o.discovery.lease.reason ?? error) });
          log.error({ host: o.hostInstance, err: String(error) }, "KV host not started: the discovery lease has ended");
          return;
        }
        const delay = delays.next();
        setState({ kind: "retrying", attempt: n, error: String(error), retryInMs: delay });
        log.warn({ host: o.hostInstance, err: String(error), attempt: n, ms: delay }, "starting the KV host failed, retrying");
        await sleep(delay, AbortSignal.any([stopping.signal, o.discovery.lease]));
        if (stopping.signal.aborted) return;
        try {
          await attempt();
          if (stopping.signal.aborted) return; // stop() raced the attempt: it cleans up
          setState({ kind: "ready" });
          log.info({ host: o.hostInstance, attempt: n + 1 }, "KV host started");
          return;
        } catch (e) {
          error = e;
        }
      }
    })();
  }
  let stopped: Promise<void> | undefined;
  return {
    watcher,
    state: () => state,
    ready,
    stop: () =>
      (stopped ??= (async () => {
        stopping.abort();
        watcher.close(); // settles a first list still in flight, so the attempt ends
        await ready;
        watcher.close(); // in case the attempt started it again meanwhile
        await ad?.close();
        setState({ kind: "stopped" });
      })()),
  };
}
