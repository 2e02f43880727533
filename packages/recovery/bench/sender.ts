// Sender side of the recovery benchmark: builds the index (argv[3] blocks per worker: 16,384 = 1M residencies,
// 163,840 = 10M), measures dump generation (argv[4] "json" = the module's writer only), then serves
// GET /dump (streamed, the product's handler) and GET /dump-buffered (baseline: the whole body materialised
// before answering). GET /stats reports the peak RSS seen since the previous /stats.
import pino from "pino";
import { dumpBinaryChunks, dumpChunks, dumpHandler } from "../src/index.ts";
import { buildIndex, indexSource, MiB, rssSampler } from "./fixture.ts";

const host = process.argv[2] ?? "127.0.3.200";
const blocksPerWorker = Number(process.argv[3]) || undefined;
const generationModes = process.argv[4] === "json" ? [true] : [true, false];
Bun.gc(true);
const rss0 = process.memoryUsage.rss();
const t0 = performance.now();
const index = buildIndex(blocksPerWorker);
const buildMs = performance.now() - t0;
Bun.gc(true);
const stats = index.stats();
// The baseline for "extra" memory: the index built, before any dump ran (the generation passes below leave
// pages resident, which would hide the dump's own memory if measured after them).
const rssWithIndex = process.memoryUsage.rss();

const chunkBytes = Number(process.env.DUMP_CHUNK_BYTES) || undefined;

// Generation rate: the writer alone (index iteration included), draining chunks into nothing; the median of
// five passes (two for the large index) after a warm-up one, wall and CPU time, for the module's JSON (json) and
// the TS writer (ts), and for the module's binary events (binary).
function generation(kind: "json" | "ts" | "binary") {
  const json = kind !== "ts";
  const walls: number[] = [];
  const cpus: number[] = [];
  let bytes = 0;
  let chunks = 0;
  // fewer passes over the large index (each one is seconds)
  for (let pass = 0; pass < (generationModes.length === 1 ? 3 : 6); pass++) {
    const g0 = performance.now();
    const c0 = process.cpuUsage();
    bytes = 0;
    chunks = 0;
    const write = kind === "binary" ? dumpBinaryChunks : dumpChunks;
    for (const chunk of write(indexSource(index, undefined, { json }), chunkBytes)) {
      chunks++;
      bytes += chunk.length;
    }
    const c = process.cpuUsage(c0);
    if (pass > 0) {
      walls.push(performance.now() - g0);
      cpus.push((c.user + c.system) / 1000);
    }
    Bun.gc(true);
  }
  const median = (xs: number[]) => xs.sort((a, b) => a - b)[xs.length >> 1]!;
  return { ms: median(walls), cpuMs: median(cpus), bytes, chunks };
}
const gen = { binary: generation("binary"), json: generation("json"), ts: generationModes.includes(false) ? generation("ts") : null };
Bun.gc(true);

const sampler = rssSampler();
let cpu0 = process.cpuUsage();
const handler = dumpHandler({ source: indexSource(index), ready: () => true, logger: pino({ level: "silent" }) });
const server = Bun.serve({
  hostname: host,
  port: 0,
  idleTimeout: 0,
  async fetch(req) {
    const path = new URL(req.url).pathname;
    if (path === "/stats") {
      Bun.gc(true);
      const c = process.cpuUsage(cpu0);
      const body = JSON.stringify({ peakRss: sampler.peak(), rss: process.memoryUsage.rss(), cpuMs: (c.user + c.system) / 1000 });
      sampler.reset();
      cpu0 = process.cpuUsage();
      return new Response(body);
    }
    if (path === "/dump" || path === "/ts/dump") {
      // A fresh source per request: the handler's source iterates the index anew each time. /ts/dump: the TS
      // writer from RouterEvent objects (the path before the module wrote JSON), for before/after in one run.
      const source = indexSource(index, undefined, { json: path === "/dump" });
      return dumpHandler({ source, ready: () => true, logger: pino({ level: "silent" }), chunkBytes })(req);
    }
    if (path === "/dump-buffered") {
      const whole = new Uint8Array(await handler(new Request(req.url.replace("-buffered", ""))).arrayBuffer());
      sampler.sample();
      return new Response(whole, { headers: { "content-type": "application/json" } });
    }
    return new Response("not found", { status: 404 });
  },
});
sampler.reset();
console.log(
  JSON.stringify({
    url: `http://${host}:${server.port}`,
    residencies: stats.residencies,
    blocks: stats.blocks,
    indexBytes: stats.bytes,
    rssBeforeIndex: rss0,
    rssWithIndex,
    buildMs,
    gen,
  }),
);
process.on("SIGTERM", () => {
  server.stop(true);
  process.exit(0);
});
void MiB;
