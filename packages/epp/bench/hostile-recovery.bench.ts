// bun run bench:hostile-recovery — the memory of a recovering EPP process while its only peer serves an
// endless valid dump or an endless stream of model keys (testkit's hostile peers), and whether it becomes
// ready and honours SIGTERM. The EPP is a child process (`bun <main.ts>`, as deployed); RSS is read from
// its /proc/<pid>/status every 100 ms. The recovery budget is what a 2 GiB container derives (1 GiB, given
// as DYN_EPP_RECOVERY_BUDGET_MIB so that a build without the flag simply ignores it; `--budget-mib N` another).
//
// `--epp PATH` runs another build's main.ts (e.g. a worktree of an older commit) for a before/after in one
// run. A child above HARD_CAP_BYTES is killed (the machine is shared); the figures then read "> cap".
import { writeFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { hostileDumpPeer, processMemory, spawnProcess, tempDir, type HostileDump } from "@kv-epp/testkit";
import { stringify } from "yaml";
import { eppRuntimeEnv } from "../src/runtime-env.ts";

const HOST = "127.0.5.200";
const PEER_HOST = "127.0.5.201";
const MiB = 1024 * 1024;
const HARD_CAP_BYTES = 3 * 1024 * MiB;
const arg = (name: string) => {
  const i = process.argv.indexOf(name);
  return i >= 0 ? process.argv[i + 1] : undefined;
};
const eppMain = resolve(arg("--epp") ?? `${import.meta.dir}/../src/main.ts`);
const SECONDS = Number(arg("--seconds") ?? 30);
const BUDGET_MIB = arg("--budget-mib") ?? "1024";

type Result = { scenario: string; peakMiB: string; state: string; readyAfterS: string; sigtermExit: string; sigtermMs: string };

async function run(scenario: string, dump: HostileDump): Promise<Result> {
  const peer = hostileDumpPeer(dump, { hostname: PEER_HOST });
  const dir = tempDir("hostile-bench-");
  const config = join(dir, "epp.yaml");
  writeFileSync(config, stringify({ model: "test-model", blockSize: 16, workers: [], peers: [peer.url] }));
  const started = performance.now();
  const epp = spawnProcess(process.execPath, [eppMain, "--config", config, "--listen", HOST, "--replica-agg", "false", "--scrape-interval-ms", "0"], {
    name: `epp ${scenario}`,
    env: { ...eppRuntimeEnv(), DYN_EPP_RECOVERY_BUDGET_MIB: BUDGET_MIB, DYN_EPP_LOG_LEVEL: "info" },
  });
  let peak = 0;
  let capped = false;
  let readyAt: number | undefined;
  const deadline = started + SECONDS * 1000;
  while (epp.running && performance.now() < deadline) {
    const m = processMemory(epp.pid);
    if (m) peak = Math.max(peak, m.peak, m.rss);
    if (peak > HARD_CAP_BYTES) {
      capped = true;
      break;
    }
    if (readyAt === undefined && epp.lines.some((l) => l.includes("ready with an EMPTY KV index") || l.includes('"msg":"recovered"'))) readyAt = performance.now();
    if (readyAt !== undefined && performance.now() - readyAt > 1000) break; // ready and settled
    await Bun.sleep(100);
  }
  let sigtermExit = "-";
  let sigtermMs = "-";
  if (capped) {
    await epp.kill("SIGKILL", 0);
    sigtermExit = "killed at cap";
  } else if (epp.running) {
    const t = performance.now();
    process.kill(epp.pid, "SIGTERM");
    const code = await Promise.race([epp.exited, Bun.sleep(10_000).then(() => "no exit in 10 s")]);
    sigtermMs = (performance.now() - t).toFixed(0);
    sigtermExit = String(code);
    if (epp.running) await epp.kill("SIGKILL", 0);
  } else sigtermExit = `exited on its own: ${await epp.exited}`;
  if (process.env.HOSTILE_BENCH_VERBOSE)
    for (const l of epp.lines) if (/attempt failed|set aside|EMPTY|recovery limits/.test(l)) console.error(`[${scenario}] ${l}`);
  peer.stop();
  const state = epp.lines.find((l) => l.includes("ready with an EMPTY KV index"))?.match(/"reason":"(\w+)"/)?.[1];
  return {
    scenario,
    peakMiB: capped ? `> ${HARD_CAP_BYTES / MiB}` : (peak / MiB).toFixed(0),
    state: readyAt === undefined ? `not ready after ${SECONDS} s` : `ready (empty_bootstrap${state ? `, ${state}` : ""})`,
    readyAfterS: readyAt === undefined ? "-" : ((readyAt - started) / 1000).toFixed(1),
    sigtermExit,
    sigtermMs,
  };
}

const results = [
  await run("endless valid dump", { kind: "endless-events", model: "test-model:default", blockSize: 16 }),
  await run("endless model keys", { kind: "endless-models", blockSize: 16 }),
];
console.log(`EPP: ${eppMain}, DYN_EPP_RECOVERY_BUDGET_MIB=${BUDGET_MIB}`);
console.log("| peer | peak RSS (MiB) | outcome | ready after (s) | SIGTERM exit | SIGTERM to exit (ms) |");
console.log("|---|---|---|---|---|---|");
for (const r of results) console.log(`| ${r.scenario} | ${r.peakMiB} | ${r.state} | ${r.readyAfterS} | ${r.sigtermExit} | ${r.sigtermMs} |`);
