import { availableParallelism } from "node:os";
import { CGROUP_ROOT, cgroupDirs, readOrNull, tightest, type ReadFile } from "./cgroup";

/**
 * Where the default pool size came from: the cgroup's CPU quota, the CPUs the scheduler gives the process, or
 * MAX_DEFAULT_MEMBERS below both.
 */
export interface PoolSizing {
  size: number;
  basis: PoolSizing["limitedBy"] | "max_default_members";
  /** Which bounds cpuLimit: the quota (less the decision thread's CPU), or the CPUs. */
  limitedBy: "quota" | "cpus";
  /** The tightest CPU quota of the process's cgroup and its ancestors, in CPUs; null without one. */
  quota: number | null;
  /** os.availableParallelism(): it honours the affinity mask (taskset, a cpuset; checked under Bun 1.4.5). */
  cpus: number;
  /** The most members the CPUs allow, before MAX_DEFAULT_MEMBERS: more than this overruns the quota or the CPUs. */
  cpuLimit: number;
}

/**
 * The pool's default size. Under a CPU quota (a Kubernetes CPU limit, systemd's CPUQuota=; cgroup v2 `cpu.max`,
 * else v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`, of the process's cgroup or an ancestor, the tightest): its CPUs
 * less one for the decision thread, at least one member. The decision thread (the event loop answering every pick)
 * shares the members' cgroup: with a member per CPU of the quota all busy, the cgroup spends its quota before the
 * CFS period (100 ms) ends and is throttled whole, the decision thread with it, until the next period, so every
 * pick stalls. So members plus the decision thread fit the quota: 1 member at 2 CPUs, and at 2.5 (a second would
 * make 3), and at 1.5 too (a pool needs one). Without a quota (or one a CPU or more above the CPUs the scheduler
 * gives the process, os.availableParallelism) nothing throttles: a member per CPU, the decision thread sharing a
 * core with one (it sleeps between messages, and the scheduler runs a thread that wakes ahead of one that has
 * been running; see DEFAULT_MEMBER_NICE). Either way at most MAX_DEFAULT_MEMBERS.
 */
export function poolSizing(read: ReadFile = readOrNull, cpus = availableParallelism()): PoolSizing {
  const quota = cgroupQuota(read)?.value ?? null;
  const byQuota = quota === null ? Infinity : Math.max(1, Math.floor(quota) - 1);
  const limitedBy = byQuota < cpus ? "quota" : "cpus";
  const cpuLimit = Math.min(cpus, byQuota);
  const size = Math.min(cpuLimit, MAX_DEFAULT_MEMBERS);
  return { size, basis: size < cpuLimit ? "max_default_members" : limitedBy, limitedBy, quota, cpus, cpuLimit };
}

/** poolSizing's size. */
export function defaultPoolSize(read: ReadFile = readOrNull, cpus = availableParallelism()): number {
  return poolSizing(read, cpus).size;
}

/**
 * The most members the default gives. Each holds its own preprocessor, ~20-30 MB at rest (Qwen3, its model's
 * tables shared by the pool; measured: an EPP with 4 members 283-295 MB, in-loop 199-201), so a member per CPU of
 * an unlimited 64-core node would be ~1.7 GB more: near the deployment's 2 GiB memory limit. Eight members tokenize ~50 M
 * fresh tokens a second, beyond what one EPP's requests need; --tokenizer-threads sets more.
 */
export const MAX_DEFAULT_MEMBERS = 8;

/** A cgroup's CFS throttling so far: the periods it was throttled in and the time it was, in seconds. */
export type CpuThrottling = { periods: number; seconds: number };

/**
 * The CFS throttling of the group holding the tightest CPU quota (that group counts it; a child under a parent's
 * quota, such as a systemd service under CPUQuota=, or the root above it, shows none), else of the mount root's,
 * from its `cpu.stat` (v2 `nr_throttled` / `throttled_usec`, else v1's `throttled_time` in ns): a reader of that
 * file, found once (finding it walks the cgroup's tree; reading it is one file), or null where no file has the
 * fields (no cgroup, or no cpu controller).
 */
export function cpuThrottlingReader(read: ReadFile = readOrNull): (() => CpuThrottling | null) | null {
  const quotaDir = cgroupQuota(read)?.dir;
  const files = [...(quotaDir === undefined ? [] : [quotaDir]), CGROUP_ROOT, `${CGROUP_ROOT}/cpu`].map((dir) => `${dir}/cpu.stat`);
  const file = files.find((f) => throttlingOf(read(f)) !== null);
  return file === undefined ? null : () => throttlingOf(read(file));
}

function throttlingOf(text: string | null): CpuThrottling | null {
  const stat = statFields(text);
  if (stat.nr_throttled === undefined) return null;
  if (stat.throttled_usec !== undefined) return { periods: stat.nr_throttled, seconds: stat.throttled_usec / 1e6 };
  if (stat.throttled_time !== undefined) return { periods: stat.nr_throttled, seconds: stat.throttled_time / 1e9 };
  return null;
}

/** The tightest quota of the process's cgroup v2 tree, else of its v1 cpu controller's, and where it is set. */
function cgroupQuota(read: ReadFile): { value: number; dir: string } | null {
  const dirs = cgroupDirs("cpu", read);
  return tightest(dirs.v2, (dir) => v2Quota(read(`${dir}/cpu.max`)))
    ?? tightest(dirs.v1, (dir) => v1Quota(read(`${dir}/cpu.cfs_quota_us`), read(`${dir}/cpu.cfs_period_us`)));
}

function v2Quota(line: string | null): number | null {
  if (line === null) return null;
  const [quota, period] = line.trim().split(/\s+/);
  if (quota === "max" || quota === undefined || period === undefined) return null;
  const q = Number(quota);
  const p = Number(period);
  return q > 0 && p > 0 ? q / p : null;
}

function v1Quota(quotaText: string | null, periodText: string | null): number | null {
  const quota = Number(quotaText ?? NaN);
  const period = Number(periodText ?? NaN);
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
