// `bun run demo` options, declared once and resolved at the edge (flags only).
import { count, group, nonNegative, opt, port, positive, resolveOptions, usageText } from "@kv-epp/options";
import { z } from "zod";
import type { ClientBodyMode } from "@kv-epp/epp";
import { DEFAULT_TRACE_PATH } from "../trace.ts";
import type { PromptKind } from "./bodies.ts";

const demoPort = port.min(1);

export const DEMO_OPTIONS = {
  ...group("Trace and load", {
    trace: opt.string(z.string().min(1).default(DEFAULT_TRACE_PATH), "trace file (JSONL)"),
    // 150 s of trace at 2x: ~460 chat requests in 75 s, ~6 a second. Each costs the EPP and the worker a
    // tokenization of ~12k tokens on average (tens of ms on a busy 2-core machine); at 4x a single replica
    // (while its peer is replaced) fell behind there.
    duration: opt.number(z.number().positive().default(150), "seconds of trace to replay"),
    requests: opt.int(count.default(0), "cap on requests (0: all within --duration)"),
    timeScale: opt.number(z.number().positive().default(2), "arrival rate as a multiple of the trace's"),
    // The trace's timestamps come in ~3 s steps (up to 16 records at one instant in the first minutes): as
    // recorded, each step's records reach the gateway in the same instant, which no gateway sees, and a replica's
    // picks queue behind one another for that reason alone. "spread" (the default) spaces each step's records
    // evenly until the next step, as bench:trace's flag does; "recorded" keeps the bursts.
    arrivals: opt.choice(["recorded", "spread"], "spread", "arrival times: spread evenly over each recorded ~3 s step (the trace's timestamps are quantised), or as recorded (each step's records at one instant)"),
    prompt: opt.choice(["chat", "tokens"], "chat", "chat: OpenAI chat messages as text, tokenized by the EPPs and workers (Qwen3); tokens: token-id prompts"),
    killAt: opt.number(z.number().min(0).max(1).default(0.5), "fraction of the requests after which one EPP replica is killed and replaced"),
  }),
  ...group("Prefill/decode", {
    // Half the workers prefill (--role prefill), half decode behind the P/D sidecar (--role decode); the
    // EPPs pick a pair per request.
    pd: opt.bool(z.boolean().default(false), "a P/D pool: workers / 2 prefill workers, the rest decode workers behind the P/D sidecar"),
  }),
  ...group("Cluster", {
    workers: opt.int(positive.max(200).default(4), "mock workers"),
    // 65536 blocks x 16 tokens = 1M tokens per worker, against ~40k prompt tokens per second of trace:
    // caches turn over within a minute or two, so where a conversation's next turn lands decides its hits.
    capacityBlocks: opt.int(positive.default(65536), "KV cache capacity per worker, in blocks"),
    blockSize: opt.int(positive.default(16), "tokens per KV block"),
    speed: opt.number(nonNegative.optional(), "mock workers' engine speed (default 0.5 / --time-scale: the four workers run at about half their prefill rate, as a served pool does, not queueing seconds)"),
    subnet: opt.string(
      z.string().regex(/^127\.\d{1,3}\.\d{1,3}$/, "expected the first three octets of a loopback /24, e.g. 127.0.6").default("127.0.6"),
      "loopback /24 the processes listen on",
    ),
    workerPort: opt.int(demoPort.default(8000), "mock workers' HTTP port"),
    kvPort: opt.int(demoPort.default(5557), "mock workers' KV event port"),
    gatewayPort: opt.int(demoPort.default(8080), "gateway port"),
    bodyMode: opt.choice(["full-duplex", "buffered"], "full-duplex", "ext_proc request body mode, announced by the gateway and set on the EPPs (GAIE uses full duplex)"),
    // The workers stand in for GPU hosts of their own (each tokenizes every chat it serves, as vLLM does), the
    // gateway for Envoy's nodes: on one machine they would take the CPU the EPPs' picks wait for.
    standInNice: opt.int(
      z.number().int().min(0).max(19).default(19),
      "nice value of the mock workers, P/D sidecars and gateway (their sessions' too, under Linux autogroup scheduling); 0: the EPPs' priority",
    ),
  }),
  ...group("Output", {
    out: opt.string(z.string().min(1).default("reports"), "directory of the report"),
    png: opt.choice(["auto", "off"], "auto", "auto: a PNG of the hit-rate chart when a headless chromium is installed"),
  }),
};

export type DemoOptions = {
  tracePath: string;
  workers: number;
  capacityBlocks: number;
  blockSize: number;
  durationS: number;
  requests: number;
  timeScale: number;
  arrivals: "recorded" | "spread";
  speed: number;
  killAt: number;
  subnet: string;
  workerPort: number;
  kvPort: number;
  gatewayPort: number;
  prompt: PromptKind;
  outDir: string;
  bodyMode: ClientBodyMode;
  png: boolean;
  /** a P/D pool: workers / 2 prefill workers, the rest decode workers behind the P/D sidecar */
  pd: boolean;
  /** Nice value of the mock workers, P/D sidecars and gateway. */
  standInNice: number;
};

export function parseDemoArgs(argv: string[]): DemoOptions {
  const o = resolveOptions(DEMO_OPTIONS, {}, { argv }).values;
  return {
    tracePath: o.trace,
    workers: o.workers,
    capacityBlocks: o.capacityBlocks,
    blockSize: o.blockSize,
    durationS: o.duration,
    requests: o.requests,
    timeScale: o.timeScale,
    arrivals: o.arrivals,
    speed: o.speed ?? 0.5 / o.timeScale,
    killAt: o.killAt,
    subnet: o.subnet,
    workerPort: o.workerPort,
    kvPort: o.kvPort,
    gatewayPort: o.gatewayPort,
    prompt: o.prompt,
    outDir: o.out,
    bodyMode: o.bodyMode,
    png: o.png === "auto",
    pd: o.pd,
    standInNice: o.standInNice,
  };
}

export function demoUsage(): string {
  return usageText(DEMO_OPTIONS, { command: "bun run demo", note: "Flags only (no environment variables)." });
}
