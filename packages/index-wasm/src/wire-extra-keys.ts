// vLLM's extra_keys as they arrive on the wire (decoded msgpack: strings, [identifier, offset] pairs,
// bytes) turned into the ExtraKey values block identity folds in.
import type { BlockExtraKeys, ExtraKey } from "./extra-keys.ts";

/**
 * One block's wire entry as ExtraKeys: strings and bytes as they are, a `[string, int]` pair as a
 * multimodal key. Anything else (a shape a newer vLLM may add) becomes a string no request produces,
 * so the block still gets an identity of its own and never matches a request that lacks it.
 */
export function fromWireExtraKeys(entry: readonly unknown[] | null | undefined): BlockExtraKeys {
  if (!entry || entry.length === 0) return NONE;
  return entry.map(fromWireKey);
}

const NONE: BlockExtraKeys = [];

function fromWireKey(v: unknown): ExtraKey {
  if (typeof v === "string" || v instanceof Uint8Array) return v;
  if (Array.isArray(v) && v.length === 2 && typeof v[0] === "string") {
    const off = typeof v[1] === "bigint" ? Number(v[1]) : v[1];
    if (typeof off === "number" && Number.isSafeInteger(off)) return { mmId: v[0], offset: off };
  }
  return `\u0000unrecognised:${JSON.stringify(v, (_k, x) => (typeof x === "bigint" ? `${x}n` : x instanceof Uint8Array ? Array.from(x) : x))}`;
}
