// Mooncake trace loading (format: data/README.md at the repository root).
// One JSON object a line: {"timestamp": ms, "input_length": n, "output_length": n, "hash_ids": [..]}.
import { resolve } from "node:path";

export type TraceRecord = {
  /** ms since the trace started */
  timestamp: number;
  inputLength: number;
  outputLength: number;
  /** one id per 512-token block of the prompt; equal ids at the same position = shared prefix */
  hashIds: number[];
};

/** Tokens per trace hash id (fixed by the Mooncake format). */
export const TRACE_BLOCK_TOKENS = 512;

/** The Mooncake conversation trace the repository carries (data/, Apache-2.0; see data/README.md). */
export const DEFAULT_TRACE_PATH = resolve(import.meta.dir, "../../../data/mooncake_conversation_trace.jsonl");

export class TraceFormatError extends Error {
  override name = "TraceFormatError";
}

function isCount(v: unknown): v is number {
  return typeof v === "number" && Number.isInteger(v) && v >= 0;
}

/** Parses one line; throws TraceFormatError naming the line when a field is missing or inconsistent. */
export function parseTraceLine(line: string, lineNo: number): TraceRecord {
  let o: Record<string, unknown>;
  try {
    o = JSON.parse(line) as Record<string, unknown>;
  } catch {
    throw new TraceFormatError(`trace line ${lineNo}: not JSON`);
  }
  const { timestamp, input_length, output_length, hash_ids } = o;
  if (typeof timestamp !== "number" || !Number.isFinite(timestamp) || timestamp < 0)
    throw new TraceFormatError(`trace line ${lineNo}: bad timestamp ${String(timestamp)}`);
  if (!isCount(input_length) || input_length === 0)
    throw new TraceFormatError(`trace line ${lineNo}: bad input_length ${String(input_length)}`);
  if (!isCount(output_length)) throw new TraceFormatError(`trace line ${lineNo}: bad output_length ${String(output_length)}`);
  if (!Array.isArray(hash_ids) || !hash_ids.every(isCount))
    throw new TraceFormatError(`trace line ${lineNo}: bad hash_ids`);
  if (hash_ids.length !== Math.ceil(input_length / TRACE_BLOCK_TOKENS))
    throw new TraceFormatError(
      `trace line ${lineNo}: ${hash_ids.length} hash_ids for input_length ${input_length} (want ceil(n/${TRACE_BLOCK_TOKENS}))`,
    );
  return { timestamp, inputLength: input_length, outputLength: output_length, hashIds: hash_ids as number[] };
}

/** Parses a whole trace (blank lines skipped), sorted by timestamp (stable), at most `limit` records. */
export function parseTrace(text: string, limit = Number.POSITIVE_INFINITY): TraceRecord[] {
  const out: TraceRecord[] = [];
  const lines = text.split("\n");
  for (let i = 0; i < lines.length && out.length < limit; i++) {
    const line = lines[i]!.trim();
    if (line) out.push(parseTraceLine(line, i + 1));
  }
  return out.sort((a, b) => a.timestamp - b.timestamp);
}

export async function loadTrace(path = DEFAULT_TRACE_PATH, limit?: number): Promise<TraceRecord[]> {
  return parseTrace(await Bun.file(path).text(), limit);
}

/**
 * Time compression: arrival time (ms, from 0) of a record when the trace is replayed `timeScale` times
 * faster than recorded. The first record arrives at 0.
 */
export function arrivalMs(rec: TraceRecord, first: TraceRecord, timeScale: number): number {
  return (rec.timestamp - first.timestamp) / timeScale;
}

/**
 * Arrival times (ms since the first record, time-compressed). The trace's timestamps are quantised
 * (to ~3 s, about 9 records each), so as recorded a whole group arrives at one instant; `spread` places
 * the records of a group evenly over the span until the next distinct timestamp instead.
 */
export function arrivalTimes(trace: readonly TraceRecord[], timeScale: number, how: "recorded" | "spread"): number[] {
  const first = trace[0];
  if (!first) return [];
  const at = trace.map((r) => arrivalMs(r, first, timeScale));
  if (how === "recorded") return at;
  for (let i = 0; i < at.length; ) {
    let j = i;
    while (j < at.length && at[j] === at[i]) j++;
    // The last group has no next timestamp to spread to: its records stay at one instant.
    const span = j < at.length ? at[j]! - at[i]! : 0;
    for (let k = i; k < j; k++) at[k] = at[i]! + ((k - i) * span) / (j - i);
    i = j;
  }
  return at;
}
