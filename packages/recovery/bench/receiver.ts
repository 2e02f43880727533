// Receiver side of the recovery benchmark: recovers the index from the sender into a fresh KvIndex.
// mode "streamed": the product path (fetchDump: streaming parse, apply as bytes arrive).
// mode "buffered": baseline: the whole body is read into memory first, then parsed and applied.
import type { KvIndex } from "@kv-epp/index-wasm";
import { DumpParser, fetchDump } from "../src/index.ts";
import { indexTarget, rssSampler } from "./fixture.ts";

const [mode, url] = [process.argv[2], process.argv[3]!];
Bun.gc(true);
const rss0 = process.memoryUsage.rss();
const sampler = rssSampler();
let recovered: Map<string, KvIndex> = new Map();
const target = indexTarget((m) => (recovered = m));
const t0 = performance.now();
let events = 0;
let bytes = 0;
if (mode === "streamed") {
  const r = await fetchDump({ peer: { id: url, url }, target, timeoutMs: 30_000 });
  events = r.events;
  bytes = r.bytes;
} else {
  const body = new Uint8Array(await (await fetch(`${url}/dump-buffered`)).arrayBuffer());
  sampler.sample();
  const staging = target.begin();
  const parser = new DumpParser((k, b, e) => staging.apply(k, b, e));
  parser.push(body);
  parser.end();
  staging.commit();
  events = parser.events;
  bytes = parser.bytes;
}
const ms = performance.now() - t0;
sampler.sample();
sampler.stop();
const idx = [...recovered.values()][0]!;
const st = idx.stats();
console.log(JSON.stringify({ mode, ms, events, bytes, residencies: st.residencies, blocks: st.blocks, indexBytes: st.bytes, rss0, peakRss: Math.max(sampler.peak(), process.resourceUsage().maxRSS * 1024) }));
