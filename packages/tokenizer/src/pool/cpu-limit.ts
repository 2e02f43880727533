import { readFileSync } from "node:fs";
import { availableParallelism } from "node:os";

/** Reads a cgroup file: its text, or null when it is absent (tests pass their own). */
export type ReadFile = (path: string) => string | null;

/**
 * Where the default pool size came from: the cgroup's CPU quota, the CPUs the scheduler gives the process, or
 * MAX_DEFAULT_MEMBERS below both.
 */
export interface PoolSizing {
  size: number;
  basis: "quota" | "cpus" | "max_default_members";
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
  const quota = cgroupQuota(read);
  const byQuota = quota === null ? Infinity : Math.max(1, Math.floor(quota) - 1);
  const cpuLimit = Math.min(cpus, byQuota);
  const size = Math.min(cpuLimit, MAX_DEFAULT_MEMBERS);
  const basis = size < cpuLimit ? "max_default_members" : byQuota < cpus ? "quota" : "cpus";
  return { size, basis, quota, cpus, cpuLimit };
}

/** poolSizing's size. */
export function defaultPoolSize(read: ReadFile = readOrNull, cpus = availableParallelism()): number {
  return poolSizing(read, cpus).size;
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

/** The tightest quota of the process's cgroup v2 tree, else of its v1 cpu controller's. */
function cgroupQuota(read: ReadFile): number | null {
  const own = ownCgroups(read("/proc/self/cgroup"));
  const v2 = tightest(ancestors("/sys/fs/cgroup", own.v2).map((dir) => v2Quota(read(`${dir}/cpu.max`))));
  if (v2 !== null) return v2;
  // v1 mounts the cpu controller as cpu,cpuacct (cpu a link to it) or cpu alone.
  const mounts = [...new Set([`/sys/fs/cgroup/${own.v1Mount}`, "/sys/fs/cgroup/cpu"])];
  const dirs = mounts.flatMap((mount) => ancestors(mount, own.v1));
  return tightest(dirs.map((dir) => v1Quota(read(`${dir}/cpu.cfs_quota_us`), read(`${dir}/cpu.cfs_period_us`))));
}

/**
 * The process's cgroup paths from /proc/self/cgroup: v2's `0::<path>`, and v1's cpu controller's line, with its
 * mount's name (`cpu,cpuacct`). "/" where absent, and inside a private cgroup namespace, whose root is its own.
 */
function ownCgroups(text: string | null): { v2: string; v1: string; v1Mount: string } {
  const own = { v2: "/", v1: "/", v1Mount: "cpu" };
  for (const line of text?.split("\n") ?? []) {
    const [, controllers, path] = line.match(/^\d+:([^:]*):(.*)$/) ?? [];
    if (controllers === undefined || path === undefined) continue;
    if (controllers === "") own.v2 = path;
    else if (controllers.split(",").includes("cpu")) Object.assign(own, { v1: path, v1Mount: controllers });
  }
  return own;
}

/**
 * `root` joined with `path`, then each parent up to `root`. A quota set on any of them bounds the process. Where
 * the mount is the process's own (a container without a cgroup namespace sees its host path, its cgroup mounted at
 * the root), the deeper directories are absent and only the root is read.
 */
function ancestors(root: string, path: string): string[] {
  const parts = path.split("/").filter((p) => p !== "" && p !== "." && p !== "..");
  return parts.map((_, i) => `${root}/${parts.slice(0, parts.length - i).join("/")}`).concat(root);
}

function tightest(quotas: (number | null)[]): number | null {
  const set = quotas.filter((q): q is number => q !== null);
  return set.length === 0 ? null : Math.min(...set);
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

function readOrNull(path: string): string | null {
  try {
    return readFileSync(path, "utf8");
  } catch {
    return null;
  }
}
