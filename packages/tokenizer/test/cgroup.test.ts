import { expect, test } from "bun:test";
import { cgroupDirs, tightest } from "../src/index";

const files = (m: Record<string, string>) => (p: string) => m[p] ?? null;

test("a controller's directories run from the process's own group up to each mount's root", () => {
  const hybrid = "12:memory:/user.slice/job\n4:cpu,cpuacct:/user.slice/job\n0::/user.slice/job\n";
  expect(cgroupDirs("cpu", files({ "/proc/self/cgroup": hybrid }))).toEqual({
    v2: ["/sys/fs/cgroup/user.slice/job", "/sys/fs/cgroup/user.slice", "/sys/fs/cgroup"],
    v1: [
      "/sys/fs/cgroup/cpu,cpuacct/user.slice/job", "/sys/fs/cgroup/cpu,cpuacct/user.slice", "/sys/fs/cgroup/cpu,cpuacct",
      "/sys/fs/cgroup/cpu/user.slice/job", "/sys/fs/cgroup/cpu/user.slice", "/sys/fs/cgroup/cpu",
    ],
  });
  expect(cgroupDirs("memory", files({ "/proc/self/cgroup": hybrid })).v1).toEqual(["/sys/fs/cgroup/memory/user.slice/job", "/sys/fs/cgroup/memory/user.slice", "/sys/fs/cgroup/memory"]);
});

test("a v1 path keeps its ':'; a private namespace or no /proc/self/cgroup reads the roots alone", () => {
  expect(cgroupDirs("memory", files({ "/proc/self/cgroup": "5:memory:/jobs/run:1\n" })).v1).toEqual(["/sys/fs/cgroup/memory/jobs/run:1", "/sys/fs/cgroup/memory/jobs", "/sys/fs/cgroup/memory"]);
  expect(cgroupDirs("cpu", files({ "/proc/self/cgroup": "0::/\n" }))).toEqual({ v2: ["/sys/fs/cgroup"], v1: ["/sys/fs/cgroup/cpu"] });
  expect(cgroupDirs("cpu", files({}))).toEqual({ v2: ["/sys/fs/cgroup"], v1: ["/sys/fs/cgroup/cpu"] });
});

test("the tightest value names its directory, the deepest on a tie", () => {
  const limits: Record<string, number> = { "/a/b": 2, "/a": 2, "/": 1 };
  expect(tightest(["/a/b/c", "/a/b", "/a"], (dir) => limits[dir] ?? null)).toEqual({ value: 2, dir: "/a/b" });
  expect(tightest(["/a/b", "/"], (dir) => limits[dir] ?? null)).toEqual({ value: 1, dir: "/" });
  expect(tightest(["/x"], () => null)).toBeNull();
});
