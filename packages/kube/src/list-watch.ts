// One list-then-watch loop over a Kubernetes collection, the job client-go's Reflector does: list, then
// watch from the list's resourceVersion; a watch that ends is resumed from the last version seen, a 410
// Gone relists, and any error relists after a pause. This loop is the only owner of restarts and their
// backoff.
//
// Written over client-node's Watch rather than its ListWatch/makeInformer because that informer splits
// the job: it reconnects ended watches with its own doubling delay but stops for good on a list or watch
// error (the caller had to restart it, a second restart policy), and it reports objects one by one with
// no signal that a list has been applied, so a caller cannot tell "not listed yet" from "listed, empty"
// nor avoid publishing the half-applied set of a relist.
import { type KubeConfig, type KubernetesListObject, type KubernetesObject, Watch } from "@kubernetes/client-node";
import { Backoff, pause } from "@kv-epp/protocol";

export type ListWatchOptions<T extends KubernetesObject> = {
  kubeConfig: KubeConfig;
  /** The collection's URL path, e.g. `/api/v1/namespaces/llm/pods`; watched with `?watch=true`. */
  path: string;
  /** Lists the same collection (with the same selector) through a typed client-node API. */
  list: () => Promise<KubernetesListObject<T>>;
  labelSelector?: string;
  /**
   * The whole cached set: after the first successful list, after every change the watch delivers, and
   * after a relist that changed something. Never before a list has succeeded: until then the set is
   * unknown, not empty.
   */
  onSnapshot: (items: T[]) => void;
  /** A list or watch failed (attempt: consecutive failures, from 1), or onSnapshot threw; the loop relists after a pause. */
  onError?: (err: unknown, info: { attempt: number; synced: boolean }) => void;
  /**
   * Errors that no retry can fix while nothing has been listed yet (e.g. 403, 404): the loop stops and
   * `synced` rejects, so a caller waiting for readiness does not wait forever. Later errors always retry.
   */
  giveUpBeforeSync?: (err: unknown) => boolean;
  /** Pause after the first failure, doubling per consecutive failure up to `maxMs` (default 1 s, 30 s). */
  backoff?: { initialMs: number; maxMs: number };
};

export type ListWatch<T extends KubernetesObject> = {
  /** True after the first successful list; false when stopped before one; rejects on a give-up error. */
  readonly synced: Promise<boolean>;
  /** The cache follows the server: a list succeeded and no error came since. */
  readonly fresh: boolean;
  /** The cached objects (the last snapshot). */
  items(): T[];
  stop(): Promise<void>;
};

export const DEFAULT_BACKOFF = { initialMs: 1000, maxMs: 30_000 } as const;
/** Each pause is spread over +-20% so that replicas restarted by one API-server outage do not relist in step. */
const JITTER = 0.2;

/** The HTTP status of a client-node error (ApiException has `code`, Watch errors `statusCode`). */
export function statusOf(err: unknown): number | undefined {
  const e = err as { code?: unknown; statusCode?: unknown } | null;
  const code = e?.code ?? e?.statusCode;
  return typeof code === "number" ? code : undefined;
}

const SHORT_WATCH_MS = 1000;

type WatchEnd = { resourceVersion: string; gone: boolean; healthy: boolean };

const keyOf = (o: KubernetesObject) => `${o.metadata?.namespace ?? ""}/${o.metadata?.name ?? ""}`;
const versionOf = (o: KubernetesObject | undefined) => o?.metadata?.resourceVersion;

export function listWatch<T extends KubernetesObject>(o: ListWatchOptions<T>): ListWatch<T> {
  const backoff = new Backoff({ ...(o.backoff ?? DEFAULT_BACKOFF), jitter: JITTER });
  const watcher = new Watch(o.kubeConfig);
  const stopping = new AbortController();
  let cache = new Map<string, T>();
  let fresh = false;
  let synced = false;
  let request: AbortController | undefined;
  let markSynced!: (v: boolean) => void;
  let failSync!: (err: unknown) => void;
  const syncedP = new Promise<boolean>((resolve, reject) => ((markSynced = resolve), (failSync = reject)));
  syncedP.catch(() => {}); // a caller that never awaits it must not see an unhandled rejection

  let attempt = 0; // consecutive failures
  const report = (err: unknown) => o.onError?.(err, { attempt, synced });
  const emit = () => {
    try {
      o.onSnapshot([...cache.values()]);
    } catch (err) {
      report(err); // a consumer's bug must not stop the loop
    }
  };

  /** Replaces the cache with a list; true when anything differs from before. */
  const replace = (items: T[]): boolean => {
    const next = new Map<string, T>();
    let changed = items.length !== cache.size;
    for (const item of items) {
      const k = keyOf(item);
      if (!changed && versionOf(cache.get(k)) !== versionOf(item)) changed = true;
      next.set(k, item);
    }
    cache = next;
    return changed;
  };

  const watchOnce = (resourceVersion: string) =>
    new Promise<WatchEnd>((resolve, reject) => {
      const opened = Date.now();
      let last = resourceVersion;
      let delivered = false;
      let gone = false;
      let failed: unknown;
      const query: Record<string, string | boolean> = { resourceVersion, allowWatchBookmarks: true };
      if (o.labelSelector !== undefined) query.labelSelector = o.labelSelector;
      const onEvent = (type: string, obj: T & { code?: number; message?: string }) => {
        if (stopping.signal.aborted) return;
        if (type === "ERROR") {
          // A Status object; the server ends the stream after it.
          if (obj.code === 410) gone = true;
          else failed = Object.assign(new Error(`watch ${o.path}: ${obj.message ?? "error event"}`), { code: obj.code });
          return;
        }
        delivered = true;
        last = versionOf(obj) ?? last;
        const k = keyOf(obj);
        if (type === "DELETED") {
          if (cache.delete(k)) emit();
        } else if (type === "ADDED" || type === "MODIFIED") {
          const had = cache.get(k);
          cache.set(k, obj);
          if (versionOf(had) === undefined || versionOf(had) !== versionOf(obj)) emit();
        }
      };
      const onDone = (err: unknown) => {
        request = undefined;
        const timedOut = (err as { name?: string } | null)?.name === "TimeoutError"; // client-node's inactivity timeout
        if (err && !timedOut && statusOf(err) !== 410) return reject(err);
        if (failed !== undefined) return reject(failed);
        // A watch that ends within a second with nothing delivered counts as a failure for the backoff
        // (client-go's "very short watch"), so an API server that keeps closing streams is not hammered.
        const healthy = delivered || timedOut || Date.now() - opened >= SHORT_WATCH_MS;
        resolve({ resourceVersion: last, gone: gone || statusOf(err) === 410, healthy });
      };
      watcher.watch(o.path, query, onEvent, onDone).then((req) => {
        request = req;
        if (stopping.signal.aborted) req.abort();
      }, reject);
    });

  const run = async () => {
    let resourceVersion = "";
    while (!stopping.signal.aborted) {
      try {
        if (resourceVersion === "") {
          const list = await o.list();
          if (stopping.signal.aborted) break;
          const changed = replace(list.items ?? []);
          resourceVersion = list.metadata?.resourceVersion ?? "";
          fresh = true;
          attempt = 0;
          backoff.reset();
          if (!synced || changed) {
            synced = true;
            emit();
            markSynced(true);
          }
        }
        const end = await watchOnce(resourceVersion);
        if (stopping.signal.aborted) break;
        resourceVersion = end.gone ? "" : end.resourceVersion;
        if (end.healthy || end.gone) {
          attempt = 0;
          backoff.reset();
        } else {
          attempt++;
          await pause(backoff.next(), stopping.signal);
        }
      } catch (err) {
        if (stopping.signal.aborted) break;
        fresh = false;
        resourceVersion = ""; // relist: the cache may have missed anything since the failure
        if (!synced && o.giveUpBeforeSync?.(err)) {
          stopping.abort();
          failSync(err);
          return;
        }
        attempt++;
        report(err);
        await pause(backoff.next(), stopping.signal);
      }
    }
    markSynced(false);
  };
  void run();

  return {
    synced: syncedP,
    get fresh() {
      return fresh;
    },
    items: () => [...cache.values()],
    async stop() {
      stopping.abort();
      request?.abort();
      request = undefined;
    },
  };
}
