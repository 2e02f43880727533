// @kv-epp/trace-replay: the Mooncake trace as requests, the routing-quality simulation behind
// `bun run bench:trace`, and the report writer the benchmark and `bun run demo` share.
export { loadTrace, parseTrace, arrivalMs, DEFAULT_TRACE_PATH, TRACE_BLOCK_TOKENS, TraceFormatError, type TraceRecord } from "./trace.ts";
export { blockTokens, recordTokens, SYNTH_VOCAB } from "./tokens.ts";
export { replayPolicy, type ReplayOptions, type RunResult } from "./sim/replay.ts";
export { POLICIES, POLICY_NAMES, type PolicyName, type PolicySpec } from "./policies/index.ts";
export { renderReport } from "./report/html.ts";
export { cdfPoints, type ReportData } from "./report/data.ts";
export { screenshot, findChromium, type PngOutcome } from "./report/png.ts";
export { requestBuilder, type PromptKind, type RequestBody } from "./demo/bodies.ts";
export { parseHistogram, parseValues, type Histogram } from "./demo/epp-metrics.ts";
