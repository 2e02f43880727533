/**
 * `x-prefiller-host-port`: the prefill worker an EPP chose for a request (llm-d's routing header).
 * Absent or empty: the decode worker prefills locally. Several values (repeated headers, which the
 * server joins with commas, or one comma-separated value) name candidates: as llm-d's sidecar, the
 * first is taken, or with sampling one drawn uniformly (`--prefiller-sampling`, llm-d's
 * `--enable-prefiller-sampling`). Blank entries are no candidates here; llm-d's sampling can draw one,
 * and then prefills locally.
 */
import { PREFILLER_HOST_PORT_HEADER } from "@kv-epp/protocol";

export const PREFILLER_HEADER = PREFILLER_HOST_PORT_HEADER;

/** The header's candidates in order, trimmed; none when it is absent or blank. */
export function prefillerCandidates(value: string | null | undefined): string[] {
  if (!value) return [];
  return value.split(",").map((s) => s.trim()).filter((s) => s.length > 0);
}

/** The candidate the prefill leg goes to: the first, or with `sample` one drawn uniformly. `random` in [0, 1). */
export function pickPrefiller(candidates: readonly string[], sample: boolean, random: () => number = Math.random): string | null {
  if (candidates.length === 0) return null;
  return candidates[sample ? Math.min(candidates.length - 1, Math.floor(random() * candidates.length)) : 0]!;
}

/** `host:port` (an IPv6 host in brackets) with a port; anything else is not a target we call. */
export function isHostPort(target: string): boolean {
  const m = /^(\[[0-9a-fA-F:.]+\]|[^\s:/[\]@?#]+):(\d{1,5})$/.exec(target);
  return m !== null && Number(m[2]) > 0 && Number(m[2]) <= 65535;
}
