// The forwarded body's `model` set to the name the gateway rewrote it to (x-gateway-model-name-rewrite), in
// the thread that read the body: the EPP scores the request for that model, so the body vLLM gets must name
// it too. The header's other half (the response mapped back to the client's name) is the EPP's.
import { BadRequest } from "./bad-request";
import { modelMembers, type Span } from "./model-members";
import { skipSpace } from "./openai-body";

const encoder = new TextEncoder();

/**
 * `body` (a whole JSON object) with its top-level `model` set to `model`, every other byte kept: the value is
 * spliced in where each top-level `model` member has one (a key written with escapes too, and every one of a key
 * given twice, so that Python's json, where the last wins, reads the new name whichever it takes), or inserted
 * first when the body names none. Never re-serialised: a number's digits (`1.0`, an int64 bound) reach the
 * model server as the client wrote them. Linear in the body and bounded in memory whatever its size
 * (modelMembers; `found`: its result, when the caller walked the body already).
 */
export function rewriteBodyModel(body: Uint8Array, model: string, found = modelMembers(body)): Uint8Array {
  if (!found) throw new BadRequest("request body must be a JSON object");
  const value = encoder.encode(JSON.stringify(model));
  if (found.values.length > 0) return spliced(body, found.values, value);
  const empty = body[skipSpace(body, found.open + 1)] === 0x7d;
  const member = Buffer.concat([encoder.encode('"model":'), value, encoder.encode(empty ? "" : ",")]);
  return spliced(body, [{ start: found.open + 1, end: found.open + 1 }], member);
}

/** A new buffer of its own (the pool transfers it between threads), never a view of a shared one. */
function spliced(body: Uint8Array, spans: readonly Span[], value: Uint8Array): Uint8Array {
  const removed = spans.reduce((n, s) => n + s.end - s.start, 0);
  const out = new Uint8Array(body.length - removed + spans.length * value.length);
  let from = 0;
  let to = 0;
  for (const s of spans) {
    out.set(body.subarray(from, s.start), to);
    to += s.start - from;
    out.set(value, to);
    to += value.length;
    from = s.end;
  }
  out.set(body.subarray(from), to);
  return out;
}
