// The discovery store both sides talk to. Records are named, typed JSON payloads owned by the
// process (producer) that registered them; a producer's records go away with its lease (its process,
// its pod), so presence means "live". Readers are level-triggered: they get whole snapshots.

export type RecordKind = "intent" | "host";

export type RecordSpec = {
  kind: RecordKind;
  /** Unique per kind; also the Kubernetes object name (lowercase, '-', at most 63 characters). */
  name: string;
  payload: unknown;
  /**
   * A shared record may be registered by several producers under one name (EPP replicas advertising
   * the same host): it stays while any of them holds it. A plain record's name must be free.
   */
  shared?: boolean;
  /** The host instance the record concerns (an intent's addressee, an advertisement's host): queryable. */
  host?: string;
  /** The payload's protocol version, for backends that index it (a Kubernetes label). */
  version?: number;
};

/** What register returns and unregister takes. */
export type Registration = { kind: RecordKind; name: string; producer: string };

export type DiscoveryRecord = { kind: RecordKind; name: string; payload: unknown; producer: string };

/** `host` narrows to records registered with that host (readers still check payloads). */
export type Query = { kind: RecordKind; host?: string };

export type WatchHandle = {
  /** Settles after the first snapshot has been delivered (rejects if the first list fails for good). */
  ready: Promise<void>;
  close(): void;
};

/** A record of that name exists already (and the spec is not shared). */
export class RecordExistsError extends Error {
  override name = "RecordExistsError";
}

export interface Discovery {
  /** This process instance: stamped on every record it registers. */
  readonly producer: string;
  /** Aborted when this producer's lease ends: its records are gone (or going) without it. */
  readonly lease: AbortSignal;
  /** Creates the record; `signal` lets a backend give up a request the caller no longer waits for. */
  register(spec: RecordSpec, opts?: { signal?: AbortSignal }): Promise<Registration>;
  /** Removes it; "missing" when it was not there (already withdrawn or expired). */
  unregister(reg: Registration): Promise<"removed" | "missing">;
  list(q: Query): Promise<DiscoveryRecord[]>;
  /** Informer style: `onSnapshot` gets the whole current set of that kind after every change. */
  listAndWatch(q: Query, onSnapshot: (records: DiscoveryRecord[]) => void): WatchHandle;
  /** Ends the lease: this producer's records go, watches stop. */
  close(): Promise<void>;
}
