import { readFileSync } from "node:fs";
import { setPriority } from "node:os";

/**
 * A thread as the kernel schedules it: its id, nice value and time slice in µs (0: the kernel's default slice), or why
 * it could not be set. `sliceUnsupported`: a slice was asked for and the kernel keeps none (see requestThreadSlice).
 */
export type ThreadPriority = { tid: number; nice: number; sliceUs: number; sliceUnsupported?: string } | { unsupported: string };

/**
 * Sets the calling thread's CPU priority: its `nice` value (Linux: nice is per thread; 0 leaves it as it is), and,
 * `sliceUs` above 0, its time slice (requestThreadSlice). A pool member calls it; so does the decision thread for its
 * slice. Only this thread: its id comes from /proc/thread-self, because setpriority(pid 0) means the whole process
 * outside Linux.
 */
export function setThreadPriority(nice: number, sliceUs = 0): ThreadPriority {
  if (process.platform !== "linux") return { unsupported: `per-thread priority needs Linux (this is ${process.platform})` };
  try {
    const tid = threadId();
    if (nice !== 0) setPriority(tid, nice);
    const slice = sliceUs > 0 ? requestThreadSlice(sliceUs) : { sliceUs: 0 };
    return { tid, nice: threadNice(tid), ...slice };
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

/**
 * The slice the scheduler gives thread `tid` of this process, in µs, as /proc/self/task/<tid>/sched reports it
 * (`se.slice`, ns); null where the kernel does not report it (that file needs CONFIG_SCHED_DEBUG; older kernels have
 * no such line).
 */
export function threadSliceUs(tid: number): number | null {
  let sched: string;
  try {
    sched = readFileSync(`/proc/self/task/${tid}/sched`, "utf8");
  } catch {
    return null;
  }
  const m = /^se\.slice\s*:\s*(\d+)/m.exec(sched);
  return m ? Number(m[1]) / 1000 : null;
}

/** Thread `tid` of this process as the kernel reports it now (Linux; null elsewhere): its nice value and slice. */
export function threadScheduling(tid: number): { tid: number; nice: number; sliceUs: number | null } | null {
  if (process.platform !== "linux") return null;
  try {
    return { tid, nice: threadNice(tid), sliceUs: threadSliceUs(tid) };
  } catch {
    return null;
  }
}

// sched_setattr(2) / sched_getattr(2): no Node or Bun API reaches them, so they are called through libc's
// syscall() (bun:ffi). The numbers per architecture (the kernel's syscall tables).
const SCHED_ATTR = { x64: { set: 314n, get: 315n }, arm64: { set: 274n, get: 275n } } as const;
/** struct sched_attr (SCHED_ATTR_SIZE_VER1): size u32, policy u32, flags u64, nice s32, priority u32, runtime u64 at 24, ... */
const ATTR_BYTES = 56;
const FLAGS_AT = 8;
const RUNTIME_AT = 24;
/**
 * SCHED_FLAG_RESET_ON_FORK: a thread this one starts later (a replacement pool member, a runtime helper thread) gets the
 * kernel's default slice, not this one's: since Linux 6.12 a custom slice is otherwise inherited. Any thread may set it;
 * only clearing it needs CAP_SYS_NICE.
 */
const RESET_ON_FORK = 0x01n;

type Syscall = (nr: bigint, pid: bigint, attr: number, a: number, b: number) => bigint;
let syscall: Syscall | string | undefined;

function libcSyscall(): Syscall | string {
  if (syscall !== undefined) return syscall;
  try {
    // Loaded on first use: the wrapper's compilation costs a few ms, once per thread.
    const { dlopen, FFIType } = require("bun:ffi") as typeof import("bun:ffi");
    const { i64, ptr, u32 } = FFIType;
    const lib = dlopen("libc.so.6", { syscall: { args: [i64, i64, ptr, u32, u32], returns: i64 } });
    syscall = lib.symbols.syscall as unknown as Syscall;
  } catch (err) {
    syscall = `libc's syscall() could not be loaded: ${(err as Error).message}`;
  }
  return syscall;
}

/**
 * Asks the kernel for a time slice of `us` for the calling thread (Linux 6.12+, EEVDF: sched_attr.sched_runtime of a
 * SCHED_OTHER thread, clamped by the kernel to 0.1-100 ms; 0: back to the kernel's default), its policy and nice value
 * kept, and not passed on to the threads it starts later (RESET_ON_FORK). A shorter slice gives the
 * thread an earlier deadline each time it wakes, so it preempts a thread that has been running for longer instead of
 * waiting out that thread's slice; its share of the CPU is unchanged (that is the nice value's weight). For threads
 * that sleep between short bursts of work and whose wake-ups hold a request: the decision thread and the tokenizer
 * pool's members. What the kernel then holds is read back: an older kernel accepts the call and keeps no slice.
 */
export function requestThreadSlice(us: number): { sliceUs: number; sliceUnsupported?: string } {
  const numbers = SCHED_ATTR[process.arch as keyof typeof SCHED_ATTR];
  if (numbers === undefined) return { sliceUs: 0, sliceUnsupported: `no sched_setattr number known for ${process.arch}` };
  const call = libcSyscall();
  if (typeof call === "string") return { sliceUs: 0, sliceUnsupported: call };
  const { ptr } = require("bun:ffi") as typeof import("bun:ffi");
  const attr = new Uint8Array(ATTR_BYTES);
  const view = new DataView(attr.buffer);
  const at = ptr(attr);
  if (call(numbers.get, 0n, at, ATTR_BYTES, 0) !== 0n) return { sliceUs: 0, sliceUnsupported: "sched_getattr failed" };
  view.setBigUint64(RUNTIME_AT, BigInt(Math.round(us * 1000)), true);
  // The size, policy, nice and flags read back are written as they were (dropping a RESET_ON_FORK already set would
  // need CAP_SYS_NICE), plus RESET_ON_FORK; the syscall's own flags argument is 0.
  view.setBigUint64(FLAGS_AT, view.getBigUint64(FLAGS_AT, true) | RESET_ON_FORK, true);
  if (call(numbers.set, 0n, at, 0, 0) !== 0n) return { sliceUs: 0, sliceUnsupported: "sched_setattr refused (seccomp or an older kernel)" };
  if (us === 0) return { sliceUs: 0 };
  attr.fill(0);
  if (call(numbers.get, 0n, at, ATTR_BYTES, 0) !== 0n) return { sliceUs: 0, sliceUnsupported: "sched_getattr failed" };
  const held = Number(view.getBigUint64(RUNTIME_AT, true)) / 1000;
  return held > 0 ? { sliceUs: held } : { sliceUs: 0, sliceUnsupported: "the kernel keeps no slice per thread (Linux 6.12+ does)" };
}
