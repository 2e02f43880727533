import { readFileSync } from "node:fs";
import { availableParallelism } from "node:os";

/** Reads a cgroup file: its text, or null when it is absent (tests pass their own). */
export type ReadFile = (path: string) => string | null;

/**
 * The pool's default size. Under a CPU quota (a Kubernetes CPU limit; cgroup v2 `cpu.max`, else v1
 * `cpu.cfs_quota_us` / `cpu.cfs_period_us`): its CPUs less one for the decision thread, at least one member. The
 * decision thread (the event loop answering every pick) shares the members' cgroup: with a member per CPU of the
 * quota all busy, the cgroup spends its quota before the CFS period (100 ms) ends and is throttled whole, the
 * decision thread with it, until the next period, so every pick stalls. So members plus the decision thread fit
 * the quota: 1 member at 2 CPUs, and at 2.5 (a second would make 3), and at 1.5 too (a pool needs one). Without a
 * quota (or one a CPU or more above the CPUs the scheduler gives the process, os.availableParallelism) nothing
 * throttles: a member per CPU, the decision thread sharing a core with one (it sleeps between messages, and the
 * scheduler runs a thread that wakes ahead of one that has been running; see DEFAULT_MEMBER_NICE). Either way at
 * most MAX_DEFAULT_MEMBERS.
 */
export function defaultPoolSize(read: ReadFile = readOrNull, cpus = availableParallelism()): number {
  const quota = cgroupV2Quota(read) ?? cgroupV1Quota(read);
  const byCpu = quota === null ? cpus : Math.max(1, Math.min(cpus, Math.floor(quota) - 1));
  return Math.min(byCpu, MAX_DEFAULT_MEMBERS);
}

/**
 * The most members the default gives. Each holds its own tokenizer and compiled BPE, ~65 MB at rest (Qwen3,
 * measured: a pool of 1 added 55 MB to the process, of 4, 254 MB), so a member per CPU of an unlimited 64-core
 * node would be ~4 GB: past the deployment's 2 GiB memory limit, killed at start. Eight members tokenize ~50 M
 * fresh tokens a second, beyond what one EPP's requests need; --tokenizer-threads sets more.
 */
export const MAX_DEFAULT_MEMBERS = 8;

/**
 * The cgroup's CFS throttling so far, from its `cpu.stat` (v2 `nr_throttled` / `throttled_usec`, else v1's
 * `throttled_time` in ns): the periods it was throttled in and the time it was, in seconds; null where the file
 * or its fields are absent (no cgroup, or no cpu controller).
 */
export function cpuThrottling(read: ReadFile = readOrNull): { periods: number; seconds: number } | null {
  const v2 = statFields(read("/sys/fs/cgroup/cpu.stat"));
  if (v2.nr_throttled !== undefined && v2.throttled_usec !== undefined) return { periods: v2.nr_throttled, seconds: v2.throttled_usec / 1e6 };
  const v1 = statFields(read("/sys/fs/cgroup/cpu/cpu.stat"));
  if (v1.nr_throttled !== undefined && v1.throttled_time !== undefined) return { periods: v1.nr_throttled, seconds: v1.throttled_time / 1e9 };
  return null;
}

function cgroupV2Quota(read: ReadFile): number | null {
  const line = read("/sys/fs/cgroup/cpu.max");
  if (line === null) return null;
  const [quota, period] = line.trim().split(/\s+/);
  if (quota === "max" || quota === undefined || period === undefined) return null;
  const q = Number(quota);
  const p = Number(period);
  return q > 0 && p > 0 ? q / p : null;
}

function cgroupV1Quota(read: ReadFile): number | null {
  const quota = Number(read("/sys/fs/cgroup/cpu/cpu.cfs_quota_us") ?? NaN);
  const period = Number(read("/sys/fs/cgroup/cpu/cpu.cfs_period_us") ?? NaN);
  return quota > 0 && period > 0 ? quota / period : null;
}

/** `key value` lines, the numeric ones. */
function statFields(text: string | null): Record<string, number | undefined> {
  const out: Record<string, number | undefined> = {};
  for (const line of text?.split("\n") ?? []) {
    const [key, value] = line.trim().split(/\s+/);
    if (key && value !== undefined && Number.isFinite(Number(value))) out[key] = Number(value);
  }
  return out;
}

function readOrNull(path: string): string | null {
  try {
    return readFileSync(path, "utf8");
  } catch {
    return null;
  }
}
