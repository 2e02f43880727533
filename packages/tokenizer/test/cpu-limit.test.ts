import { expect, test } from "bun:test";
import { availableParallelism } from "node:os";
import { cpuThrottlingReader, defaultPoolSize, poolSizing } from "../src/index";

// What a scrape reads: the file found once, read now.
const cpuThrottling = (read: Parameters<typeof cpuThrottlingReader>[0]) => cpuThrottlingReader(read)?.() ?? null;
import { MAX_DEFAULT_MEMBERS } from "../src/pool/cpu-limit";

const files = (m: Record<string, string>) => (p: string) => m[p] ?? null;
const v2Quota = (cpus: number) => files({ "/sys/fs/cgroup/cpu.max": `${cpus * 100_000} 100000\n` });
const cpus = availableParallelism();

test("under a quota the default pool leaves the decision thread a CPU of it (members plus it fit, at least one member); without one, a member per CPU", () => {
  // As many busy members as the quota's CPUs would get the cgroup, decision thread included, throttled.
  expect(defaultPoolSize(v2Quota(2))).toBe(1);
  // A fractional quota: a member more would overrun it (2 + 1 > 2.5); below 2 CPUs, one member all the same.
  expect(defaultPoolSize(v2Quota(2.5))).toBe(1);
  expect(defaultPoolSize(v2Quota(1.5))).toBe(1);
  expect(defaultPoolSize(v2Quota(0.5))).toBe(1);
  // Within the CPUs the scheduler gives the process.
  // A quota a CPU or more above them leaves the decision thread room: a member per CPU.
  expect(defaultPoolSize(v2Quota(64))).toBe(cpus);
  expect(defaultPoolSize(v2Quota(cpus + 1))).toBe(cpus);
  expect(defaultPoolSize(v2Quota(cpus))).toBe(Math.max(1, cpus - 1));
  // No quota, nothing throttles: a member per CPU.
  expect(defaultPoolSize(files({ "/sys/fs/cgroup/cpu.max": "max 100000" }))).toBe(cpus);
  expect(defaultPoolSize(files({}))).toBe(cpus);
  // Never past MAX_DEFAULT_MEMBERS (each member holds its own tokenizer): a 64-CPU node with no quota, or a large quota.
  expect(defaultPoolSize(files({}), 64)).toBe(MAX_DEFAULT_MEMBERS);
  expect(defaultPoolSize(v2Quota(32), 64)).toBe(MAX_DEFAULT_MEMBERS);
  expect(defaultPoolSize(v2Quota(6), 64)).toBe(5);
  // cgroup v1.
  expect(defaultPoolSize(files({ "/sys/fs/cgroup/cpu/cpu.cfs_quota_us": "200000", "/sys/fs/cgroup/cpu/cpu.cfs_period_us": "100000" }))).toBe(1);
});

test("the quota is the tightest of the process's own cgroup (from /proc/self/cgroup) and its ancestors", () => {
  // A systemd service's CPUQuota= under cgroup v2, the host's cgroup namespace: the root has no quota.
  const service = "/system.slice/kv-epp.service";
  const v2 = { "/proc/self/cgroup": `0::${service}\n`, "/sys/fs/cgroup/cpu.max": "max 100000\n" };
  expect(defaultPoolSize(files({ ...v2, [`/sys/fs/cgroup${service}/cpu.max`]: "300000 100000\n" }), 16)).toBe(2);
  // A parent's quota bounds its children; the tightest wins.
  expect(defaultPoolSize(files({ ...v2, "/sys/fs/cgroup/system.slice/cpu.max": "200000 100000\n", [`/sys/fs/cgroup${service}/cpu.max`]: "600000 100000\n" }), 16)).toBe(1);
  // Inside a private cgroup namespace the path is "/": the root's files, as without /proc/self/cgroup.
  expect(defaultPoolSize(files({ "/proc/self/cgroup": "0::/\n", "/sys/fs/cgroup/cpu.max": "300000 100000\n" }), 16)).toBe(2);
  // A container without one sees its host path, its own cgroup mounted at the root: the deeper files are absent.
  expect(defaultPoolSize(files({ "/proc/self/cgroup": "0::/kubepods/pod1/abc\n", "/sys/fs/cgroup/cpu.max": "300000 100000\n" }), 16)).toBe(2);
  // cgroup v1: the cpu controller's line, under its mount (cpu,cpuacct), walking up likewise.
  const v1 = "12:memory:/user.slice\n4:cpu,cpuacct:/user.slice/job\n1:name=systemd:/user.slice/job\n";
  const v1Files = { "/proc/self/cgroup": v1, "/sys/fs/cgroup/cpu,cpuacct/user.slice/cpu.cfs_quota_us": "400000", "/sys/fs/cgroup/cpu,cpuacct/user.slice/cpu.cfs_period_us": "100000" };
  expect(defaultPoolSize(files(v1Files), 16)).toBe(3);
  expect(defaultPoolSize(files({ ...v1Files, "/sys/fs/cgroup/cpu,cpuacct/user.slice/job/cpu.cfs_quota_us": "-1", "/sys/fs/cgroup/cpu,cpuacct/user.slice/job/cpu.cfs_period_us": "100000" }), 16)).toBe(3);
});

test("the sizing tells its basis (the quota, the CPUs, or the cap of 8) and the limit before the cap", () => {
  expect(poolSizing(v2Quota(4), 16)).toEqual({ size: 3, basis: "quota", limitedBy: "quota", quota: 4, cpus: 16, cpuLimit: 3 });
  expect(poolSizing(v2Quota(64), 4)).toEqual({ size: 4, basis: "cpus", limitedBy: "cpus", quota: 64, cpus: 4, cpuLimit: 4 });
  expect(poolSizing(files({}), 64)).toEqual({ size: MAX_DEFAULT_MEMBERS, basis: "max_default_members", limitedBy: "cpus", quota: null, cpus: 64, cpuLimit: 64 });
  // Capped at 8, yet the quota is what a --tokenizer-threads above it would overrun.
  expect(poolSizing(v2Quota(20), 64)).toEqual({ size: MAX_DEFAULT_MEMBERS, basis: "max_default_members", limitedBy: "quota", quota: 20, cpus: 64, cpuLimit: 19 });
});

test("the cgroup's throttling is read from cpu.stat (v2, else v1), absent without its fields", () => {
  const v2 = "usage_usec 9000000\nuser_usec 8000000\nsystem_usec 1000000\nnr_periods 120\nnr_throttled 7\nthrottled_usec 350000\n";
  expect(cpuThrottling(files({ "/sys/fs/cgroup/cpu.stat": v2 }))).toEqual({ periods: 7, seconds: 0.35 });
  expect(cpuThrottling(files({ "/sys/fs/cgroup/cpu/cpu.stat": "nr_periods 50\nnr_throttled 3\nthrottled_time 2500000000\n" }))).toEqual({ periods: 3, seconds: 2.5 });
  // A cgroup v2 without the cpu controller tells only its usage.
  expect(cpuThrottling(files({ "/sys/fs/cgroup/cpu.stat": "usage_usec 9000000\nuser_usec 8000000\nsystem_usec 1000000\n" }))).toBeNull();
  expect(cpuThrottling(files({}))).toBeNull();
});

test("the throttling is the tightest quota's group's: a systemd service's CPUQuota=, not the root's", () => {
  const service = "/system.slice/kv-epp.service";
  const stat = (throttled: number) => `nr_periods 120\nnr_throttled ${throttled}\nthrottled_usec ${throttled * 50_000}\n`;
  const v2 = {
    "/proc/self/cgroup": `0::${service}\n`,
    "/sys/fs/cgroup/cpu.max": "max 100000\n",
    "/sys/fs/cgroup/cpu.stat": stat(0),
    "/sys/fs/cgroup/system.slice/cpu.stat": stat(0),
    [`/sys/fs/cgroup${service}/cpu.max`]: "200000 100000\n",
    [`/sys/fs/cgroup${service}/cpu.stat`]: stat(9),
  };
  expect(cpuThrottling(files(v2))).toEqual({ periods: 9, seconds: 0.45 });
  // A slice's quota tighter than the service's: the slice is the group throttled.
  expect(cpuThrottling(files({ ...v2, "/sys/fs/cgroup/system.slice/cpu.max": "100000 100000\n", "/sys/fs/cgroup/system.slice/cpu.stat": stat(4) }))).toEqual({ periods: 4, seconds: 0.2 });
  // cgroup v1: the quota's directory under the cpu controller's mount, its time in ns.
  const v1 = {
    "/proc/self/cgroup": "4:cpu,cpuacct:/user.slice/job\n",
    "/sys/fs/cgroup/cpu,cpuacct/user.slice/job/cpu.cfs_quota_us": "300000",
    "/sys/fs/cgroup/cpu,cpuacct/user.slice/job/cpu.cfs_period_us": "100000",
    "/sys/fs/cgroup/cpu,cpuacct/user.slice/job/cpu.stat": "nr_periods 40\nnr_throttled 6\nthrottled_time 1500000000\n",
    "/sys/fs/cgroup/cpu/cpu.stat": "nr_periods 40\nnr_throttled 0\nthrottled_time 0\n",
  };
  expect(cpuThrottling(files(v1))).toEqual({ periods: 6, seconds: 1.5 });
});
