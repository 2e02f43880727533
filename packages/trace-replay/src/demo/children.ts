// The demo's child processes. Each is `bun run <script> ...` started in its own process group, so one
// signal reaches `bun run` and the process it starts; every group is signalled on stop, on Ctrl-C and
// on exit, so nothing is left running.
import { spawn, type ChildProcess } from "node:child_process";
import { createWriteStream, readFileSync, writeFileSync, type WriteStream } from "node:fs";
import { constants } from "node:os";
import { createInterface } from "node:readline";

export type Child = {
  name: string;
  proc: ChildProcess;
  /** resolves with the exit code (or signal name) */
  exited: Promise<number | string>;
  logPath: string;
};

export class Children {
  private readonly live = new Map<string, Child>();

  constructor(private readonly cwd: string) {
    // Last resort for an exception that unwinds the demo: a synchronous kill of every group.
    process.on("exit", () => {
      for (const c of this.live.values()) signalGroup(c.proc, "SIGKILL");
    });
  }

  /**
   * Starts `bun run <args>`; stdout and stderr go to `logPath`, lines also to `onLine`. `nice` (> 0): the child
   * runs that much lower (`nice -n`, added to ours, at most 19), and its session at `nice` (see lowerSessionPriority).
   */
  start(name: string, args: string[], logPath: string, { onLine, nice = 0 }: { onLine?: (line: string) => void; nice?: number } = {}): Child {
    const argv = nice > 0 ? ["nice", "-n", String(nice), "bun", "run", ...args] : ["bun", "run", ...args];
    const proc = spawn(argv[0]!, argv.slice(1), { cwd: this.cwd, detached: true, stdio: ["ignore", "pipe", "pipe"] });
    if (nice > 0 && proc.pid !== undefined) lowerSessionPriority(proc.pid, nice);
    const log: WriteStream = createWriteStream(logPath);
    for (const stream of [proc.stdout!, proc.stderr!]) {
      createInterface({ input: stream }).on("line", (line) => {
        log.write(`${line}\n`);
        onLine?.(line);
      });
    }
    const exited = new Promise<number | string>((resolve) =>
      proc.on("exit", (code, signal) => {
        this.live.delete(name);
        log.end();
        resolve(code ?? signal ?? -1);
      }),
    );
    const child = { name, proc, exited, logPath };
    this.live.set(name, child);
    return child;
  }

  get names(): string[] {
    return [...this.live.keys()];
  }

  /** SIGTERM (or `signal`) to the child's group, SIGKILL after `graceMs`; resolves once it exited. */
  async stop(name: string, opts: { signal?: NodeJS.Signals; graceMs?: number } = {}): Promise<void> {
    const c = this.live.get(name);
    if (!c) return;
    signalGroup(c.proc, opts.signal ?? "SIGTERM");
    const timer = setTimeout(() => signalGroup(c.proc, "SIGKILL"), opts.graceMs ?? 5000);
    await c.exited;
    clearTimeout(timer);
  }

  async stopAll(graceMs = 5000): Promise<void> {
    await Promise.all(this.names.map((n) => this.stop(n, { graceMs })));
  }
}

function signalGroup(proc: ChildProcess, signal: NodeJS.Signals): void {
  if (proc.pid === undefined || proc.exitCode !== null) return;
  try {
    process.kill(-proc.pid, signal);
  } catch {
    // The group is already gone.
  }
}

/** Set, to the parent's pid, in the demo's own process when it runs itself again as a stand-in (runAsStandIn). */
const STAND_IN_SESSION = "KV_EPP_DEMO_STAND_IN";

/**
 * This process stands in for the users' machines (the demo's client builds and sends every request), as the
 * workers and the gateway stand in for theirs: where the kernel shares the CPU between sessions first (autogroup),
 * it runs itself again in a session of its own at `nice`, passing its output through, its signals on and its exit
 * code back (`undefined`: this already is that process, or there is no such scheduling: go on here). The EPPs it
 * starts are sessions of their own at nice 0 either way. A session cannot lower itself without lowering the
 * terminal's session with it, nor a process its own nice without its children inheriting it: hence a new process.
 * In that process, `onOrphaned` is called if the process that ran it goes (killed outright, its signals never
 * passed on), to stop what it started.
 */
export async function runAsStandIn(nice: number, onOrphaned: () => void = () => {}): Promise<number | undefined> {
  const parent = process.env[STAND_IN_SESSION];
  if (parent !== undefined) {
    // Not for the processes this one starts.
    delete process.env[STAND_IN_SESSION];
    setInterval(() => process.ppid !== Number(parent) && onOrphaned(), 1000).unref();
    return undefined;
  }
  if (nice <= 0 || !autogroupScheduling()) return undefined;
  const child = spawn(process.execPath, [...process.execArgv, ...process.argv.slice(1)], {
    detached: true, stdio: "inherit", env: { ...process.env, [STAND_IN_SESSION]: String(process.pid) },
  });
  if (child.pid !== undefined) lowerSessionPriority(child.pid, nice);
  for (const sig of ["SIGINT", "SIGTERM", "SIGHUP"] as const) process.on(sig, () => child.kill(sig));
  return new Promise((resolve) => {
    child.on("error", (err) => {
      console.error(`demo: could not run the client in a session of its own (${err.message})`);
      resolve(1);
    });
    child.on("exit", (code, signal) => resolve(code ?? 128 + (signal ? constants.signals[signal] : 0)));
  });
}

/** Whether the kernel schedules sessions as groups (Linux autogroup). */
export function autogroupScheduling(): boolean {
  try {
    return readFileSync("/proc/sys/kernel/sched_autogroup_enabled", "utf8").trim() === "1";
  } catch {
    return false;
  }
}

/**
 * Each child is a session of its own (`detached`), and where the kernel groups scheduling by session (Linux
 * autogroup, /proc/sys/kernel/sched_autogroup_enabled) the CPU is shared between sessions before threads' nice
 * values count, so `nice` alone would not lower a child against the EPPs: its session's nice is lowered too.
 */
function lowerSessionPriority(pid: number, nice: number): void {
  try {
    writeFileSync(`/proc/${pid}/autogroup`, String(nice));
  } catch {
    // No autogroup scheduling here (or not Linux): the threads' nice value is what counts.
  }
}
