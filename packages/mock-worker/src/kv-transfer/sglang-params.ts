/**
 * SGLang's disaggregation fields as its OpenAI and native request models read them (`bootstrap_host`,
 * `bootstrap_port`, `bootstrap_room` on `CompletionRequest`, `ChatCompletionRequest`, `GenerateReqInput`):
 * a router (SGLang's mini load balancer, llm-d's sidecar with `--kv-connector sglang`) sends one body to
 * a prefill server and a decode server at once, naming the prefill server's bootstrap address and a
 * room, a random integer in [0, 2^63) that pairs the two halves of the request.
 *
 * The room is a Python int on SGLang's side, so every digit counts: it is read from the body's source
 * text (JSON.parse's source access), never through a double, and kept as a bigint. Python's pydantic
 * (lax mode) also takes an integer-valued float or string; the mock takes an integer only. Lists (one
 * room per prompt of a batch) are SGLang's too; the mock transfers a single prompt and refuses them.
 */

export type Bootstrap = { host: string; port: number; room: bigint };

/** What the body asks of a disaggregated SGLang server; `none`: no room (SGLang answers 400 in a P/D mode). */
export type BootstrapRequest = { kind: "none" } | { kind: "room"; bootstrap: Bootstrap } | { kind: "invalid"; why: string; param: string };

/** SGLang's answer to a request without a room on a prefill or decode server. */
export const NO_ROOM_MESSAGE = "Disaggregated request received without bootstrap room id";

/** Rooms are below this: SGLang keeps a room as a signed 64-bit integer (its metadata buffers, its KV managers' tables). */
export const ROOM_LIMIT = 2n ** 63n;

/**
 * The three fields of a body given as JSON text. `ownBootstrapPort`: the receiving server's own
 * `--disaggregation-bootstrap-port`, which SGLang's scheduler puts in place of a null or missing `bootstrap_port`.
 */
export function readBootstrap(text: string, ownBootstrapPort: number): BootstrapRequest {
  let body: unknown;
  try {
    // The reviver sees the room's source digits before they are rounded to a double (only the top-level field is read).
    body = JSON.parse(text, (key: string, value: unknown, context?: { source?: string }) =>
      key === "bootstrap_room" && typeof value === "number" && context?.source !== undefined ? { source: context.source } : value);
  } catch {
    return { kind: "none" };
  }
  if (body === null || typeof body !== "object" || Array.isArray(body)) return { kind: "none" };
  const o = body as Record<string, unknown>;
  const room = o.bootstrap_room;
  if (room === undefined || room === null) return { kind: "none" };
  if (Array.isArray(room)) return { kind: "invalid", why: "one bootstrap_room per prompt of a batch is not modelled", param: "bootstrap_room" };
  const source = typeof room === "object" && room !== null && "source" in room ? String((room as { source: unknown }).source) : undefined;
  if (source === undefined || !/^\d+$/.test(source)) return { kind: "invalid", why: "bootstrap_room must be a non-negative integer", param: "bootstrap_room" };
  if (BigInt(source) >= ROOM_LIMIT) return { kind: "invalid", why: "bootstrap_room must be below 2^63 (a signed 64-bit integer)", param: "bootstrap_room" };
  const host = o.bootstrap_host;
  if (typeof host !== "string" || host.length === 0) return { kind: "invalid", why: "bootstrap_host must be a host name or address", param: "bootstrap_host" };
  const port = o.bootstrap_port;
  // SGLang's request models allow a null port: its scheduler then takes the server's own bootstrap port.
  if (port !== undefined && port !== null && !(typeof port === "number" && Number.isInteger(port) && port > 0 && port <= 65535))
    return { kind: "invalid", why: "bootstrap_port must be a port number", param: "bootstrap_port" };
  return { kind: "room", bootstrap: { host, port: typeof port === "number" ? port : ownBootstrapPort, room: BigInt(source) } };
}
