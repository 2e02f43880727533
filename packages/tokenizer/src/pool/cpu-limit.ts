import { readFileSync } from "node:fs";
import { availableParallelism } from "node:os";

/**
 * The CPUs this process may really use: the cgroup's CPU quota (a Kubernetes CPU limit; cgroup v2 `cpu.max`,
 * else v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us`), rounded up, never more than the CPUs the scheduler gives
 * it (os.availableParallelism, which sees the affinity mask but not the quota), at least 1.
 */
export function cpuLimit(read: (path: string) => string | null = readOrNull): number {
  const cpus = availableParallelism();
  const quota = cgroupV2Quota(read) ?? cgroupV1Quota(read);
  return Math.max(1, quota === null ? cpus : Math.min(cpus, Math.ceil(quota)));
}

function cgroupV2Quota(read: (path: string) => string | null): number | null {
  const line = read("/sys/fs/cgroup/cpu.max");
  if (line === null) return null;
  const [quota, period] = line.trim().split(/\s+/);
  if (quota === "max" || quota === undefined || period === undefined) return null;
  const q = Number(quota);
  const p = Number(period);
  return q > 0 && p > 0 ? q / p : null;
}

function cgroupV1Quota(read: (path: string) => string | null): number | null {
  const quota = Number(read("/sys/fs/cgroup/cpu/cpu.cfs_quota_us") ?? NaN);
  const period = Number(read("/sys/fs/cgroup/cpu/cpu.cfs_period_us") ?? NaN);
  return quota > 0 && period > 0 ? quota / period : null;
}

function readOrNull(path: string): string | null {
  try {
    return readFileSync(path, "utf8");
  } catch {
    return null;
  }
}
