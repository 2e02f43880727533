import type { Logger } from "pino";
import type { Body } from "./apis.ts";
import type { SidecarMetrics } from "./metrics.ts";

/**
 * `--kv-connector sglang`: SGLang's prefill/decode disaggregation, as llm-d's sidecar (connector_sglang.go) and
 * SGLang's own router (mini_lb.py) drive it. No leg waits for the other: the client's body, plus
 *
 * - `bootstrap_host`: the prefill worker's host (an IPv6 one in brackets, as SGLang's router writes it),
 * - `bootstrap_port`: its bootstrap server's port (`--sglang-bootstrap-port`, SGLang's
 *   `--disaggregation-bootstrap-port`, 8998 by default on both sides),
 * - `bootstrap_room`: a random integer in [0, 2^63), SGLang's `random.randint(0, 2**63 - 1)`,
 *
 * goes to the prefill worker and to the decode worker at once. The decode worker finds the prefill's KV by the
 * room through that bootstrap server and streams the answer; the prefill worker answers (one token) once its KV
 * was taken. The prefill leg is not cancelled when the client or the decode leg finishes first (llm-d detaches
 * it from the client's context), only bounded by `--prefill-timeout-ms`.
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

export type SglangLegs = {
  prefiller: string;
  /** the path and query the client sent, for both legs */
  target: string;
  client: Body;
  decoder: string;
  decodeHeaders: Headers;
  prefillHeaders: Headers;
  bootstrapPort: number;
  prefillTimeoutMs: number;
  signal: AbortSignal;
  metrics: SidecarMetrics;
  log: Logger;
};

/**
 * Sends both legs and resolves with the decode worker's answer (its body not yet read, so it streams); rejects
 * when the decode worker cannot be reached. The prefill leg runs on in the background: its failure is logged and
 * counted (`prefill_unreachable`, `prefill_timeout`, `prefill_status`), and shows to the client as the decode
 * worker's own error (SGLang fails a room it never receives with a 500 after its waiting timeout). A decode
 * answer that is not 2xx is counted as `decode_status`.
 */
export async function sglangLegs(p: SglangLegs): Promise<Response> {
  const room = bootstrapRoom();
  const body = sglangLegBody(p.client, bootstrapHost(p.prefiller), p.bootstrapPort, room);
  const log = p.log.child({ peer: p.prefiller, room: room.toString() });
  void prefillLeg(p, body, log);
  const res = await fetch(`${p.decoder}${p.target}`, { method: "POST", headers: p.decodeHeaders, body, signal: p.signal });
  if (!res.ok) {
    p.metrics.failed("decode_status");
    log.warn({ status: res.status }, "decode leg failed");
  }
  return res;
}

async function prefillLeg(p: SglangLegs, body: string, log: Logger): Promise<void> {
  const started = performance.now();
  const timeout = AbortSignal.timeout(p.prefillTimeoutMs);
  try {
    const res = await fetch(`http://${p.prefiller}${p.target}`, { method: "POST", headers: p.prefillHeaders, body, signal: timeout });
    // Read to its end (JSON, or a stream if the client asked for one): the answer itself is not needed.
    await res.arrayBuffer();
    if (!res.ok) {
      p.metrics.failed("prefill_status");
      log.warn({ status: res.status }, "prefill leg failed");
      return;
    }
    p.metrics.prefillSeconds((performance.now() - started) / 1000);
  } catch (err) {
    const timedOut = timeout.aborted;
    p.metrics.failed(timedOut ? "prefill_timeout" : "prefill_unreachable");
    log.warn({ err }, timedOut ? "prefill leg timed out" : "prefill worker unreachable");
  }
}
