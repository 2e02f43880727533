// The fake API server's storage: one global resourceVersion counter (as etcd's revision), objects per
// resource type, and an event log that watches replay from. compact() forgets the log, after which a
// watch from an older resourceVersion gets 410 Gone, exactly the case informers must relist on.
import { apiVersionOf, type KubeObject, type ResourceType } from "./resources.ts";

export type WatchEventType = "ADDED" | "MODIFIED" | "DELETED";

export class ApiError extends Error {
  constructor(
    readonly code: number,
    readonly reason: string,
    message: string,
    readonly details?: { name?: string; kind?: string; group?: string },
  ) {
    super(message);
  }
}

type LogEntry = { rv: number; res: string; type: WatchEventType; obj: KubeObject; prev?: KubeObject };

export type WatchSink = {
  res: ResourceType;
  namespace?: string;
  match: (obj: KubeObject) => boolean;
  send: (type: WatchEventType, obj: KubeObject) => void;
};

const resKey = (r: ResourceType) => `${r.group}/${r.plural}`;
const objKey = (ns: string | undefined, name: string) => `${ns ?? ""}/${name}`;

/** What a watcher sees of one change, given whether the old and new objects match its selectors. */
function translate(type: WatchEventType, prev: KubeObject | undefined, obj: KubeObject, sink: WatchSink): WatchEventType | null {
  if (sink.namespace !== undefined && obj.metadata?.namespace !== sink.namespace) return null;
  const was = prev !== undefined && sink.match(prev);
  const is = sink.match(obj);
  if (type === "ADDED") return is ? "ADDED" : null;
  if (type === "DELETED") return was || is ? "DELETED" : null;
  if (was && is) return "MODIFIED";
  if (is) return "ADDED";
  if (was) return "DELETED"; // left the selector: the watcher must forget it
  return null;
}

function specOf(o: KubeObject): string {
  const { metadata: _m, status: _s, ...rest } = o;
  return JSON.stringify(rest);
}

export class ObjectStore {
  private rv = 1000;
  private compactedRv = 1000;
  private readonly objects = new Map<string, Map<string, KubeObject>>();
  private readonly types = new Map<string, ResourceType>();
  private log: LogEntry[] = [];
  private readonly sinks = new Set<WatchSink>();

  constructor(private readonly maxLog = 100_000) {}

  currentRv(): number {
    return this.rv;
  }

  private bucket(r: ResourceType): Map<string, KubeObject> {
    const k = resKey(r);
    let b = this.objects.get(k);
    if (!b) {
      b = new Map();
      this.objects.set(k, b);
      this.types.set(k, r);
    }
    return b;
  }

  get(r: ResourceType, ns: string | undefined, name: string): KubeObject | undefined {
    const o = this.bucket(r).get(objKey(ns, name));
    return o && structuredClone(o);
  }

  list(r: ResourceType, ns: string | undefined, match: (o: KubeObject) => boolean = () => true): KubeObject[] {
    const out: KubeObject[] = [];
    for (const o of this.bucket(r).values()) {
      if (ns !== undefined && o.metadata?.namespace !== ns) continue;
      if (match(o)) out.push(structuredClone(o));
    }
    return out.sort((a, b) => objKey(a.metadata?.namespace, a.metadata?.name ?? "").localeCompare(objKey(b.metadata?.namespace, b.metadata?.name ?? "")));
  }

  create(r: ResourceType, input: KubeObject): KubeObject {
    const obj = structuredClone(input);
    const meta = (obj.metadata ??= {});
    if (!meta.name && meta.generateName) meta.name = meta.generateName + Math.random().toString(36).slice(2, 7);
    if (!meta.name) throw new ApiError(422, "Invalid", `${r.kind} must have metadata.name`, { kind: r.kind });
    if (!r.namespaced) delete meta.namespace;
    const b = this.bucket(r);
    const key = objKey(meta.namespace, meta.name);
    if (b.has(key)) throw new ApiError(409, "AlreadyExists", `${r.plural} "${meta.name}" already exists`, { name: meta.name, kind: r.plural, group: r.group });
    obj.apiVersion ??= apiVersionOf(r);
    obj.kind ??= r.kind;
    meta.uid ??= crypto.randomUUID();
    meta.creationTimestamp ??= new Date().toISOString();
    meta.generation = 1;
    delete meta.deletionTimestamp;
    meta.resourceVersion = String(++this.rv);
    b.set(key, obj);
    this.record(r, "ADDED", obj, undefined);
    return structuredClone(obj);
  }

  /** Replaces an object (or only its status); `expectedRv` gives optimistic concurrency. */
  update(r: ResourceType, input: KubeObject, opts: { statusOnly?: boolean } = {}): KubeObject {
    const name = input.metadata?.name ?? "";
    const ns = r.namespaced ? input.metadata?.namespace : undefined;
    const b = this.bucket(r);
    const key = objKey(ns, name);
    const prev = b.get(key);
    if (!prev) throw new ApiError(404, "NotFound", `${r.plural} "${name}" not found`, { name, kind: r.plural, group: r.group });
    const expected = input.metadata?.resourceVersion;
    if (expected && expected !== prev.metadata?.resourceVersion) {
      throw new ApiError(409, "Conflict", `Operation cannot be fulfilled on ${r.plural} "${name}": the object has been modified; please apply your changes to the latest version and try again`, { name, kind: r.plural, group: r.group });
    }
    const obj: KubeObject = opts.statusOnly ? { ...structuredClone(prev), status: structuredClone(input.status) } : structuredClone(input);
    const pm = prev.metadata!;
    const meta = (obj.metadata ??= {});
    meta.name = pm.name;
    if (pm.namespace !== undefined) meta.namespace = pm.namespace;
    meta.uid = pm.uid;
    meta.creationTimestamp = pm.creationTimestamp;
    if (pm.deletionTimestamp) meta.deletionTimestamp = pm.deletionTimestamp;
    meta.generation = (pm.generation ?? 1) + (specOf(obj) !== specOf(prev) ? 1 : 0);
    obj.apiVersion ??= prev.apiVersion;
    obj.kind ??= prev.kind;
    if (meta.deletionTimestamp && !(meta.finalizers?.length)) {
      this.removeNow(r, prev);
      return structuredClone(prev);
    }
    meta.resourceVersion = String(++this.rv);
    b.set(key, obj);
    this.record(r, "MODIFIED", obj, prev);
    return structuredClone(obj);
  }

  /**
   * Deletes as the API server does: an object with finalizers only gets a deletionTimestamp
   * (MODIFIED) until they are removed; `force` skips that. Dependents (ownerReferences) are
   * garbage-collected in the same step.
   */
  delete(r: ResourceType, ns: string | undefined, name: string, opts: { force?: boolean } = {}): KubeObject {
    const b = this.bucket(r);
    const prev = b.get(objKey(r.namespaced ? ns : undefined, name));
    if (!prev) throw new ApiError(404, "NotFound", `${r.plural} "${name}" not found`, { name, kind: r.plural, group: r.group });
    if (!opts.force && prev.metadata?.finalizers?.length) {
      if (prev.metadata.deletionTimestamp) return structuredClone(prev);
      const marked = structuredClone(prev);
      marked.metadata!.deletionTimestamp = new Date().toISOString();
      marked.metadata!.resourceVersion = String(++this.rv);
      b.set(objKey(marked.metadata!.namespace, name), marked);
      this.record(r, "MODIFIED", marked, prev);
      return structuredClone(marked);
    }
    return this.removeNow(r, prev);
  }

  private removeNow(r: ResourceType, prev: KubeObject): KubeObject {
    const gone = structuredClone(prev);
    this.bucket(r).delete(objKey(prev.metadata?.namespace, prev.metadata?.name ?? ""));
    // A DELETED event carries a fresh resourceVersion so a watch resumed after it skips it.
    gone.metadata!.resourceVersion = String(++this.rv);
    this.record(r, "DELETED", gone, prev);
    this.collectDependents(prev.metadata?.uid);
    return structuredClone(gone);
  }

  /** Whether any stored object has this uid (an owner reference's target still exists). */
  private exists(uid: string): boolean {
    for (const b of this.objects.values()) for (const o of b.values()) if (o.metadata?.uid === uid) return true;
    return false;
  }

  /**
   * The garbage collector's part, as Kubernetes does it: a dependent goes only when none of its owners
   * exists any more; one that still has a live owner keeps living and loses its dangling references
   * (MODIFIED). A record shared by several pods (owned by each) thus survives all but the last.
   */
  private collectDependents(uid: string | undefined): void {
    if (!uid) return;
    for (const [k, b] of this.objects) {
      const r = this.types.get(k)!;
      for (const o of [...b.values()]) {
        const refs = o.metadata?.ownerReferences ?? [];
        if (!refs.some((ref) => ref.uid === uid) || !b.has(objKey(o.metadata!.namespace, o.metadata!.name ?? ""))) continue;
        const live = refs.filter((ref) => ref.uid !== uid && this.exists(ref.uid));
        if (live.length === 0) {
          this.delete(r, o.metadata!.namespace, o.metadata!.name ?? "", { force: true });
          continue;
        }
        const kept = structuredClone(o);
        kept.metadata!.ownerReferences = live;
        kept.metadata!.resourceVersion = String(++this.rv);
        b.set(objKey(kept.metadata!.namespace, kept.metadata!.name ?? ""), kept);
        this.record(r, "MODIFIED", kept, o);
      }
    }
  }

  private record(r: ResourceType, type: WatchEventType, obj: KubeObject, prev: KubeObject | undefined): void {
    const entry: LogEntry = { rv: this.rv, res: resKey(r), type, obj: structuredClone(obj), prev: prev && structuredClone(prev) };
    this.log.push(entry);
    if (this.log.length > this.maxLog) this.compact(this.log[this.log.length - this.maxLog]!.rv - 1);
    for (const sink of this.sinks) {
      if (resKey(sink.res) !== entry.res) continue;
      const t = translate(type, entry.prev, entry.obj, sink);
      if (t) sink.send(t, structuredClone(entry.obj));
    }
  }

  /** Forgets the event log up to `uptoRv` (default: everything so far). */
  compact(uptoRv: number = this.rv): void {
    this.compactedRv = Math.max(this.compactedRv, Math.min(uptoRv, this.rv));
    this.log = this.log.filter((e) => e.rv > this.compactedRv);
  }

  /**
   * Starts a watch. `fromRv` empty or "0" sends the current state as ADDED first; a number replays
   * the log after it, or answers "gone" when it is older than the compacted log.
   */
  watch(sink: WatchSink, fromRv: string | undefined): "gone" | (() => void) {
    if (!fromRv || fromRv === "0") {
      for (const o of this.list(sink.res, sink.namespace, sink.match)) sink.send("ADDED", o);
    } else {
      const from = Number(fromRv);
      if (!Number.isFinite(from) || from < this.compactedRv) return "gone";
      const k = resKey(sink.res);
      for (const e of this.log) {
        if (e.rv <= from || e.res !== k) continue;
        const t = translate(e.type, e.prev, e.obj, sink);
        if (t) sink.send(t, structuredClone(e.obj));
      }
    }
    this.sinks.add(sink);
    return () => this.sinks.delete(sink);
  }
}
