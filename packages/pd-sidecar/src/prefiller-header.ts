/**
 * `x-prefiller-host-port`: the prefill worker an EPP chose for a request (llm-d's routing header).
 * Absent or empty: the decode worker prefills locally. Several values (repeated headers, or one
 * comma-separated value) name candidates; llm-d's sidecar takes the first unless told to sample.
 */
import { PREFILLER_HOST_PORT_HEADER } from "@kv-epp/protocol";

export const PREFILLER_HEADER = PREFILLER_HOST_PORT_HEADER;

export function chosenPrefiller(value: string | null | undefined): string | null {
  if (!value) return null;
  const first = value.split(",")[0]!.trim();
  return first.length > 0 ? first : null;
}

/** `host:port` (an IPv6 host in brackets) with a port; anything else is not a target we call. */
export function isHostPort(target: string): boolean {
  const m = /^(\[[0-9a-fA-F:.]+\]|[^\s:/[\]@?#]+):(\d{1,5})$/.exec(target);
  return m !== null && Number(m[2]) > 0 && Number(m[2]) <= 65535;
}
