import { expect, test } from "bun:test";
import type { PoolSizing } from "@kv-epp/tokenizer";
import { poolSizeOf } from "./pool-size.ts";

const quota4: PoolSizing = { size: 3, basis: "quota", limitedBy: "quota", quota: 4, cpus: 16, cpuLimit: 3 };
const cpus2: PoolSizing = { size: 2, basis: "cpus", limitedBy: "cpus", quota: null, cpus: 2, cpuLimit: 2 };
// A quota far above the affinity mask's CPUs: the CPUs bind, nothing throttles.
const cpus4UnderQuota64: PoolSizing = { size: 4, basis: "cpus", limitedBy: "cpus", quota: 64, cpus: 4, cpuLimit: 4 };

test("the pool size tells what set it: the default's basis, or --tokenizer-threads", () => {
  expect(poolSizeOf(undefined, quota4)).toEqual({ size: 3, sizedBy: "quota", quota: 4, cpus: 16 });
  expect(poolSizeOf(undefined, cpus2)).toEqual({ size: 2, sizedBy: "cpus", quota: null, cpus: 2 });
  expect(poolSizeOf(3, quota4)).toEqual({ size: 3, sizedBy: "--tokenizer-threads", quota: 4, cpus: 16 });
  expect(poolSizeOf(1, cpus2).warning).toBeUndefined();
});

test("--tokenizer-threads above the CPU limit is warned of, naming the quota or the CPUs", () => {
  expect(poolSizeOf(4, quota4).warning).toContain("--tokenizer-threads 4 is above the 3 members a CPU quota of 4");
  expect(poolSizeOf(3, cpus2).warning).toContain("the process's 2 CPUs");
});

test("the warning names the limit that binds: the CPUs under a larger quota, with no throttling", () => {
  const { warning } = poolSizeOf(6, cpus4UnderQuota64);
  expect(warning).toContain("--tokenizer-threads 6 is above the 4 members the process's 4 CPUs allow");
  expect(warning).not.toContain("quota");
  expect(warning).not.toContain("throttled");
});
