import { readFileSync } from "node:fs";
import { setPriority } from "node:os";

/** A pool member's thread as the kernel schedules it: its id and nice value, or why it could not be lowered. */
export type ThreadPriority = { tid: number; nice: number } | { unsupported: string };

/**
 * Lowers the calling thread's CPU priority to `nice` (Linux: nice is per thread; 0 leaves it as it is). A pool
 * member given a nice value calls it, so that when the process has fewer cores than runnable threads the decision
 * thread runs first (see DEFAULT_MEMBER_NICE for what that costs under group scheduling). Only this thread: its id
 * comes from /proc/thread-self, because setpriority(pid 0) means the whole process outside Linux.
 */
export function lowerThreadPriority(nice: number): ThreadPriority {
  if (process.platform !== "linux") return { unsupported: `per-thread priority needs Linux (this is ${process.platform})` };
  try {
    const tid = threadId();
    if (nice !== 0) setPriority(tid, nice);
    return { tid, nice: threadNice(tid) };
  } catch (err) {
    return { unsupported: (err as Error).message };
  }
}

/** The calling thread's id (Linux: /proc/thread-self/stat's first field). */
export function threadId(): number {
  return Number(readFileSync("/proc/thread-self/stat", "utf8").split(" ", 1)[0]);
}

/** The nice value of thread `tid` of this process (/proc/self/task/<tid>/stat, field 19). */
export function threadNice(tid: number): number {
  const stat = readFileSync(`/proc/self/task/${tid}/stat`, "utf8");
  return Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[16]);
}
