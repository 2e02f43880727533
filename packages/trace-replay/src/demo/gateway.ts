// The demo's gateway, in a process of its own (what Envoy with GAIE's ext_proc filter is in a cluster):
// it takes OpenAI requests over HTTP, asks an EPP replica through ext_proc which worker serves each,
// proxies the request there and streams the answer back untouched, then tells the EPP the response
// ended so it releases the request's load. Its own process, so the pick latency it measures is not
// held up by the load generator parsing every worker's stream. What it decided travels back to the
// load generator in response headers (GATEWAY_HEADERS).
import { ExtProcClient, RoutingError, type ClientBodyMode, type Routed } from "@kv-epp/epp";

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
  const clients = new Map<string, ExtProcClient>();
  const clientOf = (address: string) => {
    let c = clients.get(address);
    if (!c) clients.set(address, (c = new ExtProcClient(address, o.bodyMode)));
    return c;
  };
  let replicas = o.replicas;
  let turn = 0;

  /** Like a gateway with a retry policy: a replica that fails to answer is skipped for the next one. */
  async function route(path: string, body: Uint8Array, failures: string[]): Promise<{ r: Routed; epp: string } | undefined> {
    const current = replicas;
    const first = turn++;
    for (let i = 0; i < current.length; i++) {
      const replica = current[(first + i) % current.length]!;
      try {
        return { r: await clientOf(replica.address).route(path, body), epp: replica.name };
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
    const { r, epp } = routed;
    const headers = {
      ...failureHeader,
      [GATEWAY_HEADERS.epp]: epp,
      [GATEWAY_HEADERS.endpoint]: r.endpoint,
      [GATEWAY_HEADERS.pickMs]: r.pickMs.toFixed(3),
      [GATEWAY_HEADERS.writtenAt]: (performance.timeOrigin + r.writtenAt).toFixed(3),
    };
    // The replica that routed it may have been killed meanwhile: nothing to release there then.
    let finished = false;
    const finish = (status: number) => {
      if (finished) return;
      finished = true;
      void r.finish(status).catch(() => {});
    };
    let upstream: Response;
    try {
      upstream = await fetch(`http://${r.endpoint}${path}`, { method: "POST", headers: { "content-type": "application/json" }, body });
    } catch (e) {
      finish(502);
      return Response.json({ error: `worker ${r.endpoint}: ${e instanceof Error ? e.message : String(e)}` }, { status: 502, headers });
    }
    const reader = upstream.body?.getReader();
    if (!reader) {
      finish(upstream.status);
      return new Response(null, { status: upstream.status, headers });
    }
    const stream = new ReadableStream<Uint8Array>({
      async pull(controller) {
        try {
          const { done, value } = await reader.read();
          if (done) {
            controller.close();
            finish(upstream.status);
          } else controller.enqueue(value);
        } catch (e) {
          controller.error(e);
          finish(502);
        }
      },
      cancel(reason) {
        finish(499);
        return reader.cancel(reason);
      },
    });
    return new Response(stream, {
      status: upstream.status,
      headers: { ...headers, "content-type": upstream.headers.get("content-type") ?? "text/event-stream" },
    });
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
