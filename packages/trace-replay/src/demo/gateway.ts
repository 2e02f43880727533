// The demo's gateway, in a process of its own (what Envoy with GAIE's ext_proc filter is in a cluster):
// it takes OpenAI requests over HTTP, asks an EPP replica through ext_proc which worker serves each,
// proxies the request there and passes the response through the same ext_proc stream, as Envoy does
// with GAIE's processing mode (ext-proc-exchange.ts): the EPP reads the cached tokens and the first
// token off it and releases the request's load when it ends. Its own process, so the pick latency it
// measures is not held up by the load generator parsing every worker's stream. What it decided
// travels back to the load generator in response headers (GATEWAY_HEADERS).
import { RoutingError, type ClientBodyMode } from "@kv-epp/epp";
import { ExtProcGateway, type Exchange } from "./ext-proc-exchange.ts";

export type GatewayReplica = { name: string; address: string };

export const GATEWAY_HEADERS = {
  /** the replica that routed the request */
  epp: "x-demo-epp",
  /** ip:port of the chosen worker */
  endpoint: "x-demo-endpoint",
  /** ext_proc request headers written to the HTTP/2 stream -> routing answer, ms, in the gateway */
  pickMs: "x-demo-pick-ms",
  /** when the ext_proc request headers were written, ms since the epoch (performance.timeOrigin-based) */
  writtenAt: "x-demo-written-at",
  /** routing attempts that failed before (or instead of) the one that routed, URI-encoded JSON strings */
  failures: "x-demo-routing-failures",
} as const;

export type GatewayOptions = {
  listen: string;
  port: number;
  bodyMode: ClientBodyMode;
  replicas: GatewayReplica[];
};

export type Gateway = { url: string; stop(): Promise<void> };

export function startGateway(o: GatewayOptions): Gateway {
  const clients = new Map<string, ExtProcGateway>();
  const clientOf = (address: string) => {
    let c = clients.get(address);
    if (!c) clients.set(address, (c = new ExtProcGateway(address, o.bodyMode)));
    return c;
  };
  let replicas = o.replicas;
  let turn = 0;

  /** Like a gateway with a retry policy: a replica that fails to answer is skipped for the next one. */
  async function route(path: string, body: Uint8Array, failures: string[]): Promise<{ x: Exchange; epp: string } | undefined> {
    const current = replicas;
    const first = turn++;
    for (let i = 0; i < current.length; i++) {
      const replica = current[(first + i) % current.length]!;
      try {
        return { x: await clientOf(replica.address).route(path, body), epp: replica.name };
      } catch (e) {
        if (!(e instanceof RoutingError)) throw e;
        failures.push(`${replica.name}: ${e.message}`);
      }
    }
    return undefined;
  }

  async function proxy(req: Request, path: string): Promise<Response> {
    const body = new Uint8Array(await req.arrayBuffer());
    const failures: string[] = [];
    const routed = await route(path, body, failures);
    const failureHeader = { [GATEWAY_HEADERS.failures]: encodeURIComponent(JSON.stringify(failures)) };
    if (!routed) return Response.json({ error: "no EPP replica routed the request", failures }, { status: 503, headers: failureHeader });
    const { x, epp } = routed;
    const headers = {
      ...failureHeader,
      [GATEWAY_HEADERS.epp]: epp,
      [GATEWAY_HEADERS.endpoint]: x.endpoint,
      [GATEWAY_HEADERS.pickMs]: x.pickMs.toFixed(3),
      [GATEWAY_HEADERS.writtenAt]: (performance.timeOrigin + x.writtenAt).toFixed(3),
    };
    let upstream: Response;
    try {
      upstream = await fetch(`http://${x.endpoint}${path}`, { method: "POST", headers: { "content-type": "application/json", ...x.headers }, body: x.body, signal: req.signal });
    } catch (e) {
      if (req.signal.aborted) {
        x.cancel();
        return new Response(null, { status: 499 });
      }
      // Envoy's own reply for an unreachable upstream passes through the filter like any response.
      upstream = Response.json({ error: `worker ${x.endpoint}: ${e instanceof Error ? e.message : String(e)}` }, { status: 502 });
    }
    try {
      return await x.respond(upstream, headers);
    } catch (e) {
      // The ext_proc stream broke before the response headers were answered (failure_mode_allow false).
      void upstream.body?.cancel().catch(() => {});
      return Response.json({ error: `${epp}: ${e instanceof Error ? e.message : String(e)}` }, { status: 500, headers });
    }
  }

  const server = Bun.serve({
    hostname: o.listen,
    port: o.port,
    idleTimeout: 0,
    async fetch(req) {
      const path = new URL(req.url).pathname;
      if (req.method === "GET" && path === "/health") return new Response("ok");
      if (req.method === "PUT" && path === "/replicas") {
        const next = (await req.json()) as GatewayReplica[];
        if (!Array.isArray(next) || !next.every((r) => typeof r?.name === "string" && typeof r?.address === "string"))
          return Response.json({ error: "expected [{name, address}]" }, { status: 400 });
        replicas = next;
        return Response.json(replicas);
      }
      if (req.method === "POST" && path.startsWith("/v1/")) return proxy(req, path);
      return Response.json({ error: `no route for ${req.method} ${path}` }, { status: 404 });
    },
  });
  return {
    url: `http://${o.listen}:${server.port}`,
    async stop() {
      await server.stop(true);
      for (const c of clients.values()) c.close();
    },
  };
}

/** `name=ip:port,...` (the gateway's --replicas flag) and back. */
export function formatReplicas(replicas: readonly GatewayReplica[]): string {
  return replicas.map((r) => `${r.name}=${r.address}`).join(",");
}

export function parseReplicas(text: string): GatewayReplica[] {
  return text
    .split(",")
    .filter(Boolean)
    .map((part) => {
      const eq = part.indexOf("=");
      if (eq <= 0 || eq === part.length - 1) throw new Error(`expected name=ip:port, got ${JSON.stringify(part)}`);
      return { name: part.slice(0, eq), address: part.slice(eq + 1) };
    });
}
