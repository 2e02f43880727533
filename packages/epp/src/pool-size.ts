import type { PoolSizing } from "@kv-epp/tokenizer";

/** The tokenizer pool's size, what set it (for the start-up log), and a warning when the flag overruns the CPUs. */
export interface PoolSize {
  size: number;
  sizedBy: "--tokenizer-threads" | PoolSizing["basis"];
  quota: number | null;
  cpus: number;
  warning?: string;
}

/**
 * `threads` (--tokenizer-threads) if set, else the default sizing. Members past the CPU limit (the quota less the
 * decision thread's CPU, or the CPUs, whichever is lower: sizing.limitedBy) compete with the decision thread: under a quota they get the whole cgroup,
 * the decision thread with it, throttled for the rest of each CFS period.
 */
export function poolSizeOf(threads: number | undefined, sizing: PoolSizing): PoolSize {
  const { quota, cpus, cpuLimit } = sizing;
  if (threads === undefined) return { size: sizing.size, sizedBy: sizing.basis, quota, cpus };
  const size: PoolSize = { size: threads, sizedBy: "--tokenizer-threads", quota, cpus };
  if (threads <= cpuLimit) return size;
  const byQuota = sizing.limitedBy === "quota";
  const limit = byQuota ? `a CPU quota of ${quota} less one for the decision thread` : `the process's ${cpus} CPUs`;
  return { ...size, warning: `--tokenizer-threads ${threads} is above the ${cpuLimit} members ${limit} allow: busy members will delay picks${byQuota ? " (the cgroup throttled whole)" : ""}` };
}
