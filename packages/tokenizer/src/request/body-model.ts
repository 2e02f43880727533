// The forwarded body's `model` set to the name the gateway rewrote it to (x-gateway-model-name-rewrite), in
// the thread that read the body: the EPP scores the request for that model, so the body vLLM gets must name
// it too. The header's other half (the response mapped back to the client's name) is the EPP's.
import { JsonFieldScanner } from "@kv-epp/index-wasm/json";
import { BadRequest } from "./bad-request";
import { parseJson } from "./openai-body";

const encoder = new TextEncoder();
let scanner: JsonFieldScanner | undefined;
/**
 * Bodies past this are re-serialised instead of scanned: the scanner's linear memory keeps the size of
 * the largest body it read and never shrinks (openai-body.ts bounds its own scanner the same way).
 */
const SCAN_MAX_BYTES = 4 * 1024 * 1024;

/**
 * `body` (a whole JSON object, already parsed once) with its top-level `model` set to `model`, every
 * other byte kept: the value is spliced in where the scanner found it, or inserted first when the body
 * names none. A body the scanner leaves to JSON.parse (a key written with escapes, `model` given twice)
 * or one past SCAN_MAX_BYTES is re-serialised whole instead: the same document, not the same bytes.
 */
export function rewriteBodyModel(body: Uint8Array, model: string): Uint8Array {
  const value = encoder.encode(JSON.stringify(model));
  const fields = body.length > SCAN_MAX_BYTES ? null : (scanner ??= new JsonFieldScanner(["model"])).scan(body);
  if (!fields) return reserialised(body, model);
  const f = fields[0]!;
  if (f.kind !== "absent") return splice(body, f.start, f.end, value);
  const open = body.indexOf(0x7b); // the object's "{": only whitespace precedes it in valid JSON
  let next = open + 1;
  while (next < body.length && isSpace(body[next]!)) next++;
  const empty = body[next] === 0x7d;
  return splice(body, open + 1, open + 1, Buffer.concat([encoder.encode('"model":'), value, encoder.encode(empty ? "" : ",")]));
}

function reserialised(body: Uint8Array, model: string): Uint8Array {
  const doc = parseJson(body);
  if (typeof doc !== "object" || doc === null || Array.isArray(doc)) throw new BadRequest("request body must be a JSON object");
  (doc as Record<string, unknown>).model = model;
  return encoder.encode(JSON.stringify(doc));
}

function isSpace(c: number): boolean {
  return c === 0x20 || c === 0x09 || c === 0x0a || c === 0x0d;
}

/** A new buffer of its own (the pool transfers it between threads), never a view of a shared one. */
function splice(body: Uint8Array, start: number, end: number, value: Uint8Array): Uint8Array {
  const out = new Uint8Array(body.length - (end - start) + value.length);
  out.set(body.subarray(0, start), 0);
  out.set(value, start);
  out.set(body.subarray(end), start + value.length);
  return out;
}
