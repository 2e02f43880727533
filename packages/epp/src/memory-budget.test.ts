import { expect, test } from "bun:test";
import { dumpBodyLimit, extProcBufferBudget, memoryLimit, recoveryBudget } from "./memory-budget.ts";

const files = (m: Record<string, string>) => (p: string) => m[p] ?? null;
const GiB = 1024 ** 3;

test("cgroup v2: this process's own group, or the namespace root; 'max' is no limit", () => {
  const cg = "0::/kubepods/pod1/c1\n";
  expect(memoryLimit(files({ "/proc/self/cgroup": cg, "/sys/fs/cgroup/kubepods/pod1/c1/memory.max": "2147483648\n" }), 64 * GiB)).toEqual({ bytes: 2 * GiB, source: "cgroup v2" });
  expect(memoryLimit(files({ "/proc/self/cgroup": "0::/\n", "/sys/fs/cgroup/memory.max": "1073741824\n" }), 64 * GiB)).toEqual({ bytes: GiB, source: "cgroup v2" });
  expect(memoryLimit(files({ "/proc/self/cgroup": "0::/\n", "/sys/fs/cgroup/memory.max": "max\n" }), 64 * GiB)).toEqual({ bytes: 64 * GiB, source: "host memory" });
});

test("the tightest limit of the group and its ancestors: a systemd slice's MemoryMax= bounds its service", () => {
  const cg = "0::/system.slice/kv-epp.service\n";
  const root = { "/proc/self/cgroup": cg, "/sys/fs/cgroup/memory.max": "max\n", "/sys/fs/cgroup/system.slice/kv-epp.service/memory.max": "max\n" };
  expect(memoryLimit(files({ ...root, "/sys/fs/cgroup/system.slice/memory.max": "4294967296\n" }), 64 * GiB)).toEqual({ bytes: 4 * GiB, source: "cgroup v2" });
  expect(memoryLimit(files({ ...root, "/sys/fs/cgroup/system.slice/memory.max": "4294967296\n", "/sys/fs/cgroup/system.slice/kv-epp.service/memory.max": "1073741824\n" }), 64 * GiB)).toEqual({ bytes: GiB, source: "cgroup v2" });
});

test("cgroup v1 fallback; the unlimited value (~2^63) is no limit", () => {
  const cg = "4:memory:/docker/abc\n1:cpu,cpuacct:/docker/abc\n";
  expect(memoryLimit(files({ "/proc/self/cgroup": cg, "/sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes": "536870912\n" }), 64 * GiB)).toEqual({ bytes: 512 * 1024 ** 2, source: "cgroup v1" });
  expect(memoryLimit(files({ "/proc/self/cgroup": "4:memory:/\n", "/sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n" }), 8 * GiB)).toEqual({ bytes: 8 * GiB, source: "host memory" });
});

test("cgroup v1: the whole path, ':' and all, and a parent's limit above an unlimited group", () => {
  const colon = "4:memory:/jobs/run:1\n";
  expect(memoryLimit(files({ "/proc/self/cgroup": colon, "/sys/fs/cgroup/memory/jobs/run:1/memory.limit_in_bytes": "268435456\n", "/sys/fs/cgroup/memory/jobs/memory.limit_in_bytes": "536870912\n" }), 8 * GiB)).toEqual({ bytes: 256 * 1024 ** 2, source: "cgroup v1" });
  expect(memoryLimit(files({ "/proc/self/cgroup": colon, "/sys/fs/cgroup/memory/jobs/run:1/memory.limit_in_bytes": "9223372036854771712\n", "/sys/fs/cgroup/memory/jobs/memory.limit_in_bytes": "536870912\n" }), 8 * GiB)).toEqual({ bytes: 512 * 1024 ** 2, source: "cgroup v1" });
});

test("the budget is the flag when given, else half the limit; the body limit is twice the budget, at least 64 MiB", () => {
  expect(recoveryBudget(256)).toEqual({ bytes: 256 * 1024 ** 2, source: "flag" });
  expect(recoveryBudget(undefined, () => ({ bytes: 2 * GiB, source: "cgroup v2" }))).toEqual({ bytes: GiB, source: "cgroup v2" });
  expect(dumpBodyLimit(GiB)).toBe(2 * GiB);
  expect(dumpBodyLimit(1024)).toBe(64 * 1024 ** 2);
});

test("the ext_proc body budget is the flag when given, else an eighth of the limit", () => {
  expect(extProcBufferBudget(1_000_000)).toEqual({ bytes: 1_000_000, source: "flag" });
  expect(extProcBufferBudget(undefined, () => ({ bytes: 2 * GiB, source: "cgroup v1" }))).toEqual({ bytes: GiB / 4, source: "cgroup v1" });
});
