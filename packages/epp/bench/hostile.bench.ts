// bun run bench:hostile [--baseline <git rev>] [--rate 200] [--duration-ms 3000] [--repeat 3] [--only <attack name part>] — good requests' latency while each attack of
// test/hostile-peers.ts runs beside them. Per attack a fresh EPP process (bun src/main.ts, static
// mode, 4 workers, h2c so that a baseline from before TLS-by-default runs the same way) gets
// full-duplex 8k-token requests from the load generator (bench/generator.ts) at --rate/s for
// --duration-ms while the attack loops in this process; printed: p50/p99/max, errors, whether the
// EPP was still up, and its peak RSS (VmHWM). With --baseline the same runs go first against that
// revision, checked out beside this one ($TMPDIR/epp-hostile-baseline-<rev>: a detached git worktree
// sharing these node_modules, its WebAssembly built there, kept for the next run), so both sets of
// figures come from the same run on the same machine.
import { existsSync, lstatSync, mkdirSync, readdirSync, readlinkSync, realpathSync, symlinkSync } from "node:fs";
import { join } from "node:path";
import { freePort, killAll, spawnProcess, tempDir, type ProcessHandle } from "@kv-epp/testkit";
import { ATTACKS, rssMiB, type Attack, type Target } from "../test/hostile-peers.ts";
import { loadGenerator, runLoad, type Generator, type Run } from "./generator.ts";

const HOST = "127.0.4.210";
const arg = (name: string, def: string) => {
  const i = Bun.argv.indexOf(`--${name}`);
  return i > 0 ? Bun.argv[i + 1]! : def;
};
const RATE = Number(arg("rate", "200"));
const DURATION_MS = Number(arg("duration-ms", "3000"));
const WARMUP_MS = 500;
const BASELINE = arg("baseline", "");
const REPEAT = Number(arg("repeat", "3"));
/** Only the attacks whose name contains this (the no-attack run always goes first). */
const ONLY = arg("only", "");
const ROOT = realpathSync(`${import.meta.dir}/../../..`);
const NONE: Attack = { name: "none (good requests alone)", start: () => ({ stop: async () => 0 }) };

type Result = { version: string; attack: string; run?: Run; sent: number; up: boolean; peakMiB: number };

/**
 * A checkout of `rev` beside this one that runs without an install: third-party packages link to
 * this checkout's, workspace packages (@kv-epp/*) to the checkout's own.
 */
function checkout(rev: string, dir: string): string {
  // Kept between runs (its WebAssembly takes a while to build); `git worktree remove` drops it.
  if (existsSync(join(dir, "packages/index-wasm/build/index.wasm"))) return dir;
  const git = (...a: string[]) => {
    const r = Bun.spawnSync(["git", "-C", ROOT, ...a], { stderr: "pipe" });
    if (r.exitCode !== 0) throw new Error(`git ${a.join(" ")}: ${r.stderr.toString()}`);
  };
  git("worktree", "add", "--detach", dir, rev);
  symlinkSync(join(ROOT, "node_modules"), join(dir, "node_modules"));
  for (const pkg of readdirSync(join(dir, "packages"))) {
    const ours = join(ROOT, "packages", pkg, "node_modules");
    let entries: string[];
    try {
      entries = readdirSync(ours);
    } catch {
      continue;
    }
    const theirs = join(dir, "packages", pkg, "node_modules");
    mkdirSync(theirs);
    for (const e of entries) {
      const from = join(ours, e);
      if (e === "@kv-epp") {
        mkdirSync(join(theirs, e));
        // Relative links (../../../<pkg>): the same text resolves inside the other checkout.
        for (const w of readdirSync(from)) symlinkSync(readlinkSync(join(from, w)), join(theirs, e, w));
      } else if (e.startsWith("@") && lstatSync(from).isDirectory()) {
        mkdirSync(join(theirs, e));
        for (const w of readdirSync(from)) symlinkSync(realpathSync(join(from, w)), join(theirs, e, w));
      } else symlinkSync(realpathSync(from), join(theirs, e));
    }
  }
  const build = Bun.spawnSync([process.execPath, "packages/index-wasm/scripts/build.ts"], { cwd: dir, stdout: "inherit", stderr: "inherit" });
  if (build.exitCode !== 0) throw new Error("the baseline's WebAssembly did not build");
  return dir;
}

async function startEpp(root: string, dir: string, name: string): Promise<{ proc: ProcessHandle; target: Target }> {
  // Ports found free here, not bound by the EPP and read back as the other benches do: this one also runs an older
  // release (its baseline) at --log-level warn, so no "servers listening" line tells them, and the attack publishes
  // on the KV endpoint before the EPP subscribes.
  const [grpc, grpcHealth, metrics, selection, replicaAgg, kv] = await Promise.all(Array.from({ length: 6 }, () => freePort(HOST)));
  const target: Target = { host: HOST, grpc: grpc!, grpcHealth: grpcHealth!, metrics: metrics!, selection: selection!, replicaAgg: replicaAgg!, kvEvents: `tcp://${HOST}:${kv}`, tls: false };
  const config = join(dir, "epp.json");
  await Bun.write(
    config,
    JSON.stringify({
      model: "bench-model",
      blockSize: 16,
      workers: Array.from({ length: 4 }, (_, w) => ({
        id: `worker-${w}`,
        address: `127.0.4.${220 + w}:8000`,
        // worker-0's endpoint is where the malformed-KV attack publishes; nobody publishes on the others.
        kvEvents: w === 0 ? target.kvEvents : `tcp://127.0.4.${220 + w}:5557`,
      })),
    }),
  );
  const proc = spawnProcess(
    process.execPath,
    [
      join(root, "packages/epp/src/main.ts"), "--config", config, "--listen", HOST, "--secure-serving=false", "--log-level", "warn",
      "--grpc-port", String(grpc), "--grpc-health-port", String(grpcHealth), "--metrics-port", String(metrics), "--selection-port", String(selection),
      "--replica-agg-port", String(replicaAgg), "--scrape-interval-ms", "0", "--subscribe-wait-ms", "0",
    ],
    { name },
  );
  await proc.waitForLog(/ready with an EMPTY KV index|"recovered"/, { timeoutMs: 60_000 });
  return { proc, target };
}

async function measure(gen: Generator, root: string, dir: string, version: string, attack: Attack): Promise<Result> {
  const { proc, target } = await startEpp(root, dir, `epp (${version})`);
  const running = attack.start(target);
  let run: Run | undefined;
  try {
    run = await runLoad(gen, { name: version, target: `${HOST}:${target.grpc}`, proc, tls: false }, RATE, "full-duplex", DURATION_MS, WARMUP_MS);
  } catch {
    // No answer at all from the generator (it could not connect: the EPP was gone).
  }
  const sent = await running.stop();
  const up = proc.running;
  const peakMiB = up ? rssMiB(proc.pid).peak : NaN;
  await proc.kill("SIGKILL", 100);
  return { version, attack: attack.name, run, sent, up, peakMiB };
}

/** The run with the median p99 (a run without answers counts as the worst); any exit or RSS peak is kept. */
function median(rs: Result[]): Result {
  const p99 = (r: Result) => r.run?.p99 ?? Infinity;
  const m = [...rs].sort((a, b) => p99(a) - p99(b))[Math.floor(rs.length / 2)]!;
  return { ...m, up: rs.every((r) => r.up), peakMiB: Math.max(...rs.map((r) => r.peakMiB)) };
}

function show(r: Result): string {
  const f = (v: number | undefined) => (v === undefined || Number.isNaN(v) ? "-" : v.toFixed(2));
  const run = r.run;
  const answered = run ? `${run.completed}/${run.sent}` : "0";
  return `| ${r.version} | ${r.attack} | ${f(run?.p50)} | ${f(run?.p99)} | ${f(run?.max)} | ${answered} | ${run?.errors ?? "-"} | ${r.sent} | ${r.up ? "up" : "**exited**"} | ${f(r.peakMiB)} |`;
}

async function main() {
  const dir = tempDir("epp-hostile-");
  const gen = await loadGenerator(dir, DURATION_MS, WARMUP_MS);
  console.log(`bench:hostile — ${RATE}/s good requests for ${DURATION_MS} ms beside each attack; generator: ${gen.name}`);
  const versions: [string, string][] = [];
  if (BASELINE) versions.push([`baseline ${BASELINE}`, checkout(BASELINE, `${Bun.env.TMPDIR ?? "/tmp"}/epp-hostile-baseline-${BASELINE}`)]);
  versions.push(["this checkout", ROOT]);
  console.log(`${REPEAT} run(s) of each, versions interleaved; the row is the run with the median p99`);
  console.log("| EPP | attack | p50 ms | p99 ms | max ms | answered | errors | attack msgs | EPP after | peak RSS MiB |");
  console.log("|---|---|---|---|---|---|---|---|---|---|");
  for (const attack of [NONE, ...ATTACKS.filter((a) => a.name.includes(ONLY))]) {
    const runs = new Map(versions.map(([v]) => [v, [] as Result[]]));
    for (let k = 0; k < REPEAT; k++) for (const [version, root] of versions) runs.get(version)!.push(await measure(gen, root, dir, version, attack));
    for (const [, rs] of runs) console.log(show(median(rs)));
  }
  await killAll();
}

await main();
