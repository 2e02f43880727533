import type { Body } from "./apis.ts";
import { concurrentLegs, type ConcurrentLegs } from "./concurrent-legs.ts";

/**
 * `--kv-connector sglang`: SGLang's prefill/decode disaggregation, as llm-d's sidecar (connector_sglang.go) and
 * SGLang's own router (mini_lb.py) drive it. No leg waits for the other: the client's body, plus
 *
 * - `bootstrap_host`: the prefill worker's host (an IPv6 one in brackets, as SGLang's router writes it; llm-d's
 *   sidecar strips them),
 * - `bootstrap_port`: its bootstrap server's port (`--sglang-bootstrap-port`, SGLang's
 *   `--disaggregation-bootstrap-port`, 8998 by default on both sides),
 * - `bootstrap_room`: a random integer in [0, 2^63), SGLang's `random.randint(0, 2**63 - 1)`,
 *
 * goes to the prefill worker and to the decode worker at once (concurrent-legs.ts). The decode worker finds the
 * prefill's KV by the room through that bootstrap server and streams the answer; the prefill worker answers (one
 * token) once its KV was taken. A prefill leg that fails before the decode worker answers cuts the decode leg and
 * fails the request with a 502 (SGLang would fail a room it never receives with a 500 only after
 * SGLANG_DISAGGREGATION_WAITING_TIMEOUT, 300 s); a failed decode leg cancels the prefill leg.
 *
 * The room is a Python int on SGLang's side (pydantic, exact at any size) but most rooms exceed 2^53, past which a
 * double rounds: it is a bigint here and written into the JSON text as its digits, so both legs carry the same
 * exact integer.
 */

/** A room as SGLang's router draws one: uniform in [0, 2^63). */
export function bootstrapRoom(): bigint {
  return crypto.getRandomValues(new BigUint64Array(1))[0]! >> 1n;
}

/** The host of `host:port` (an IPv6 host keeps its brackets). */
export function bootstrapHost(prefiller: string): string {
  return prefiller.slice(0, prefiller.lastIndexOf(":"));
}

/** The JSON text both legs carry: the client's body with the three bootstrap fields (a client's own replaced). */
export function sglangLegBody(client: Body, host: string, port: number, room: bigint): string {
  const { bootstrap_host: _h, bootstrap_port: _p, bootstrap_room: _r, ...rest } = client;
  const text = JSON.stringify({ ...rest, bootstrap_host: host, bootstrap_port: port });
  // JSON.stringify cannot write a bigint: the room's digits go in as they are, before the closing brace.
  return `${text.slice(0, -1)},"bootstrap_room":${room.toString()}}`;
}

export type SglangLegs = Omit<ConcurrentLegs, "prefillUrl" | "decodeUrl" | "prefillBody" | "decodeBody" | "onFailure"> & {
  prefiller: string;
  /** the path and query the client sent, for both legs */
  target: string;
  client: Body;
  decoder: string;
  bootstrapPort: number;
};

/** Both legs at once with one body (concurrent-legs.ts): the decode worker's answer, to stream. */
export function sglangLegs(p: SglangLegs): Promise<Response> {
  const room = bootstrapRoom();
  const body = sglangLegBody(p.client, bootstrapHost(p.prefiller), p.bootstrapPort, room);
  return concurrentLegs({
    ...p, prefillUrl: `http://${p.prefiller}${p.target}`, decodeUrl: `${p.decoder}${p.target}`, prefillBody: body, decodeBody: body,
    log: p.log.child({ peer: p.prefiller, room: room.toString() }),
  });
}
