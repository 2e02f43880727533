// How much a recovery attempt may stage, and how much request body ext_proc streams may hold. A peer
// decides how big its dump is, clients how many bodies they send at once; this replica's memory limit
// does not move, so each budget comes from the limit the container runs under (cgroup v2 memory.max, or
// v1 memory.limit_in_bytes), else the host's memory, unless the operator gives one.
import { readFileSync } from "node:fs";
import { totalmem } from "node:os";

/**
 * Share of the memory limit a recovery attempt may stage. The rest holds the live index (empty at start,
 * but kept during a later attempt), the JS heap, the body being parsed and the index's own growth.
 */
export const RECOVERY_BUDGET_SHARE = 0.5;

/**
 * Share of the memory limit request bodies may take while they wait for their route (all ext_proc
 * streams together). A body is held for milliseconds, so this is room for bursts, not a working set;
 * small beside the recovery's share, which may be staging at the same time.
 */
export const EXT_PROC_BUFFER_SHARE = 0.125;

export type MemoryLimit = { bytes: number; source: "cgroup v2" | "cgroup v1" | "host memory" };
export type MemoryBudget = { bytes: number; source: "flag" | MemoryLimit["source"] };

/** Values at or above this mean "no limit" (v1 reports an unlimited group as ~2^63 rounded to pages). */
const UNLIMITED = 2 ** 60;

type Read = (path: string) => string | undefined;
const readOrUndefined: Read = (path) => {
  try {
    return readFileSync(path, "utf8");
  } catch {
    return undefined;
  }
};

function limitValue(text: string | undefined): number | undefined {
  const t = text?.trim();
  if (t === undefined || t === "" || t === "max") return undefined;
  const n = Number(t);
  return Number.isFinite(n) && n > 0 && n < UNLIMITED ? n : undefined;
}

/**
 * The memory limit of this process's cgroup: its own group's file (from /proc/self/cgroup) first, then the
 * mount root (what a container with its own cgroup namespace sees), v2 before v1; the host's memory when no
 * group has a limit. `read` and `root` are for tests.
 */
export function memoryLimit(read: Read = readOrUndefined, root = "/sys/fs/cgroup", hostBytes = totalmem()): MemoryLimit {
  const groups = (read("/proc/self/cgroup") ?? "").split("\n");
  const v2 = groups.find((l) => l.startsWith("0::"))?.slice(3);
  const v1 = groups.map((l) => l.split(":")).find((f) => f.length >= 3 && f[1]!.split(",").includes("memory"))?.[2];
  const candidates: [string, MemoryLimit["source"]][] = [
    ...(v2 !== undefined && v2 !== "/" ? [[`${root}${v2}/memory.max`, "cgroup v2"] as [string, "cgroup v2"]] : []),
    [`${root}/memory.max`, "cgroup v2"],
    ...(v1 !== undefined && v1 !== "/" ? [[`${root}/memory${v1}/memory.limit_in_bytes`, "cgroup v1"] as [string, "cgroup v1"]] : []),
    [`${root}/memory/memory.limit_in_bytes`, "cgroup v1"],
  ];
  for (const [path, source] of candidates) {
    const bytes = limitValue(read(path));
    if (bytes !== undefined) return { bytes, source };
  }
  return { bytes: hostBytes, source: "host memory" };
}

/** The explicit budget (--recovery-budget-mib) when given, else RECOVERY_BUDGET_SHARE of the memory limit. */
export function recoveryBudget(explicitMiB: number | undefined, limit: () => MemoryLimit = () => memoryLimit()): MemoryBudget {
  return budget(explicitMiB === undefined ? undefined : explicitMiB * 1024 * 1024, RECOVERY_BUDGET_SHARE, limit);
}

/** The explicit budget (--ext-proc-buffer-max-bytes) when given, else EXT_PROC_BUFFER_SHARE of the memory limit. */
export function extProcBufferBudget(explicitBytes: number | undefined, limit: () => MemoryLimit = () => memoryLimit()): MemoryBudget {
  return budget(explicitBytes, EXT_PROC_BUFFER_SHARE, limit);
}

function budget(explicitBytes: number | undefined, share: number, limit: () => MemoryLimit): MemoryBudget {
  if (explicitBytes !== undefined && explicitBytes > 0) return { bytes: explicitBytes, source: "flag" };
  const l = limit();
  return { bytes: Math.floor(l.bytes * share), source: l.source };
}

/**
 * The most body a dump may have: twice the budget (a dump's JSON is ~60 bytes per block, the index ~90, so
 * a dump that fits the budget is well inside this), at least 64 MiB. It bounds the time a dump of models
 * this replica skips can take, since skipping costs no memory to be bounded by.
 */
export function dumpBodyLimit(budgetBytes: number): number {
  return Math.max(2 * budgetBytes, 64 * 1024 * 1024);
}
