// The host side (the EPP): advertise this process as the KV-state host, and turn the live intents
// addressed to it into a desired set of attachments, level-triggered.
import pino, { type Logger } from "pino";
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
    const key = `${intent.workerId}\u0000${intent.dpRank}`;
    const seen = byRank.get(key);
    if (!seen || intent.registeredAt > seen.registeredAt || (intent.registeredAt === seen.registeredAt && intent.intentId > seen.intentId))
      byRank.set(key, intent);
  }
  return [...byRank.values()].sort((a, b) => (a.workerId < b.workerId ? -1 : a.workerId > b.workerId ? 1 : a.dpRank - b.dpRank));
}

export class IntentWatcher {
  readonly #log: Logger;
  readonly #skipped = new Set<string>();
  #desired: AttachmentIntent[] = [];
  #fingerprint = "";
  #watch: WatchHandle | undefined;

  constructor(private readonly o: IntentWatcherOptions) {
    this.#log = o.log ?? pino({ level: "silent" });
  }

  /** Resolves once the first snapshot has been reconciled (onChange called with it). */
  start(): Promise<void> {
    this.#watch ??= this.o.discovery.listAndWatch({ kind: "intent", host: this.o.hostInstance }, (records) => this.#reconcile(records));
    return this.#watch.ready;
  }

  desired(): readonly AttachmentIntent[] {
    return this.#desired;
  }

  close(): void {
    this.#watch?.close();
  }

  #reconcile(records: DiscoveryRecord[]): void {
    const desired = desiredAttachments(records, this.o.hostInstance, (name, why) => {
      // Warn once per record, not on every snapshot.
      if (this.#skipped.has(name)) return;
      this.#skipped.add(name);
      this.#log.warn({ record: name, err: why }, "skipping intent");
    });
    for (const name of this.#skipped) if (!records.some((r) => r.name === name)) this.#skipped.delete(name);
    const fingerprint = JSON.stringify(desired);
    if (fingerprint === this.#fingerprint) return; // "" at first, so the first snapshot always goes out
    this.#fingerprint = fingerprint;
    this.#desired = desired;
    this.#log.info({ attachments: desired.map((d) => `${d.workerId}/${d.dpRank}`) }, "intent attachments changed");
    this.o.onChange(desired);
  }
}

export type IntentHost = { readonly watcher: IntentWatcher; stop(): Promise<void> };

/**
 * The whole host side in one call: advertise, then watch. Resolves after the first desired set has been
 * handed to `onChange`, so a caller that subscribes before recovery sees every live intent.
 */
export async function startIntentHost(o: IntentWatcherOptions): Promise<IntentHost> {
  const ad = await advertiseHost(o);
  const watcher = new IntentWatcher(o);
  try {
    await watcher.start();
  } catch (err) {
    watcher.close();
    await ad.close();
    throw err;
  }
  return {
    watcher,
    stop: async () => {
      watcher.close();
      await ad.close();
    },
  };
}
