// The in-memory store served over HTTP, so separate processes (static mode, the demo) share one store
// without Kubernetes. A producer's lease is an open HTTP stream: when its process dies the connection
// closes and its records go, as a dead pod's owned Leases do. A process that is alive to TCP but no
// longer runs (frozen, partitioned behind a half-open connection) stops renewing: its lease ends after
// LEASE_TTL_MS too. Wire format: README.md "HTTP store".
import { hostPort } from "@kv-epp/protocol";
import { MemoryDiscoveryStore } from "./memory.ts";
import { RecordExistsError, type Discovery, type RecordKind, type RecordSpec } from "./types.ts";

export type DiscoveryServer = { readonly url: string; readonly store: MemoryDiscoveryStore; close(): Promise<void> };

const KINDS: readonly RecordKind[] = ["intent", "host"];
/** The server's heartbeat line on a lease stream; the client renews on the same period. */
export const HEARTBEAT_MS = 5_000;
/** A lease not renewed for this long ends (three missed renewals). */
export const LEASE_TTL_MS = 3 * HEARTBEAT_MS;
const enc = new TextEncoder();

const json = (body: unknown, status = 200) => Response.json(body, { status });
const problem = (status: number, message: string) => json({ error: message }, status);

function kindOf(v: string | null): RecordKind | undefined {
  return KINDS.find((k) => k === v);
}

/** An NDJSON stream that ends (and runs the returned stop) when the client goes away or `end` is called. */
function ndjson(req: Request, start: (send: (line: unknown) => void, end: () => void) => () => void): Response {
  let stop = () => {};
  const stream = new ReadableStream<Uint8Array>({
    start(c) {
      const send = (line: unknown) => {
        try {
          c.enqueue(enc.encode(`${JSON.stringify(line)}\n`));
        } catch {
          // the stream is already closed
        }
      };
      const end = () => {
        stop();
        try {
          c.close();
        } catch {
          // already closed
        }
      };
      stop = start(send, end);
      req.signal.addEventListener("abort", () => stop(), { once: true });
    },
    cancel: () => stop(),
  });
  return new Response(stream, { headers: { "content-type": "application/x-ndjson", "cache-control": "no-store" } });
}

export function serveDiscoveryStore(
  o: { hostname?: string; port?: number; store?: MemoryDiscoveryStore; heartbeatMs?: number; leaseTtlMs?: number } = {},
): DiscoveryServer {
  const store = o.store ?? new MemoryDiscoveryStore();
  const heartbeatMs = o.heartbeatMs ?? HEARTBEAT_MS;
  const leaseTtlMs = o.leaseTtlMs ?? LEASE_TTL_MS;
  const leases = new Map<string, Discovery>();
  /** Per producer: when it last renewed, and how to end its lease. */
  const liveness = new Map<string, { renewedAt: number; end: () => void }>();
  const sweep = setInterval(() => {
    const now = Date.now();
    for (const [, l] of liveness) if (now - l.renewedAt > leaseTtlMs) l.end();
  }, Math.min(1000, leaseTtlMs / 3));
  sweep.unref?.();

  async function handle(req: Request): Promise<Response> {
    const url = new URL(req.url);
    const q = url.searchParams;
    if (url.pathname === "/v1/lease" && req.method === "GET") {
      const producer = q.get("producer");
      if (!producer) return problem(400, "producer is required");
      if (leases.has(producer)) return problem(409, `producer ${producer} already holds a lease`);
      const d = store.connect({ producer });
      leases.set(producer, d);
      return ndjson(req, (send, end) => {
        send({ lease: producer });
        const beat = setInterval(() => send({}), heartbeatMs);
        liveness.set(producer, { renewedAt: Date.now(), end });
        let ended = false;
        return () => {
          if (ended) return;
          ended = true;
          clearInterval(beat);
          leases.delete(producer);
          liveness.delete(producer);
          void d.close();
        };
      });
    }
    if (url.pathname === "/v1/lease/renew" && req.method === "POST") {
      const l = liveness.get(q.get("producer") ?? "");
      if (!l) return problem(412, `producer ${q.get("producer")} holds no lease`);
      l.renewedAt = Date.now();
      return json({ renewed: true });
    }
    if (url.pathname === "/v1/watch" && req.method === "GET") {
      const kind = kindOf(q.get("kind"));
      if (!kind) return problem(400, "kind must be intent or host");
      return ndjson(req, (send) => {
        const w = store.watch("", { kind, host: q.get("host") ?? undefined }, (records) => send({ records }));
        return () => w.close();
      });
    }
    if (url.pathname === "/v1/records" && req.method === "GET") {
      const kind = kindOf(q.get("kind"));
      if (!kind) return problem(400, "kind must be intent or host");
      return json(store.snapshot(kind, q.get("host") ?? undefined));
    }
    if (url.pathname === "/v1/records" && req.method === "POST") {
      const body = (await req.json().catch(() => null)) as (RecordSpec & { producer?: string }) | null;
      const kind = kindOf(body?.kind ?? null);
      if (!body || !kind || typeof body.name !== "string" || !body.name) return problem(400, "expected {producer, kind, name, payload, shared?}");
      const d = leases.get(body.producer ?? "");
      if (!d) return problem(412, `producer ${body.producer} holds no lease`);
      try {
        const spec: RecordSpec = { kind, name: body.name, payload: body.payload, shared: body.shared === true };
        if (typeof body.host === "string") spec.host = body.host;
        if (typeof body.version === "number") spec.version = body.version;
        return json(await d.register(spec), 201);
      } catch (err) {
        if (err instanceof RecordExistsError) return problem(409, err.message);
        throw err;
      }
    }
    const m = /^\/v1\/records\/([^/]+)\/([^/]+)$/.exec(url.pathname);
    if (m && req.method === "DELETE") {
      const kind = kindOf(decodeURIComponent(m[1]!));
      if (!kind) return problem(400, "kind must be intent or host");
      const outcome = store.remove({ kind, name: decodeURIComponent(m[2]!), producer: q.get("producer") ?? "" });
      return json({ outcome });
    }
    return problem(404, "not found");
  }

  const server = Bun.serve({
    hostname: o.hostname ?? "127.0.0.1",
    port: o.port ?? 0,
    idleTimeout: 0, // lease and watch streams stay open
    fetch: (req) => handle(req).catch((err: unknown) => problem(500, String(err))),
  });
  return {
    url: `http://${hostPort(server.hostname!, server.port!)}`,
    store,
    close: async () => {
      clearInterval(sweep);
      await server.stop(true);
      for (const d of leases.values()) await d.close();
      leases.clear();
    },
  };
}
