import { expect, test } from "bun:test";
import type { PoolSizing } from "@kv-epp/tokenizer";
import { poolSizeOf } from "./pool-size.ts";

const quota4: PoolSizing = { size: 3, basis: "quota", quota: 4, cpus: 16, cpuLimit: 3 };
const cpus2: PoolSizing = { size: 2, basis: "cpus", quota: null, cpus: 2, cpuLimit: 2 };

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
