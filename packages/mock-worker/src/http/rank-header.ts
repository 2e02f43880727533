// x-data-parallel-rank as the engine's API server reads and checks it.
// vLLM: reading (entrypoints/openai serving.py, _get_data_parallel_rank): Python's int() of the header; a value
// int() refuses is ignored, as if absent. Checking (v1/engine/input_processor.py): the rank must index the engines
// the server manages, 0 .. n - 1, where n is the whole DP size under internal load balancing and the node's local
// size under hybrid (--data-parallel-hybrid-lb) or external load balancing; out of range is a VLLMValidationError,
// an HTTP 400 "data_parallel_rank r is out of range [0, n).". (Releases that checked against the global size took a
// hybrid node's out-of-range rank to core_engines[r] and failed with an IndexError, a 500.)
// SGLang (entrypoints request_headers.py, extract_routed_dp_rank): the header when present, else the body's
// routed_dp_rank (or its deprecated data_parallel_rank); a header int() refuses is a 400 "Invalid
// X-Data-Parallel-Rank header: must be an integer, got '<value>'"; a rank past the DP size a 400
// "routed_dp_rank=r out of range [0, n)".

import type { EngineKind } from "../config.ts";

export const RANK_HEADER = "x-data-parallel-rank";

/**
 * How this API server numbers the ranks it serves (global ranks `first` .. `first + count - 1`):
 * `global`: by their global number (internal load balancing, one server for every rank; a worker
 * started at a later global rank stands for the head node's view of those ranks);
 * `local`: from 0 (hybrid or external load balancing, one server per node or per rank).
 */
export type RankNumbering = { first: number; count: number; numbering: "global" | "local" };

/** Python's int() of a str: optional sign, digits with single underscores between them, surrounding whitespace. */
const PY_INT = /^\s*([+-]?\d+(?:_\d+)*)\s*$/;

export type RequestedRank = { ok: true; rank: number | undefined } | { ok: false; message: string };

/**
 * The global rank a request names (undefined: none named), or the engine's refusal. vLLM reads the header alone;
 * SGLang the header, else the body's `routed_dp_rank`, else its deprecated `data_parallel_rank` (each validated as
 * pydantic's lax int validates it), and numbers the ranks it serves from 0.
 */
export function requestedRank(header: string | undefined, n: RankNumbering, engine: EngineKind = "vllm", body: BodyRanks = {}): RequestedRank {
  const named = header === undefined ? undefined : intOf(header, PY_INT);
  if (engine === "vllm") return named === undefined ? { ok: true, rank: undefined } : checked(named, n, n.numbering === "global" ? n.first : 0, vllmOutOfRange);
  if (header !== undefined && named === undefined) return { ok: false, message: `Invalid X-Data-Parallel-Rank header: must be an integer, got '${header}'` };
  const routed = laxInt("routed_dp_rank", body.routed_dp_rank);
  const deprecated = laxInt("data_parallel_rank", body.data_parallel_rank);
  for (const r of [routed, deprecated]) if (typeof r === "string") return { ok: false, message: r };
  const r = named ?? (routed as number | undefined) ?? (deprecated as number | undefined);
  return r === undefined ? { ok: true, rank: undefined } : checked(r, n, 0, sglangOutOfRange);
}

/** The integer `text` holds as `pattern` reads it (its first group: sign and digits, underscores between them). */
function intOf(text: string, pattern: RegExp): number | undefined {
  const m = pattern.exec(text);
  return m ? Number(m[1]!.replaceAll("_", "")) : undefined;
}

/** The body fields SGLang reads a rank from, as sent. */
export type BodyRanks = { routed_dp_rank?: unknown; data_parallel_rank?: unknown };

const vllmOutOfRange = (r: number, lo: number, hi: number) => `data_parallel_rank ${r} is out of range [${lo}, ${hi}).`;
const sglangOutOfRange = (r: number, lo: number, hi: number) => `routed_dp_rank=${r} out of range [${lo}, ${hi})`;

function checked(r: number, n: RankNumbering, lo: number, outOfRange: (r: number, lo: number, hi: number) => string): RequestedRank {
  if (r < lo || r >= lo + n.count) return { ok: false, message: outOfRange(r, lo, lo + n.count) };
  return { ok: true, rank: n.first + (r - lo) };
}

/**
 * A body field as pydantic's lax int takes it: absent or null, an integer (a float with no fraction too), a bool, or
 * an integer string (decimal zeros after a point allowed); else the refusal.
 */
function laxInt(field: string, v: unknown): number | undefined | string {
  if (v === undefined || v === null) return undefined;
  if (typeof v === "boolean") return v ? 1 : 0;
  if (typeof v === "number" && Number.isInteger(v)) return v;
  return (typeof v === "string" ? intOf(v, LAX_INT) : undefined) ?? `${field}: Input should be a valid integer`;
}

const LAX_INT = /^\s*([+-]?\d+(?:_\d+)*)(?:\.0*)?\s*$/;
