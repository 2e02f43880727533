// The load generators shared by bench:epp and bench:hostile: bench/loadgen.c (C, libnghttp2, built
// here with `cc`) standing in for Envoy, or bench/loadgen.ts where that does not build.
import { readdirSync, readFileSync } from "node:fs";
import { spawnProcess, type ProcessHandle } from "@kv-epp/testkit";
import { requestsFile, type Mode } from "./requests.ts";
import { eppRuntimeEnv } from "../src/runtime-env.ts";

export type Run = {
  rate: number;
  sent: number;
  completed: number;
  achieved: number;
  p50: number;
  p90: number;
  p99: number;
  max: number;
  errors: number;
  endpoints: number;
  /** Server process CPU time per request sent (robust to a busy machine); NaN without /proc. */
  cpuUs: number;
};

/** utime + stime of a process in µs, from /proc (clock ticks of 10 ms); NaN where there is no /proc. */
export function cpuTimeUs(pid: number): number {
  try {
    const fields = readFileSync(`/proc/${pid}/stat`, "utf8").split(") ")[1]!.split(" ");
    return (Number(fields[11]) + Number(fields[12])) * 10_000;
  } catch {
    return NaN;
  }
}

/**
 * A process's CPU time per kind of thread (µs), from each /proc/<pid>/task/<tid>/stat: its threads grouped by name
 * (Bun names the main thread after the executable, a worker thread "Worker", JavaScriptCore's compiler threads
 * "JITWorker", its collector's "HeapHelper", mimalloc's purger "mi-scavenger").
 */
export function cpuByThreadUs(pid: number): Map<string, number> {
  const out = new Map<string, number>();
  let tasks: string[] = [];
  try {
    tasks = readdirSync(`/proc/${pid}/task`);
  } catch {
    return out;
  }
  for (const t of tasks) {
    try {
      const stat = readFileSync(`/proc/${pid}/task/${t}/stat`, "utf8");
      const name = t === String(pid) ? "main" : stat.slice(stat.indexOf("(") + 1, stat.lastIndexOf(")"));
      const fields = stat.slice(stat.lastIndexOf(") ") + 2).split(" ");
      out.set(name, (out.get(name) ?? 0) + (Number(fields[11]) + Number(fields[12])) * 10_000);
    } catch {
      // the thread ended meanwhile
    }
  }
  return out;
}

/** CPU ms per request by kind of thread (cpuByThreadUs), largest first: "main 1.16, Worker 1.25, ...". */
export function threadsText(threads: Iterable<[string, number]>): string {
  return [...threads].sort((a, b) => b[1] - a[1]).map(([name, ms]) => `${name} ${ms.toFixed(2)}`).join(", ");
}

/**
 * An EPP process for a bench (src/main.ts, as deployed: its runtime environment too) on `host`, no scraping, once its
 * servers listen. Its ports are the ones it bound itself (port 0, read back from its "servers listening" line): a port
 * found free and bound later can be taken in between, on a loopback address that clients' ephemeral ports share.
 */
export async function spawnBenchEpp(name: string, host: string, config: string, extra: string[] = []): Promise<{
  proc: ProcessHandle; ports: { grpc: number; metrics: number; selection: number };
}> {
  const proc = spawnProcess(process.execPath, [`${import.meta.dir}/../src/main.ts`, "--config", config, "--listen", host,
    "--grpc-port", "0", "--grpc-health-port", "0", "--metrics-port", "0", "--replica-agg-port", "0",
    "--selection-port", "0", "--scrape-interval-ms", "0", "--subscribe-wait-ms", "0", ...extra], { name, env: eppRuntimeEnv() });
  const listening = JSON.parse(await proc.waitForLog(/"msg":"servers listening"/, { timeoutMs: 60_000 })) as { grpc: number; metrics: number; selection: number };
  return { proc, ports: { grpc: listening.grpc, metrics: listening.metrics, selection: listening.selection } };
}

/** `tls`: the generator opens TLS (ALPN h2, unverified, as gateways do); else h2c. */
export type Server = { name: string; target: string; proc: ProcessHandle; tls: boolean };

export type Generator = { name: string; argv(target: string, rate: number, mode: Mode): string[] };

/** The C generator when it builds here (a C compiler and libnghttp2's headers), else the JS one. */
export async function loadGenerator(dir: string, durationMs: number, warmupMs: number): Promise<Generator> {
  const common = (target: string, rate: number, mode: Mode) => [
    "--target", target, "--rate", String(rate), "--duration-ms", String(durationMs), "--warmup-ms", String(warmupMs), "--mode", mode,
  ];
  const js: Generator = {
    name: "JS (bench/loadgen.ts on node:http2)",
    argv: (target, rate, mode) => [process.execPath, `${import.meta.dir}/loadgen.ts`, ...common(target, rate, mode)],
  };
  if (Bun.env.EPP_BENCH_GENERATOR === "js") return js;
  const built = buildCLoadgen(dir);
  if (typeof built === "string") {
    for (const mode of ["full-duplex", "buffered"] as const) await Bun.write(`${dir}/requests-${mode}.bin`, requestsFile(mode, 7));
    return {
      name: C_GENERATOR,
      argv: (target, rate, mode) => [built, ...common(target, rate, mode), "--requests", `${dir}/requests-${mode}.bin`],
    };
  }
  console.log(`bench/loadgen.c did not build (${built.why}); measuring with the JS generator, which adds its own ~0.5-1 ms to p99 (Debian: apt-get install gcc libnghttp2-dev libssl-dev)`);
  return js;
}

export const C_GENERATOR = "C (bench/loadgen.c on libnghttp2)";

/** bench/loadgen.c compiled into `dir`: the binary's path, or why it did not build. */
export function buildCLoadgen(dir: string): string | { why: string } {
  const bin = `${dir}/loadgen-c`;
  try {
    const cc = Bun.spawnSync(["cc", "-O2", "-o", bin, `${import.meta.dir}/loadgen.c`, "-lnghttp2", "-lssl", "-lcrypto"], { stderr: "pipe" });
    return cc.exitCode === 0 ? bin : { why: cc.stderr.toString().trim().split("\n")[0] ?? "" };
  } catch (err) {
    return { why: String(err) };
  }
}

/** One open-loop run of `gen` against `server` at `rate`, with the server process's CPU per request. */
export async function runLoad(gen: Generator, server: Server, rate: number, mode: Mode, durationMs: number, warmupMs: number): Promise<Run> {
  const cpu0 = cpuTimeUs(server.proc.pid);
  const r = await generate([...gen.argv(server.target, rate, mode), ...(server.tls ? ["--tls"] : [])]);
  // Includes the warm-up requests: cpu over every request sent, not only the measured ones.
  r.cpuUs = (cpuTimeUs(server.proc.pid) - cpu0) / Math.max(1, Math.round((rate * (durationMs + warmupMs)) / 1000));
  return r;
}

/** One generator process (argv as loadGenerator's): its run's figures, without the server's CPU (NaN). */
export async function generate(argv: string[]): Promise<Run> {
  const p = Bun.spawn(argv, { stdout: "pipe", stderr: "inherit" });
  const out = await new Response(p.stdout).text();
  await p.exited;
  const r = JSON.parse(out.trim().split("\n").at(-1)!) as Run;
  // A run that got no answer at all has no percentiles (NaN, null in JSON).
  for (const k of ["p50", "p90", "p99", "max"] as const) r[k] ??= NaN;
  r.cpuUs = NaN;
  return r;
}
