// `bun run bench:recovery`: a 1M-residency index (64 workers x 16k blocks) recovered over loopback, sender
// and receiver in separate processes; the binary and JSON bodies, the TypeScript JSON writer ("before") and a
// buffered-whole-body baseline, in the same run, several
// rounds (RECOVERY_BENCH_ROUNDS, default 5), medians. Then, in the same run, a 10M-residency index (64 workers
// x 160k blocks), the product path and the pipeline alone (RECOVERY_BENCH_ROUNDS_10M, default 3; 0 skips it).
// Prints figures and writes bench/REPORT.md. Targets: 1M <= 1 s end to end, <= 32 MiB peak RSS above the
// index size on either side; 10M <= 5 s and <= 64 MiB.
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { MiB } from "./fixture.ts";

const here = import.meta.dir;
const HOST = "127.0.3.200";
const ROUNDS = Math.max(1, Number(process.env.RECOVERY_BENCH_ROUNDS) || 5);
const ROUNDS_10M = process.env.RECOVERY_BENCH_ROUNDS_10M === undefined ? 3 : Math.max(0, Number(process.env.RECOVERY_BENCH_ROUNDS_10M) || 0);
type Mode = "binary" | "binary-grow" | "binary-discard" | "discard" | "streamed" | "before" | "buffered";
type BenchSet = { title: string; blocksPerWorker: number; modes: Mode[]; rounds: number; targetMs: number; targetMiB: number; tsWriter: boolean };
const SETS: BenchSet[] = [
  { title: "1M residencies", blocksPerWorker: 16_384, modes: ["binary", "binary-grow", "binary-discard", "discard", "streamed", "before", "buffered"], rounds: ROUNDS, targetMs: 1000, targetMiB: 32, tsWriter: true },
  ...(ROUNDS_10M > 0 ? [{ title: "10M residencies", blocksPerWorker: 163_840, modes: ["binary", "binary-grow", "binary-discard", "discard", "streamed"] as Mode[], rounds: ROUNDS_10M, targetMs: 5000, targetMiB: 64, tsWriter: false }] : []),
];

type Gen = { ms: number; cpuMs: number; bytes: number; chunks: number };
type SenderInfo = { url: string; residencies: number; blocks: number; indexBytes: number; rssBeforeIndex: number; rssWithIndex: number; buildMs: number; gen: { binary: Gen; json: Gen; ts: Gen | null } };
type ReceiverOut = { mode: string; ms: number; cpuMs: number; events: number; bytes: number; residencies: number; blocks: number; indexBytes: number; rss0: number; peakRss: number };
type Run = { recv: ReceiverOut; senderPeak: number; senderCpuMs: number };

async function firstLine(stream: ReadableStream<Uint8Array>): Promise<string> {
  const reader = stream.getReader();
  let text = "";
  while (!text.includes("\n")) {
    const r = await reader.read();
    if (r.done) break;
    text += new TextDecoder().decode(r.value);
  }
  reader.releaseLock();
  return text.split("\n")[0]!;
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[xs.length >> 1]!;
const load = () => (require("node:os") as typeof import("node:os")).loadavg()[0]!.toFixed(1);

const lines: string[] = [];
const say = (s: string) => {
  lines.push(s);
  console.log(s);
};
const mib = (b: number) => (b / MiB).toFixed(1);
say(`# recovery benchmark (${new Date().toISOString()})`);

/** One index size: a sender process holding it, receivers one per mode and round. */
async function runSet(set: BenchSet): Promise<boolean> {
  const sender = Bun.spawn(["bun", join(here, "sender.ts"), HOST, String(set.blocksPerWorker), set.tsWriter ? "all" : "json"], { stdout: "pipe", stderr: "inherit" });
  try {
    const info = JSON.parse(await firstLine(sender.stdout)) as SenderInfo;
    const loadStart = load();
    const runs = new Map<string, Run[]>(set.modes.map((m) => [m, []]));
    for (let round = 0; round < set.rounds; round++) {
      for (const mode of set.modes) {
        await fetch(`${info.url}/stats`); // resets the sender's peak and CPU counters
        const p = Bun.spawn(["bun", join(here, "receiver.ts"), mode, info.url], { stdout: "pipe", stderr: "inherit" });
        const out = await new Response(p.stdout).text();
        if ((await p.exited) !== 0) throw new Error(`receiver (${mode}) failed`);
        const recv = JSON.parse(out.trim().split("\n").at(-1)!) as ReceiverOut;
        const s = (await (await fetch(`${info.url}/stats`)).json()) as { peakRss: number; rss: number; cpuMs: number };
        runs.get(mode)!.push({ recv, senderPeak: s.peakRss, senderCpuMs: s.cpuMs });
      }
    }

    const rate = (g: Gen) =>
      `${mib(g.bytes)} MiB in ${g.ms.toFixed(0)} ms (CPU ${g.cpuMs.toFixed(0)} ms) = ${(g.bytes / MiB / (g.ms / 1000)).toFixed(0)} MiB/s, ${((info.residencies / g.ms) * 1000 / 1e6).toFixed(2)} M residencies/s`;
    say("");
    say(`## ${set.title}`);
    say("");
    say(`index: ${info.residencies.toLocaleString()} residencies, ${info.blocks.toLocaleString()} blocks, ${mib(info.indexBytes)} MiB of linear memory (built in ${info.buildMs.toFixed(0)} ms); ${set.rounds} rounds, load average ${loadStart} at start, ${load()} at end (2 cores)`);
    say(`dump generation, writer alone (median of ${set.tsWriter ? 5 : 2}): module binary ${rate(info.gen.binary)}; module JSON ${rate(info.gen.json)}${info.gen.ts ? `; TS writer ${rate(info.gen.ts)}` : ""}`);
    say("");
    say("| mode | end to end (ms), median | all rounds (ms) | receiver CPU (ms) | sender CPU (ms) | events | body (MiB) | residencies recovered | receiver peak RSS growth (MiB) | recovered index linear memory (MiB) | receiver peak above index (MiB), max | sender peak above its index (MiB), max |");
    say("|---|---|---|---|---|---|---|---|---|---|---|---|");
    let withinTargets = true;
    for (const mode of set.modes) {
      const rs = runs.get(mode)!;
      const last = rs.at(-1)!.recv;
      const growth = Math.max(...rs.map((r) => r.recv.peakRss - r.recv.rss0));
      const above = Math.max(...rs.map((r) => r.recv.peakRss - r.recv.rss0 - r.recv.indexBytes));
      // The sender's index is inside rssWithIndex; its generator state and socket buffers are the extra.
      const sendExtra = Math.max(...rs.map((r) => r.senderPeak - info.rssWithIndex));
      const e2e = median(rs.map((r) => r.recv.ms));
      if (mode === "binary") withinTargets = e2e <= set.targetMs && above <= set.targetMiB * MiB && sendExtra <= set.targetMiB * MiB;
      say(
        `| ${mode} | ${e2e.toFixed(0)} | ${rs.map((r) => r.recv.ms.toFixed(0)).join(", ")} | ${median(rs.map((r) => r.recv.cpuMs)).toFixed(0)} | ${median(rs.map((r) => r.senderCpuMs)).toFixed(0)} | ${last.events} | ${mib(last.bytes)} | ${last.residencies.toLocaleString()} | ${mib(growth)} | ${mib(last.indexBytes)} | ${mib(above)} | ${mib(sendExtra)} |`,
      );
    }
    say("");
    const ok = set.modes.filter((m) => !m.endsWith("discard")).every((m) => runs.get(m)!.every((r) => r.recv.residencies === info.residencies && r.recv.blocks === info.blocks));
    say(`every recovery reproduced the index: ${ok ? "yes" : "NO"} (${info.residencies} residencies, ${info.blocks} blocks); binary (the product path) within the targets (<= ${set.targetMs} ms, <= ${set.targetMiB} MiB above the index on either side): ${withinTargets ? "yes" : "NO"}`);
    return ok;
  } finally {
    sender.kill();
    await sender.exited;
  }
}

let allOk = true;
for (const set of SETS) allOk = (await runSet(set)) && allOk;
say("");
say("modes: binary = the product path: the binary body (module-written u64 event runs, framed), each run applied inside the module (KvIndex.applyDumpEvents) of a fresh KvIndex presized from the announced size; binary-grow = the same without presizing; binary-discard = binary fetch + parse applied into nothing; discard = JSON fetch + parse (typed batches), applied into nothing (the JSON pipeline alone); streamed = the JSON body, the product path before the binary one: module-written JSON, typed batches written into event runs, each applied inside the module of a fresh KvIndex; before = the same receiver, the sender's TS writer from RouterEvent objects instead of the module's JSON; buffered = baseline, whole body read first, then parsed and applied (typed).");
say("noisy on a shared 2-core machine: CPU time per side is the steadier figure; sender and receiver pipeline, so end to end is about the busier side when both cores are free.");
say("'above index' = receiver peak RSS growth minus the recovered index's linear memory (max over rounds). Linear memory is not always all resident, so this can come out below zero; the discard row is the recovery pipeline's own overhead with no index at all.");
say("receiver: end to end = GET /dump until the staging committed; CPU = the receiver process's user+system time over that span (includes Bun's GC/JIT threads). Sender CPU = the sender process between two /stats calls around the run.");
say("sender peak is sampled every 2 ms while serving; the baseline is the sender right after building its index and a full GC, before any dump ran (the generation passes and earlier rounds count against it; RSS rarely shrinks after a GC, so pages the build left can absorb the dump's: at or below zero means no growth past that point).");
writeFileSync(join(here, "REPORT.md"), lines.join("\n") + "\n");
if (!allOk) process.exitCode = 1;
