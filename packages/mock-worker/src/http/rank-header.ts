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
 * The global rank a request names (undefined: none named), or the engine's refusal: vLLM reads the header alone;
 * SGLang the header, else `bodyRank` (the body's routed_dp_rank or data_parallel_rank, validated as an integer).
 */
export function requestedRank(header: string | undefined, n: RankNumbering, engine: "vllm" | "sglang" = "vllm", bodyRank?: number | null): RequestedRank {
  const m = header === undefined ? null : PY_INT.exec(header);
  if (engine === "sglang" && header !== undefined && !m) return { ok: false, message: `Invalid X-Data-Parallel-Rank header: must be an integer, got '${header}'` };
  const r = m ? Number(m[1]!.replaceAll("_", "")) : engine === "sglang" ? bodyRank ?? undefined : undefined;
  if (r === undefined) return { ok: true, rank: undefined };
  const lo = n.numbering === "global" ? n.first : 0;
  if (r < lo || r >= lo + n.count)
    return { ok: false, message: engine === "sglang" ? `routed_dp_rank=${r} out of range [${lo}, ${lo + n.count})` : `data_parallel_rank ${r} is out of range [${lo}, ${lo + n.count}).` };
  return { ok: true, rank: n.first + (r - lo) };
}
