// Addresses as the protocols spell them: ZeroMQ's "tcp://host:port" ("*" = every interface or, as the
// port, an ephemeral one; "[::1]" = IPv6) and "host:port" with an IPv6 host in brackets (RFC 3986).

export type TcpEndpoint = { host: string; port: number };

/** An IPv6 literal in brackets, as a URL or host:port needs it; other hosts (and bracketed ones) as they are. */
export function bracketHost(host: string): string {
  return host.includes(":") && !host.startsWith("[") ? `[${host}]` : host;
}

/** `host:port`, an IPv6 host in brackets. */
export function hostPort(host: string, port: number): string {
  return `${bracketHost(host)}:${port}`;
}

/** Parses `tcp://host:port` (host `*`: 0.0.0.0; port `*`: 0, ephemeral; brackets dropped from IPv6). */
export function parseEndpoint(endpoint: string): TcpEndpoint {
  const m = /^tcp:\/\/(\[[^\]]+\]|[^:/]+):(\d+|\*)$/.exec(endpoint);
  if (!m) throw new Error(`unsupported endpoint ${JSON.stringify(endpoint)} (expected tcp://host:port)`);
  let host = m[1]!;
  if (host.startsWith("[")) host = host.slice(1, -1);
  if (host === "*") host = "0.0.0.0";
  const port = m[2] === "*" ? 0 : Number(m[2]);
  if (port > 65535) throw new Error(`port out of range in ${JSON.stringify(endpoint)}`);
  return { host, port };
}

export function formatEndpoint(host: string, port: number): string {
  return `tcp://${hostPort(host, port)}`;
}

/**
 * The endpoint of data-parallel rank r: vLLM publishes rank r on the base port + r (docs/CONTRACTS.md §4).
 * An ephemeral port (0 or `*`) stays as it is: every rank binds its own. No port: an error, since every
 * rank would otherwise share one endpoint.
 */
export function rankEndpoint(endpoint: string, rank: number): string {
  if (rank === 0) return endpoint;
  const m = /^(.*):(\d+|\*)$/.exec(endpoint);
  if (!m) throw new Error(`endpoint ${JSON.stringify(endpoint)} has no port to offset`);
  if (m[2] === "*" || m[2] === "0") return endpoint;
  return `${m[1]}:${Number(m[2]) + rank}`;
}

/**
 * The engines' publisher rule (ZmqEventPublisher): a KV-event endpoint with a wildcard (`*`, `::`, and for SGLang
 * `0.0.0.0`, which its /server_info advertises as one) or an ipc/inproc one is bound by the engine; any other is
 * one the engine's PUB connects to, so the subscriber must bind it. vLLM would connect to a `0.0.0.0`, its own
 * host, where no subscriber elsewhere can be: read as a bind for both.
 */
export function publisherBinds(endpoint: string): boolean {
  return endpoint.includes("*") || endpoint.includes("::") || endpoint.includes("0.0.0.0") || endpoint.startsWith("ipc://") || endpoint.startsWith("inproc://");
}

/** "10.0.0.1:8000" -> "10.0.0.1", "[fd00::1]:8000" and "[fd00::1]" -> "fd00::1"; a bare host stays as it is. */
export function endpointHost(endpoint: string): string {
  if (endpoint.startsWith("[") && endpoint.endsWith("]")) return endpoint.slice(1, -1);
  const colon = endpoint.lastIndexOf(":");
  const host = colon >= 0 && (endpoint.startsWith("[") || endpoint.indexOf(":") === colon) ? endpoint.slice(0, colon) : endpoint;
  return host.startsWith("[") && host.endsWith("]") ? host.slice(1, -1) : host;
}
