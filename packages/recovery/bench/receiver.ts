// Receiver side of the recovery benchmark: recovers the index from the sender into a fresh KvIndex.
// mode "binary": the product path (fetchDump asks for the binary body: streamed frames, each run of events
// applied inside the module, the index presized from the announced size). "binary-grow": the same without
// presizing. "binary-discard": binary fetch + parse applied into nothing (the pipeline's own cost).
// mode "streamed": the JSON body, the product path before the binary body (streaming parse, typed batches
// written into event runs).
// mode "discard": the same, applying into nothing: the recovery pipeline's own memory, without the index.
// mode "buffered": baseline: the whole body is read into memory first, then parsed and applied.
// mode "before": the sender's TS writer (/ts/dump, from RouterEvent objects) instead of the module's JSON, the
// receiver as in "streamed".
import type { KvIndex } from "@kv-epp/index-wasm";
import { dumpBodyParser, fetchDump } from "../src/index.ts";
import { indexTarget, rssSampler } from "./fixture.ts";

const [mode, url] = [process.argv[2]!, process.argv[3]!];
// binary / binary-discard: the binary body (the product path now); the other modes ask for JSON, as before it.
const format = mode.startsWith("binary") ? "binary" : "json";
Bun.gc(true);
const rss0 = process.memoryUsage.rss();
const sampler = rssSampler();
let recovered: Map<string, KvIndex> = new Map();
const discard = { begin: () => ({ accepts: () => true, model() {}, events() {}, extras() {}, stagedBytes: () => 0, commit() {}, abort() {} }) };
const target = mode.endsWith("discard") ? discard : indexTarget((m) => (recovered = m), { presize: mode !== "binary-grow" });
const t0 = performance.now();
const cpu0 = process.cpuUsage();
let events = 0;
let bytes = 0;
if (mode !== "buffered") {
  const r = await fetchDump({ peer: { id: url, url: mode === "before" ? `${url}/ts` : url }, target, timeoutMs: 30_000, format: format === "binary" ? "binary" : "json" });
  events = r.events;
  bytes = r.bytes;
} else {
  const body = new Uint8Array(await (await fetch(`${url}/dump-buffered`)).arrayBuffer());
  sampler.sample();
  const staging = target.begin();
  const parser = dumpBodyParser(staging, "json");
  parser.push(body);
  parser.end();
  staging.commit();
  events = parser.events;
  bytes = parser.bytes;
}
const ms = performance.now() - t0;
const cpu = process.cpuUsage(cpu0);
sampler.sample();
sampler.stop();
const st = [...recovered.values()][0]?.stats() ?? { residencies: 0, blocks: 0, bytes: 0 };
// The index's linear memory is resident as a whole (measured: building this index directly grows RSS by about
// its byteLength, though fewer bytes are in use), so "above the index" subtracts the linear memory size.
console.log(JSON.stringify({ mode, ms, cpuMs: (cpu.user + cpu.system) / 1000, events, bytes, residencies: st.residencies, blocks: st.blocks, indexBytes: st.bytes, rss0, peakRss: sampler.peak() }));
