// x-gateway-model-name-rewrite (x-llm-d-model-name-rewrite): the gateway names the model a request
// runs as (GAIE's InferenceModel API evolution, proposal 1199, which moved the rewrite to this header;
// llm-d-router's Director.modelRewriteIfNeeded). The EPP scores the request for that model, so the
// body it forwards must name it too, or vLLM answers for the client's name: a 404 for an alias, or
// another adapter than the one scored. The response's `model` is mapped back to the client's name, as
// llm-d-router's rewriteModelName does on every response chunk (GAIE #1625: the internal name must not
// leak to the client).
// An InferenceModelRewrite rule for the body's model wins over the header, as in llm-d (workers/model-rewrites.ts).
// The body is rewritten where it is read (@kv-epp/tokenizer's rewriteBodyModel: in the tokenizer pool's
// member, or on the event loop without a pool); this module counts the outcome and maps the response.
const encoder = new TextEncoder();

/**
 * Maps the served name back to the client's in a response body, chunk by chunk: `"model":"<served>"`
 * (and `"model": "<served>"`), the two ways a JSON writer puts it (vLLM's pydantic writes the first),
 * become the client's name, as llm-d-router does. When a chunk ends with bytes that may begin such a
 * field, they are held back and go out with the next chunk, so a field split between two chunks is
 * mapped too; the last chunk (`end`) releases everything.
 */
export class ResponseModelName {
  private readonly from: Uint8Array[];
  private readonly to: Uint8Array[];
  private held: Uint8Array = EMPTY;

  constructor(served: string, client: string) {
    const field = (sep: string, name: string) => encoder.encode(`"model":${sep}${JSON.stringify(name)}`);
    this.from = [field("", served), field(" ", served)];
    this.to = [field("", client), field(" ", client)];
  }

  map(chunk: Uint8Array, end: boolean): Uint8Array {
    const text = this.held.length > 0 ? Buffer.concat([this.held, chunk]) : chunk;
    const { parts, rest } = this.replaced(text);
    // Only bytes after the last whole field may begin a split one.
    const keep = end ? 0 : this.openTail(rest);
    // Nothing mapped nor held back: the chunk itself, which the caller answers as unchanged.
    if (parts.length === 0 && keep === 0 && text === chunk) return chunk;
    this.held = keep > 0 ? rest.slice(rest.length - keep) : EMPTY;
    parts.push(rest.subarray(0, rest.length - keep));
    return parts.length === 1 ? parts[0]! : Buffer.concat(parts);
  }

  /** Bytes held back from the last chunk (to be sent before the response ends some other way). */
  release(): Uint8Array {
    const held = this.held;
    this.held = EMPTY;
    return held;
  }

  /** `text` up to the end of its last field to map, those fields mapped, and the bytes after. */
  private replaced(text: Uint8Array): { parts: Uint8Array[]; rest: Uint8Array } {
    const buf = Buffer.from(text.buffer, text.byteOffset, text.byteLength);
    const parts: Uint8Array[] = [];
    // Each field's next hit, searched again only once passed: a field the text lacks is searched once, not
    // to the end again after every hit of the other (quadratic on an SSE body of many events).
    const next = this.from.map((f) => buf.indexOf(f));
    let at = 0;
    for (;;) {
      let which = -1;
      for (let i = 0; i < next.length; i++) if (next[i]! >= 0 && (which < 0 || next[i]! < next[which]!)) which = i;
      if (which < 0) break;
      const hit = next[which]!;
      parts.push(text.subarray(at, hit), this.to[which]!);
      at = hit + this.from[which]!.length;
      for (let i = 0; i < next.length; i++) if (next[i]! >= 0 && next[i]! < at) next[i] = buf.indexOf(this.from[i]!, at);
    }
    return { parts, rest: text.subarray(at) };
  }

  /** The length of the longest end of `text` that is a proper beginning of a field to map. */
  private openTail(text: Uint8Array): number {
    const longest = Math.min(text.length, Math.max(...this.from.map((f) => f.length)) - 1);
    // Every field begins with a quote: other positions are passed over at one byte each.
    for (let k = longest; k > 0; k--) {
      if (text[text.length - k] !== 0x22) continue;
      const tail = text.subarray(text.length - k);
      if (this.from.some((f) => f.length > k && startsWith(f, tail))) return k;
    }
    return 0;
  }
}

const EMPTY = new Uint8Array(0);

function startsWith(whole: Uint8Array, part: Uint8Array): boolean {
  for (let i = 0; i < part.length; i++) if (whole[i] !== part[i]) return false;
  return true;
}

/**
 * What a rewrite did to a request, counted by the EPP (dynamo_epp_model_rewrites_total): the header's, or with
 * `rule_`, an InferenceModelRewrite rule's (`rule_no_targets`: refused, 400).
 */
export type RewriteOutcome = "rewritten" | "same_name" | "body_not_held" | "rule_rewritten" | "rule_same_name" | "rule_no_targets" | "rules_not_applied";

/** A request's rewrite (modelRewrite): nothing to do when empty. */
export type ModelRewrite = { outcome?: RewriteOutcome; body?: Uint8Array; response?: ResponseModelName };

/**
 * The request's rewrite: the body to forward and the response mapping back to the client's name.
 * `body` undefined: the body is not held before the route is sent (NONE, STREAMED, a BUFFERED_PARTIAL
 * body cut at Envoy's limit), so it goes upstream as the client wrote it; empty: there is none.
 * `rewritten`: the held body with `target` as its model, made where it was read (readBody's rewriteModel, or
 * its rewriteRules: `byRule`, the target a rule's, which only a held body is read with).
 */
export function modelRewrite(
  target: string | undefined,
  bodyModel: string | undefined,
  body: Uint8Array | undefined,
  rewritten: Uint8Array | undefined,
  byRule = false,
): ModelRewrite {
  if (target === undefined || body?.length === 0) return {};
  if (target === bodyModel) return { outcome: byRule ? "rule_same_name" : "same_name" };
  if (!body || !rewritten) return { outcome: "body_not_held" };
  return {
    outcome: byRule ? "rule_rewritten" : "rewritten",
    body: rewritten,
    ...(bodyModel !== undefined ? { response: new ResponseModelName(target, bodyModel) } : {}),
  };
}
