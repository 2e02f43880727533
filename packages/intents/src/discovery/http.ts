// Client of the HTTP-served store (http-server.ts). Connecting opens this producer's lease stream; the
// lease ends when that stream ends (store gone, network cut), when the store stays silent for a lease
// (a store frozen or cut off behind a half-open connection), when a renewal is refused, or on close().
import { randomUUID } from "node:crypto";
import { pause } from "@kv-epp/protocol";
import pino, { type Logger } from "pino";
import { HEARTBEAT_MS, LEASE_TTL_MS } from "./http-server.ts";
import { RecordExistsError, type Discovery, type DiscoveryRecord, type Query, type RecordSpec, type Registration, type WatchHandle } from "./types.ts";

const queryString = (q: Query) => `kind=${q.kind}${q.host !== undefined ? `&host=${encodeURIComponent(q.host)}` : ""}`;

export type HttpDiscoveryOptions = {
  /** Base URL of the store, e.g. `http://127.0.0.1:7070`. */
  url: string;
  producer?: string;
  log?: Logger;
  /** Pause before re-opening a dropped watch stream. */
  retryMs?: number;
  /** Renewal period of the lease (default: the store's heartbeat period). */
  renewMs?: number;
  /** A store silent this long (no heartbeat line) ends the lease (default: the store's lease TTL). */
  silenceMs?: number;
};

/** Reads an NDJSON body line by line until it ends (aborting the fetch's signal ends it too). */
async function* lines(res: Response): AsyncGenerator<unknown> {
  const reader = res.body!.pipeThrough(new TextDecoderStream()).getReader();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += value;
    let nl: number;
    while ((nl = buf.indexOf("\n")) >= 0) {
      const line = buf.slice(0, nl);
      buf = buf.slice(nl + 1);
      if (line) yield JSON.parse(line);
    }
  }
}

async function check(res: Response, what: string): Promise<Response> {
  if (res.ok) return res;
  const body = (await res.json().catch(() => ({}))) as { error?: string };
  const msg = `${what}: HTTP ${res.status}${body.error ? ` ${body.error}` : ""}`;
  throw res.status === 409 ? new RecordExistsError(msg) : new Error(msg);
}

export async function connectHttpDiscovery(o: HttpDiscoveryOptions): Promise<Discovery> {
  const base = o.url.replace(/\/+$/, "");
  const producer = o.producer ?? `proc-${randomUUID()}`;
  const log = o.log ?? pino({ level: "silent" });
  const retryMs = o.retryMs ?? 500;
  const lease = new AbortController();
  const leaseStream = new AbortController();
  const watches = new Set<WatchHandle>();

  const res = await check(await fetch(`${base}/v1/lease?producer=${encodeURIComponent(producer)}`, { signal: leaseStream.signal }), "opening the lease");
  const stream = lines(res);
  await stream.next(); // the server's first line: the lease is held
  const renewMs = o.renewMs ?? HEARTBEAT_MS;
  const silenceMs = o.silenceMs ?? LEASE_TTL_MS;
  let heardAt = Date.now();
  const endLease = (why: string) => {
    if (lease.signal.aborted) return;
    log.warn({ producer, why }, "discovery lease ended: records withdrawn by the store");
    lease.abort(new Error(`lease of ${producer} ended: ${why}`));
    leaseStream.abort();
    clearInterval(renewal);
  };
  // Renew (the store ends a lease not renewed for three periods), and watch the store's heartbeats.
  const renewal = setInterval(() => {
    if (Date.now() - heardAt > silenceMs) return endLease("the store went silent");
    void fetch(`${base}/v1/lease/renew?producer=${encodeURIComponent(producer)}`, { method: "POST", signal: AbortSignal.timeout(renewMs) })
      .then((r) => {
        void r.body?.cancel();
        if (r.status === 412) endLease("the store no longer holds it");
      })
      .catch(() => {}); // unreachable for now: the heartbeat watch decides
  }, renewMs);
  renewal.unref?.();
  void (async () => {
    try {
      for await (const _ of stream) heardAt = Date.now();
    } catch {
      // a reset connection ends the lease like a clean end does
    }
    endLease("the lease stream ended");
  })();

  return {
    producer,
    lease: lease.signal,

    async register(spec: RecordSpec, opts?: { signal?: AbortSignal }): Promise<Registration> {
      if (lease.signal.aborted) throw new Error(`lease of ${producer} has ended`);
      const r = await fetch(`${base}/v1/records`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ ...spec, producer }),
        signal: opts?.signal,
      });
      await check(r, `registering ${spec.kind} ${spec.name}`);
      return { kind: spec.kind, name: spec.name, producer };
    },

    async unregister(reg) {
      const r = await fetch(`${base}/v1/records/${encodeURIComponent(reg.kind)}/${encodeURIComponent(reg.name)}?producer=${encodeURIComponent(reg.producer)}`, {
        method: "DELETE",
      });
      return ((await (await check(r, `withdrawing ${reg.name}`)).json()) as { outcome: "removed" | "missing" }).outcome;
    },

    async list(q) {
      const r = await fetch(`${base}/v1/records?${queryString(q)}`);
      return (await (await check(r, `listing ${q.kind} records`)).json()) as DiscoveryRecord[];
    },

    listAndWatch(q, onSnapshot) {
      const stop = new AbortController();
      const first = Promise.withResolvers<void>();
      void (async () => {
        while (!stop.signal.aborted) {
          try {
            const r = await check(await fetch(`${base}/v1/watch?${queryString(q)}`, { signal: stop.signal }), `watching ${q.kind} records`);
            for await (const line of lines(r)) {
              onSnapshot((line as { records: DiscoveryRecord[] }).records);
              first.resolve();
            }
          } catch (err) {
            if (stop.signal.aborted) break;
            log.warn({ err: String(err), kind: q.kind }, "discovery watch failed, retrying");
          }
          await pause(retryMs, stop.signal);
        }
      })();
      const handle: WatchHandle = {
        ready: first.promise,
        close: () => {
          stop.abort();
          // Whoever waits for the first snapshot (a stop before it came) is not left hanging.
          first.resolve();
          watches.delete(handle);
        },
      };
      watches.add(handle);
      return handle;
    },

    async close() {
      for (const w of [...watches]) w.close();
      clearInterval(renewal);
      lease.abort(new Error(`discovery client ${producer} closed`));
      leaseStream.abort();
    },
  };
}
