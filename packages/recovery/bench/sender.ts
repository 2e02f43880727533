// Sender side of the recovery benchmark: builds the 1M-residency index, measures dump generation, then serves
// GET /dump (streamed, the product's handler) and GET /dump-buffered (baseline: the whole body materialised
// before answering). GET /stats reports the peak RSS seen since the previous /stats.
import pino from "pino";
import { dumpChunks, dumpHandler } from "../src/index.ts";
import { buildIndex, indexSource, MiB, rssSampler } from "./fixture.ts";

const host = process.argv[2] ?? "127.0.3.200";
Bun.gc(true);
const rss0 = process.memoryUsage.rss();
const t0 = performance.now();
const index = buildIndex();
const buildMs = performance.now() - t0;
Bun.gc(true);
const stats = index.stats();

// Generation rate: the writer alone (index iteration included), draining chunks into nothing; the best of
// three passes, so JIT warm-up is not counted (the served dumps below run warm too).
let genMs = Infinity;
let genBytes = 0;
let genEvents = 0; // chunks
for (let pass = 0; pass < 3; pass++) {
  const g0 = performance.now();
  genBytes = 0;
  genEvents = 0;
  for (const chunk of dumpChunks(indexSource(index))) {
    genEvents++;
    genBytes += chunk.length;
  }
  genMs = Math.min(genMs, performance.now() - g0);
  Bun.gc(true);
}
Bun.gc(true);

const sampler = rssSampler();
const handler = dumpHandler({ source: indexSource(index), ready: () => true, logger: pino({ level: "silent" }) });
const server = Bun.serve({
  hostname: host,
  port: 0,
  idleTimeout: 0,
  async fetch(req) {
    const path = new URL(req.url).pathname;
    if (path === "/stats") {
      Bun.gc(true);
      const body = JSON.stringify({ peakRss: sampler.peak(), rss: process.memoryUsage.rss() });
      sampler.reset();
      return new Response(body);
    }
    if (path === "/dump") {
      // A fresh source per request: the handler's source iterates the index anew each time.
      return dumpHandler({ source: indexSource(index), ready: () => true, logger: pino({ level: "silent" }), chunkBytes: Number(process.env.DUMP_CHUNK_BYTES) || undefined })(req);
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
    rssWithIndex: process.memoryUsage.rss(),
    buildMs,
    gen: { ms: genMs, bytes: genBytes, chunks: genEvents },
  }),
);
process.on("SIGTERM", () => {
  server.stop(true);
  process.exit(0);
});
void MiB;
