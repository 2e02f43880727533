// Worker thread: replays one (trace, policy) at a time for the parallel runner.
import { replayPolicy, type ReplayOptions } from "../sim/replay.ts";
import type { PolicyName } from "../policies/index.ts";
import type { TraceRecord } from "../trace.ts";
import { loadBenchTrace } from "./trace-source.ts";

declare const self: Worker;

export type RunTask = { tracePath: string; limit: number | undefined; policy: PolicyName; opts: ReplayOptions };

let cached: { key: string; trace: TraceRecord[] } | undefined;

self.onmessage = async (e: MessageEvent<RunTask>) => {
  const { tracePath, limit, policy, opts } = e.data;
  try {
    const key = `${tracePath}\u0000${limit}`;
    if (cached?.key !== key) cached = { key, trace: await loadBenchTrace(tracePath, limit) };
    self.postMessage({ ok: true, result: replayPolicy(cached.trace, policy, opts) });
  } catch (err) {
    self.postMessage({ ok: false, error: err instanceof Error ? (err.stack ?? err.message) : String(err) });
  }
};
