// How much a recovery attempt may stage, and how much request body ext_proc streams may hold. A peer
// decides how big its dump is, clients how many bodies they send at once; this replica's memory limit
// does not move, so each budget comes from the limit the container runs under (cgroup v2 memory.max, or
// v1 memory.limit_in_bytes, of its group or an ancestor), else the host's memory, unless the operator gives one.
import { totalmem } from "node:os";
import { cgroupDirs, readOrNull, tightest, type ReadFile } from "@kv-epp/tokenizer";

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

function limitValue(text: string | null): number | null {
  const t = text?.trim();
  if (t === undefined || t === "" || t === "max") return null;
  const n = Number(t);
  return Number.isFinite(n) && n > 0 && n < UNLIMITED ? n : null;
}

/**
 * The memory limit of this process's cgroup: the tightest over its own group (from /proc/self/cgroup) and its
 * ancestors up to the mount root (a systemd slice's MemoryMax= bounds its services), v2 before v1; the host's
 * memory when no group has a limit. `read` is for tests.
 */
export function memoryLimit(read: ReadFile = readOrNull, hostBytes = totalmem()): MemoryLimit {
  const dirs = cgroupDirs("memory", read);
  const v2 = tightest(dirs.v2, (dir) => limitValue(read(`${dir}/memory.max`)));
  if (v2 !== null) return { bytes: v2.value, source: "cgroup v2" };
  const v1 = tightest(dirs.v1, (dir) => limitValue(read(`${dir}/memory.limit_in_bytes`)));
  if (v1 !== null) return { bytes: v1.value, source: "cgroup v1" };
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
