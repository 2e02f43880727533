// The replica-agg wire format (README.md in this folder): plain types plus a msgpack codec. Each
// message is two ZMTP frames, [AGG_TOPIC, payload]; the payload is a msgpack array led by a version.
import { unpackUntrusted } from "@kv-epp/kv-events";
import { Packr, Unpackr } from "msgpackr";
import type { LoadChange, LoadEntry } from "../load.ts";
import type { PrefixKeys } from "../pending.ts";
import { parseWorkerKey, workerKeyOf } from "@kv-epp/protocol";

export const AGG_TOPIC = "kv-epp.agg";
export const AGG_VERSION = 1;

/** One request in a peer's active set; `workerKey` as the index spells it (workerId \0 dpRank). */
export type AggEntry = { id: number; workerKey: string; blocks: number; prefillBlocks: number };

/**
 * Most prefix keys an `added` op carries: 4 KiB a request at most. The default score shape caps the
 * prefix at 256 blocks (`--prefix-cap-blocks`), so past 512 a peer's pending overlap changes no default
 * score; the blocks shape and the latency cost count the whole overlap, and see a peer's request as at
 * most 512 blocks pending.
 */
export const AGG_PREFIX_MAX_KEYS = 512;

export type AggOp =
  /** `prefix`: the request's leading prefix keys (pending.ts), when the sender keeps in-flight prefixes. */
  | { op: "added"; entry: AggEntry; prefix?: PrefixKeys }
  | { op: "prefilled"; id: number }
  | { op: "freed"; id: number };

export type AggMessage =
  /** Changes since the previous message, in order. */
  | { kind: "delta"; replica: string; seq: number; ops: AggOp[] }
  /** The sender's whole active set; also its heartbeat. */
  | { kind: "snapshot"; replica: string; seq: number; entries: AggEntry[] };

export class AggDecodeError extends Error {}

const KIND = { delta: 1, snapshot: 2 } as const;
const OP = { added: 1, prefilled: 2, freed: 3 } as const;

// Plain msgpack (no records extension), so any msgpack library can read or write these messages.
const packr = new Packr({ useRecords: false });
const unpackr = new Unpackr({ useRecords: false, mapsAsObjects: false, int64AsType: "number" });

export function opOf(c: LoadChange): AggOp {
  switch (c.kind) {
    case "added":
      return c.prefix && c.prefix.length > 0
        ? { op: "added", entry: entryOf(c.id, c.entry), prefix: c.prefix.length > AGG_PREFIX_MAX_KEYS ? c.prefix.subarray(0, AGG_PREFIX_MAX_KEYS) : c.prefix }
        : { op: "added", entry: entryOf(c.id, c.entry) };
    case "prefilled":
      return { op: "prefilled", id: c.id };
    case "freed":
      return { op: "freed", id: c.id };
  }
}

export function entryOf(id: number, e: Readonly<LoadEntry>): AggEntry {
  return { id, workerKey: e.workerKey, blocks: e.blocks, prefillBlocks: e.prefillBlocks };
}

export function encodeAggMessage(m: AggMessage): Uint8Array {
  const body =
    m.kind === "delta"
      ? m.ops.map((o) => (o.op === "added" ? [OP.added, o.entry.id, ...entryTail(o.entry), ...(o.prefix ? [prefixBytes(o.prefix)] : [])] : [OP[o.op], o.id]))
      : m.entries.map((e) => [e.id, ...entryTail(e)]);
  return packr.pack([AGG_VERSION, m.replica, m.seq, KIND[m.kind], body]);
}

/** Prefix keys on the wire: msgpack bin, each key an IEEE-754 float64, little-endian (an integer < 2^53). */
function prefixBytes(keys: PrefixKeys): Uint8Array {
  const out = new Uint8Array(keys.length * 8);
  const view = new DataView(out.buffer);
  for (let i = 0; i < keys.length; i++) view.setFloat64(i * 8, keys[i]!, true);
  return out;
}

/**
 * A prefix bin: a whole number of 8-byte keys, each a non-negative integer below 2^53 (else the message
 * is malformed). Keys past AGG_PREFIX_MAX_KEYS are left out, so a later sender with a higher cap still
 * interoperates; an empty bin is no prefix.
 */
function decodePrefix(v: unknown): PrefixKeys | undefined {
  if (!(v instanceof Uint8Array) || v.length % 8 !== 0) throw new AggDecodeError("prefix: expected a bin of 8-byte keys");
  if (v.length === 0) return undefined;
  const view = new DataView(v.buffer, v.byteOffset, v.length);
  const keys = new Float64Array(Math.min(v.length / 8, AGG_PREFIX_MAX_KEYS));
  for (let i = 0; i < keys.length; i++) {
    const k = view.getFloat64(i * 8, true);
    if (!Number.isSafeInteger(k) || k < 0) throw new AggDecodeError("prefix: a key is not a non-negative integer below 2^53");
    keys[i] = k;
  }
  return keys;
}

function entryTail(e: AggEntry): [string, number, number, number] {
  const w = parseWorkerKey(e.workerKey);
  return [w.workerId, w.dpRank, e.blocks, e.prefillBlocks];
}

/** Strict: anything but a well-formed version-1 message throws AggDecodeError. Extra trailing fields are ignored. */
export function decodeAggMessage(payload: Uint8Array): AggMessage {
  let root: unknown;
  try {
    root = unpackUntrusted(unpackr, payload);
  } catch (err) {
    throw new AggDecodeError(`not msgpack: ${(err as Error).message}`);
  }
  const top = array(root, "message", 5);
  if (top[0] !== AGG_VERSION) throw new AggDecodeError(`unsupported version ${JSON.stringify(top[0])}`);
  const replica = top[1];
  if (typeof replica !== "string" || replica.length === 0 || replica.length > 64) throw new AggDecodeError("bad replica id");
  const seq = count(top[2], "seq");
  const body = array(top[4], "body", 0);
  switch (top[3]) {
    case KIND.delta:
      return { kind: "delta", replica, seq, ops: body.map(decodeOp) };
    case KIND.snapshot:
      return { kind: "snapshot", replica, seq, entries: body.map((e) => decodeEntry(array(e, "entry", 5), 0)) };
    default:
      throw new AggDecodeError(`unknown message kind ${JSON.stringify(top[3])}`);
  }
}

function decodeOp(raw: unknown): AggOp {
  const a = array(raw, "op", 2);
  switch (a[0]) {
    case OP.added: {
      const entry = decodeEntry(array(raw, "added op", 6), 1);
      // a 7th element is the prefix (a sender without in-flight prefixes, or an older one, sends none)
      const prefix = a.length > 6 && a[6] !== null ? decodePrefix(a[6]) : undefined;
      return prefix ? { op: "added", entry, prefix } : { op: "added", entry };
    }
    case OP.prefilled:
      return { op: "prefilled", id: count(a[1], "id") };
    case OP.freed:
      return { op: "freed", id: count(a[1], "id") };
    default:
      throw new AggDecodeError(`unknown op ${JSON.stringify(a[0])}`);
  }
}

function decodeEntry(a: unknown[], at: number): AggEntry {
  const workerId = a[at + 1];
  if (typeof workerId !== "string" || workerId.length === 0) throw new AggDecodeError("bad worker id");
  const blocks = count(a[at + 3], "blocks");
  const prefillBlocks = count(a[at + 4], "prefill blocks");
  if (prefillBlocks > blocks) throw new AggDecodeError("prefill blocks above request blocks");
  return { id: count(a[at], "id"), workerKey: workerKeyOf(workerId, count(a[at + 2], "rank")), blocks, prefillBlocks };
}

function array(v: unknown, what: string, minLength: number): unknown[] {
  if (!Array.isArray(v) || v.length < minLength) throw new AggDecodeError(`${what}: expected an array of at least ${minLength}`);
  return v;
}

function count(v: unknown, what: string): number {
  if (typeof v !== "number" || !Number.isSafeInteger(v) || v < 0) throw new AggDecodeError(`${what}: expected a non-negative integer`);
  return v;
}
