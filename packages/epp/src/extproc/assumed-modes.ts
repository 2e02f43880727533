// The body modes an ext_proc stream runs in. Envoy 1.34+ says them in the first message's protocol_config
// (never in observability mode); without one they come from --body-mode and --response-body-mode, which must
// name the filter's: the answers each mode takes differ (processor_state.cc), and what arrives before the headers'
// answer cannot tell them apart (full duplex alone sends a body before it, and only as the client sends one).
import type { BodyMode } from "../config.ts";
import type { BodySendMode, ProcessingRequest } from "./messages.ts";

export type StreamModes = { request: BodySendMode; response: BodySendMode };

const SEND_MODE: Record<Exclude<BodyMode, "auto">, BodySendMode> = {
  none: "NONE",
  streamed: "STREAMED",
  buffered: "BUFFERED",
  "buffered-partial": "BUFFERED_PARTIAL",
  "full-duplex": "FULL_DUPLEX_STREAMED",
};

/**
 * The stream's modes: protocol_config's when the first message carries one (a mode it leaves out is NONE,
 * proto3's zero value), else the flags'. `auto` for the request is full duplex: GAIE's endpoint picker serves
 * no other mode, so a data plane set up for one sends it; answering the headers at once instead would suit the
 * other modes but break that one (its body chunks need streamed_response answers, which the others refuse).
 * `auto` for the response follows the request: full duplex with it, else BUFFERED, whose CONTINUE answers NONE,
 * STREAMED and BUFFERED_PARTIAL take too.
 */
export function streamModes(pc: ProcessingRequest["protocol_config"], request: BodyMode, response: BodyMode): StreamModes {
  if (pc) return { request: pc.request_body_mode ?? "NONE", response: pc.response_body_mode ?? "NONE" };
  const req = request === "auto" ? "FULL_DUPLEX_STREAMED" : SEND_MODE[request];
  if (response !== "auto") return { request: req, response: SEND_MODE[response] };
  return { request: req, response: req === "FULL_DUPLEX_STREAMED" ? req : "BUFFERED" };
}
