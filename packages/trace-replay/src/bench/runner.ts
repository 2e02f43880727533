// Runs the planned replays on a pool of worker threads: each replay is independent and single-threaded,
// so on a multi-core machine they run side by side. Results come back in plan order.
import { availableParallelism } from "node:os";
import type { RunResult } from "../sim/replay.ts";
import type { RunTask } from "./run-thread.ts";

export async function runAll(
  tasks: RunTask[],
  opts: { jobs?: number; onDone?: (r: RunResult, done: number) => void } = {},
): Promise<RunResult[]> {
  const jobs = Math.max(1, Math.min(opts.jobs ?? availableParallelism(), tasks.length));
  const results: RunResult[] = new Array(tasks.length);
  let next = 0;
  let done = 0;
  const threads = Array.from({ length: jobs }, () => new Worker(new URL("./run-thread.ts", import.meta.url).href));
  try {
    await Promise.all(
      threads.map(async (thread) => {
        while (next < tasks.length) {
          const i = next++;
          const reply = await new Promise<{ ok: true; result: RunResult } | { ok: false; error: string }>((resolve, reject) => {
            thread.onmessage = (e) => resolve(e.data);
            thread.onerror = (e) => reject(new Error(`replay thread failed: ${e.message}`));
            thread.postMessage(tasks[i]!);
          });
          if (!reply.ok) throw new Error(`replay of ${tasks[i]!.policy} failed: ${reply.error}`);
          results[i] = reply.result;
          opts.onDone?.(reply.result, ++done);
        }
      }),
    );
  } finally {
    for (const t of threads) t.terminate();
  }
  return results;
}
