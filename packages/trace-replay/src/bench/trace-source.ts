// The benchmark's trace: a Mooncake-format file, or `synthetic` for the generated trace of another shape.
import { loadTrace, type TraceRecord } from "../trace.ts";
import { SYNTHETIC_TRACE, syntheticTrace } from "./synthetic.ts";

/** `limit` requests (the synthetic trace: 4000 when unset). */
export async function loadBenchTrace(path: string, limit: number | undefined): Promise<TraceRecord[]> {
  return path === SYNTHETIC_TRACE ? syntheticTrace(limit ?? 4000) : loadTrace(path, limit);
}
