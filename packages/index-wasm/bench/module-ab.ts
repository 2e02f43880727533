// bun packages/index-wasm/bench/module-ab.ts <a.wasm> <b.wasm> ... — builds of the index module against
// each other in one process, on bench:index's ingestion workload (1M block events into an empty index,
// batches of 256 events pre-encoded in the builder's layout, so only the module is timed). Runs
// alternate between the builds; each is a fresh instance. On a shared machine only such same-process
// comparisons mean much: the figure to compare is the minimum thread CPU (this thread's user + system,
// so GC and JIT threads are left out). REPS=n runs per build (default 9); PRESIZE=1 presizes each index
// for the final size first (no rebuilds while it fills: the per-block work alone).
import { readFileSync } from "node:fs";
import { mulberry32 } from "@kv-epp/testkit";
import type { IndexExports } from "../src/wasm-module.ts";
import { sequences, storedBlocks } from "./workload.ts";

const paths = process.argv.slice(2);
if (paths.length === 0) throw new Error("usage: module-ab.ts <a.wasm> [<b.wasm> ...]");
const reps = Number(process.env.REPS ?? 9);
const presize = process.env.PRESIZE === "1";
const imports = { env: { abort(): never { throw new Error("index module aborted"); } } };
const modules = paths.map((p) => new WebAssembly.Module(readFileSync(p)));
const threadCpuMs = (): number => {
  const c = process.threadCpuUsage();
  return (c.user + c.system) / 1000;
};

// the ingestion section's events: 31,250 sequences of 32 blocks (16 from one of 256 prompts), one of 64 workers each
const seqs = sequences(31_250, 32, 16, 256, 1);
const pick = mulberry32(2);
const events = seqs.map((tok) => {
  const w = pick() % 64;
  return { w, ext: BigUint64Array.from(storedBlocks(tok, w), (b) => b.blockHash), tok };
});
const KIND_STORED_ROOT = 5n;
const batches: BigUint64Array[] = [];
for (let i = 0; i < events.length; i += 256) {
  const group = events.slice(i, i + 256);
  const words = new BigUint64Array(group.reduce((n, e) => n + 1 + 2 * e.ext.length, 0));
  let at = 0;
  for (const e of group) {
    words[at++] = KIND_STORED_ROOT | (BigInt(e.w) << 8n) | (BigInt(e.ext.length) << 32n);
    words.set(e.ext, at);
    words.set(e.tok, at + e.ext.length);
    at += 2 * e.ext.length;
  }
  batches.push(words);
}
const blockEvents = events.length * 32;
const longest = Math.max(...batches.map((b) => b.length));

function run(m: WebAssembly.Module): { wallMs: number; cpuMs: number; faults: number; live: number; linear: number } {
  Bun.gc(true); // the previous instance's memory goes now, not inside the timed part
  const ex = new WebAssembly.Instance(m, imports).exports as unknown as IndexExports;
  if (presize) ex.presize(510_000, 730_000);
  const p = ex.reserve(longest * 8);
  const f0 = process.resourceUsage().minorPageFault;
  const c0 = threadCpuMs();
  const t0 = performance.now();
  for (const b of batches) {
    new BigUint64Array(ex.memory.buffer, p, b.length).set(b);
    ex.applyBatch(p, b.length);
  }
  const wallMs = performance.now() - t0, cpuMs = threadCpuMs() - c0;
  const r = ex.residencies();
  return { wallMs, cpuMs, faults: process.resourceUsage().minorPageFault - f0, live: ex.bytesInUse() / r, linear: ex.memory.buffer.byteLength / r };
}

const runs = paths.map(() => [] as ReturnType<typeof run>[]);
for (let rep = 0; rep < reps; rep++) {
  for (let k = 0; k < modules.length; k++) {
    const i = (k + rep) % modules.length; // rotate the order so no build always runs first
    runs[i]!.push(run(modules[i]!));
  }
}
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[xs.length >> 1]!;
const fmt = (n: number) => n.toFixed(1);
console.log(`${fmt(blockEvents / 1e6)}M block events into ${presize ? "a presized" : "an empty"} index, ${reps} runs per build`);
paths.forEach((path, i) => {
  const rs = runs[i]!, cpu = rs.map((r) => r.cpuMs), wall = rs.map((r) => r.wallMs);
  console.log(`  ${path}: thread CPU min ${fmt(Math.min(...cpu))} ms, median ${fmt(median(cpu))} (${fmt(blockEvents / Math.min(...cpu) / 1e3)} M/s at the min); wall min ${fmt(Math.min(...wall))}, median ${fmt(median(wall))}; ${median(rs.map((r) => r.faults))} page faults; ${fmt(rs[0]!.live)} B/residency live, ${fmt(rs[0]!.linear)} linear`);
});
