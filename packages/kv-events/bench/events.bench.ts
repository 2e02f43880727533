// bun run bench:events — messages and block events per second through PUB → SUB → decode on
// loopback, batches of 16 blocks (one BlockStored, 256 tokens, int hashes, vLLM-today encoding: array batch, map events):
//   ours:    our PubSocket (Bun child) → KvEventListener (this Bun process: ZMTP + decode + seq)
//   libzmq:  zeromq XPUB (Node child) → zeromq SUB + msgpackr decode (Node child)
//   mixed:   zeromq XPUB (Node child) → KvEventListener (this Bun process)
// Each publisher paces on back-pressure so nothing is dropped; the clock runs from the end of a
// warm-up to the last message. Prints a table and writes bench/report.md.
import { type ChildProcess, spawn } from "node:child_process";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { tempDir } from "@kv-epp/testkit";
import { KvEventListener } from "../src/index.ts";
import { BLOCKS_PER_BATCH, makePayloads, writePayloadFile } from "./payloads.ts";

const PKG = join(import.meta.dir, "..");
const WARM = 20_000;
const TOTAL = Number(process.env.BENCH_MESSAGES ?? 200_000);
const file = join(tempDir("kv-events-bench-"), "payloads.bin");
const payloads = makePayloads(64);
writePayloadFile(file, payloads);
const avgPayload = payloads.reduce((a, p) => a + p.length, 0) / payloads.length;

const children = new Set<ChildProcess>();
process.on("exit", () => {
  for (const c of children) c.kill("SIGKILL");
});

function child(cmd: string, args: string[]): { proc: ChildProcess; lines: AsyncGenerator<Record<string, unknown>> } {
  const proc = spawn(cmd, args, { cwd: PKG, stdio: ["ignore", "pipe", "inherit"] });
  children.add(proc);
  proc.on("exit", () => children.delete(proc));
  async function* lines() {
    let buf = "";
    for await (const d of proc.stdout!) {
      buf += d.toString();
      let i: number;
      while ((i = buf.indexOf("\n")) >= 0) {
        yield JSON.parse(buf.slice(0, i)) as Record<string, unknown>;
        buf = buf.slice(i + 1);
      }
    }
  }
  return { proc, lines: lines() };
}

/** cpuMs: CPU time (user+sys) of the subscribing process over the measured window. */
type Result = { name: string; ms: number; cpuMs: number; messages: number; blocks: number; gaps: number };

async function ourListener(name: string, pubCmd: string, pubArgs: string[]): Promise<Result> {
  const pub = child(pubCmd, pubArgs);
  const { endpoint } = (await pub.lines.next()).value as { endpoint: string };
  const l = new KvEventListener({ workerId: "bench", dpRank: 0, endpoint, topic: "kv" });
  let n = 0, blocks = 0, t0 = 0, t1 = 0;
  let c0 = process.cpuUsage(), c1 = c0;
  const done = Promise.withResolvers<void>();
  l.attach((s) => {
    if (s.kind !== "batch") return;
    n++;
    if (n === WARM) {
      t0 = performance.now();
      c0 = process.cpuUsage();
    } else if (n > WARM) {
      for (const e of s.batch.events) if (e.type === "BlockStored") blocks += e.blockHashes.length;
      if (n === WARM + TOTAL) {
        t1 = performance.now();
        c1 = process.cpuUsage(c0);
        done.resolve();
      }
    }
  });
  l.start();
  await done.promise;
  const r = { name, ms: t1 - t0, cpuMs: (c1.user + c1.system) / 1000, messages: TOTAL, blocks, gaps: l.counters.gaps + l.counters.decodeErrors };
  await l.close();
  pub.proc.kill();
  return r;
}

async function libzmq(): Promise<Result> {
  const pub = child("node", [join(PKG, "bench/zmq-pub.cjs"), file, String(WARM + TOTAL)]);
  const { endpoint } = (await pub.lines.next()).value as { endpoint: string };
  const sub = child("node", [join(PKG, "bench/zmq-sub.cjs"), endpoint, String(WARM), String(TOTAL)]);
  const r = (await sub.lines.next()).value as Omit<Result, "name">;
  pub.proc.kill();
  return { name: "libzmq PUB → libzmq SUB + msgpackr (Node)", ...r };
}

const results: Result[] = [];
results.push(await ourListener("ours PUB → ours SUB + decode (Bun)", "bun", [join(PKG, "bench/our-pub.ts"), file, String(WARM + TOTAL)]));
results.push(await libzmq());
results.push(await ourListener("libzmq PUB → ours SUB + decode (Bun)", "node", [join(PKG, "bench/zmq-pub.cjs"), file, String(WARM + TOTAL)]));

const fmt = (x: number) => Math.round(x).toLocaleString("en");
const rows = results.map((r) => {
  const s = r.ms / 1000;
  return `| ${r.name} | ${fmt(r.messages / s)} | ${fmt(r.blocks / s)} | ${fmt(r.blocks / (r.cpuMs / 1000))} | ${r.gaps} |`;
});
const report = [
  "# bench:events",
  "",
  `${TOTAL.toLocaleString("en")} messages after ${WARM.toLocaleString("en")} warm-up, ${BLOCKS_PER_BATCH} blocks per batch, ` +
    `payload ~${Math.round(avgPayload)} B, loopback TCP, ${new Date().toISOString()}.`,
  "Target: >= 2,000,000 block events/s decoded and delivered, and at least libzmq + msgpackr in Node.",
  "",
  "Per CPU-second = block events over the subscribing process's CPU time (user+sys): the capacity of one",
  "core, which matters on a shared machine where wall-clock rates follow the load.",
  "",
  "| path | messages/s | block events/s | block events per sub CPU-second | gaps+errors |",
  "|---|---|---|---|---|",
  ...rows,
  "",
].join("\n");
console.log(report);
writeFileSync(join(PKG, "bench/report.md"), report);
process.exit(0);
