// "tcp://host:port" endpoints as ZeroMQ spells them ("*" = all interfaces, "[::1]" = IPv6).

export type TcpEndpoint = { host: string; port: number };

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
  return host.includes(":") ? `tcp://[${host}]:${port}` : `tcp://${host}:${port}`;
}

/** The endpoint of data-parallel rank r: vLLM publishes rank r on the base port + r (docs/CONTRACTS.md §4). */
export function rankEndpoint(endpoint: string, rank: number): string {
  if (rank === 0) return endpoint;
  const m = /^(.*):(\d+)$/.exec(endpoint);
  if (!m) throw new Error(`endpoint ${JSON.stringify(endpoint)} has no port to offset`);
  return `${m[1]}:${Number(m[2]) + rank}`;
}
