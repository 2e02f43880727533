// Child processes for process-level tests: log capture, waiting for a log line, and cleanup that
// cannot be forgotten. Each child leads its own process group so that killing it also ends what it
// started (`bun run x` runs the script in a grandchild).
import { spawn, type ChildProcess } from "node:child_process";

export type SpawnOptions = {
  env?: Record<string, string | undefined>; // added to (and overriding) the inherited environment
  /**
   * What the child inherits of this process's environment before `env`: all of it (default), or only
   * the named variables (a container sees only what its manifest sets, not what an earlier test in
   * the same runner left in `process.env`).
   */
  inheritEnv?: true | readonly string[];
  name?: string; // prefix for echoed lines and error messages
  cwd?: string;
  /** Echo every line to stderr (default: when TESTKIT_ECHO is set). */
  echo?: boolean;
  /** Lines kept in memory (oldest dropped first), default 50 000. */
  maxLines?: number;
};

export type ProcessHandle = {
  readonly name: string;
  readonly pid: number;
  /** stdout and stderr lines, interleaved in arrival order. */
  readonly lines: readonly string[];
  output(): string;
  /**
   * Resolves with the first line (at index >= `fromLine`, default 0) matching `re`; rejects on
   * timeout (default 15 s) or when the process exits first.
   */
  waitForLog(re: RegExp, opts?: { timeoutMs?: number; fromLine?: number }): Promise<string>;
  /** Exit code, or the signal name when killed by one. */
  readonly exited: Promise<number | string>;
  readonly running: boolean;
  /** SIGTERM (or `signal`), then SIGKILL after `graceMs` (default 5000); resolves once exited. */
  kill(signal?: NodeJS.Signals, graceMs?: number): Promise<void>;
};

const live = new Set<ChildProcess & { pid: number }>();
const handles = new Set<ProcessHandle>();

function killGroup(pid: number, signal: NodeJS.Signals): void {
  try {
    process.kill(-pid, signal);
  } catch {
    try {
      process.kill(pid, signal);
    } catch {
      // already gone
    }
  }
}

/** Kills (SIGKILL, process groups) every child still running: the safety net at a run's end. */
export function killLeftovers(): void {
  for (const child of live) killGroup(child.pid, "SIGKILL");
}

// A script that exits (or crashes) must not leave children behind (`bun test` has its own hook: test-cleanup.ts).
process.on("exit", killLeftovers);

function inherited(which: true | readonly string[]): Record<string, string | undefined> {
  if (which === true) return process.env;
  return Object.fromEntries(which.filter((k) => process.env[k] !== undefined).map((k) => [k, process.env[k]]));
}

export function spawnProcess(cmd: string, args: string[], opts: SpawnOptions = {}): ProcessHandle {
  const name = opts.name ?? `${cmd.split("/").pop()} ${args[0] ?? ""}`.trim();
  const echo = opts.echo ?? Boolean(process.env.TESTKIT_ECHO);
  const maxLines = opts.maxLines ?? 50_000;
  const child = spawn(cmd, args, {
    cwd: opts.cwd,
    env: { ...inherited(opts.inheritEnv ?? true), ...opts.env },
    stdio: ["ignore", "pipe", "pipe"],
    detached: true,
  });
  if (child.pid === undefined) throw new Error(`spawn ${name} failed`);
  const tracked = child as ChildProcess & { pid: number };
  live.add(tracked);

  const lines: string[] = [];
  let dropped = 0;
  const listeners = new Set<() => void>();
  let running = true;
  let exitResult: number | string = -1;

  const onChunks = (stream: NodeJS.ReadableStream) => {
    let partial = "";
    stream.setEncoding("utf8");
    stream.on("data", (chunk: string) => {
      const parts = (partial + chunk).split("\n");
      partial = parts.pop() ?? "";
      for (const line of parts) push(line);
    });
    stream.on("end", () => {
      if (partial) push(partial);
      partial = "";
    });
  };
  const push = (line: string) => {
    lines.push(line);
    if (lines.length > maxLines) {
      lines.shift();
      dropped++;
    }
    if (echo) process.stderr.write(`[${name}] ${line}\n`);
    for (const l of [...listeners]) l();
  };
  onChunks(child.stdout!);
  onChunks(child.stderr!);

  const exited = new Promise<number | string>((resolve) => {
    child.on("exit", (code, signal) => {
      running = false;
      live.delete(tracked);
      exitResult = code ?? signal ?? -1;
      // Let the pipes drain their last lines before waiters are told.
      setTimeout(() => {
        for (const l of [...listeners]) l();
        resolve(exitResult);
      }, 20);
    });
  });

  const handle: ProcessHandle = {
    name,
    pid: child.pid,
    lines,
    output: () => lines.join("\n"),
    get running() {
      return running;
    },
    exited,
    waitForLog(re, o = {}) {
      const timeoutMs = o.timeoutMs ?? 15_000;
      let next = Math.max(0, (o.fromLine ?? 0) - dropped);
      return new Promise((resolve, reject) => {
        const finish = (fn: () => void) => {
          listeners.delete(check);
          clearTimeout(timer);
          fn();
        };
        const check = () => {
          for (; next < lines.length; next++) {
            const line = lines[next]!;
            if (re.test(line)) return finish(() => resolve(line));
          }
          if (!running) {
            const tail = lines.slice(-20).join("\n");
            finish(() => reject(new Error(`${name} exited (${exitResult}) before logging ${re}; last lines:\n${tail}`)));
          }
        };
        const timer = setTimeout(() => {
          const tail = lines.slice(-20).join("\n");
          finish(() => reject(new Error(`${name}: no line matching ${re} within ${timeoutMs} ms; last lines:\n${tail}`)));
        }, timeoutMs);
        listeners.add(check);
        check();
      });
    },
    async kill(signal = "SIGTERM", graceMs = 5000) {
      if (!running) return;
      killGroup(child.pid!, signal);
      const timer = setTimeout(() => killGroup(child.pid!, "SIGKILL"), graceMs);
      await exited;
      clearTimeout(timer);
      // The group may still hold grandchildren that ignored the signal.
      killGroup(child.pid!, "SIGKILL");
    },
  };
  handles.add(handle);
  void exited.then(() => handles.delete(handle));
  return handle;
}

/** Runs `bun <args>` (this very Bun binary), e.g. `spawnBun(["run", "epp", "--listen", ip], env)`. */
export function spawnBun(args: string[], env?: Record<string, string | undefined>, opts: Omit<SpawnOptions, "env"> = {}): ProcessHandle {
  return spawnProcess(process.execPath, args, { ...opts, env });
}

/** Kills every process spawned through this module that is still running (SIGKILL after `graceMs`). */
export async function killAll(signal: NodeJS.Signals = "SIGTERM", graceMs = 3000): Promise<void> {
  await Promise.all([...handles].map((h) => h.kill(signal, graceMs)));
}
