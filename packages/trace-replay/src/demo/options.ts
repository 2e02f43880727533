// `bun run demo` options, parsed once at the edge.
import { z } from "zod";
import { parseFlags } from "../cli-flags.ts";
import type { ClientBodyMode } from "@kv-epp/epp";
import { DEFAULT_TRACE_PATH } from "../trace.ts";
import type { PromptKind } from "./bodies.ts";

const positiveInt = z.coerce.number().int().positive();
const port = z.coerce.number().int().min(1).max(65535);

const schema = z.object({
  trace: z.string().min(1).default(DEFAULT_TRACE_PATH),
  workers: positiveInt.max(200).default(4),
  // 65536 blocks x 16 tokens = 1M tokens per worker, against ~40k prompt tokens per second of trace:
  // caches turn over within a minute or two, so where a conversation's next turn lands decides its hits.
  "capacity-blocks": positiveInt.default(65536),
  "block-size": positiveInt.default(16),
  /** seconds of trace to replay */
  // 150 s of trace at 2x: ~460 chat requests in 75 s, ~6 a second. Each costs the EPP and the worker a
  // tokenization of ~12k tokens on average (tens of ms on a busy 2-core machine); at 4x a single replica
  // (while its peer is replaced) fell behind there.
  duration: z.coerce.number().positive().default(150),
  /** cap on requests (0: all within --duration) */
  requests: z.coerce.number().int().min(0).default(0),
  "time-scale": z.coerce.number().positive().default(2),
  // The trace's timestamps come in ~3 s steps (up to 16 records at one instant in the first minutes);
  // "spread" spaces each step's records evenly until the next step, as bench:trace's flag does.
  arrivals: z.enum(["recorded", "spread"]).default("recorded"),
  /** mock workers' engine speed; default 1 / time-scale, so the workers keep up with the compressed trace */
  speed: z.coerce.number().min(0).optional(),
  /** fraction of the requests after which one EPP replica is killed and replaced */
  "kill-at": z.coerce.number().min(0).max(1).default(0.5),
  subnet: z.string().regex(/^127\.\d{1,3}\.\d{1,3}$/, "expected the first three octets of a loopback /24, e.g. 127.0.6").default("127.0.6"),
  "worker-port": port.default(8000),
  "kv-port": port.default(5557),
  "gateway-port": port.default(8080),
  /** chat: OpenAI chat messages as text, tokenized by the EPPs and workers (Qwen3); tokens: token-id prompts */
  prompt: z.enum(["chat", "tokens"]).default("chat"),
  out: z.string().min(1).default("reports"),
  /** ext_proc request body mode, announced by the gateway and set on the EPPs (GAIE uses full duplex) */
  "body-mode": z.enum(["full-duplex", "buffered"]).default("full-duplex"),
  /** auto: a PNG of the hit-rate chart when a headless chromium is installed */
  png: z.enum(["auto", "off"]).default("auto"),
  // A prefill/decode pool: half the workers prefill (--role prefill), half decode behind the P/D
  // sidecar (--role decode); the EPPs pick a pair per request.
  pd: z.union([z.boolean(), z.enum(["true", "false"]).transform((v) => v === "true")]).default(false),
});

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
};

export function parseDemoArgs(argv: string[]): DemoOptions {
  const o = parseFlags(schema, argv, undefined, ["pd"]);
  return {
    tracePath: o.trace,
    workers: o.workers,
    capacityBlocks: o["capacity-blocks"],
    blockSize: o["block-size"],
    durationS: o.duration,
    requests: o.requests,
    timeScale: o["time-scale"],
    arrivals: o.arrivals,
    speed: o.speed ?? 1 / o["time-scale"],
    killAt: o["kill-at"],
    subnet: o.subnet,
    workerPort: o["worker-port"],
    kvPort: o["kv-port"],
    gatewayPort: o["gateway-port"],
    prompt: o.prompt,
    outDir: o.out,
    bodyMode: o["body-mode"],
    png: o.png === "auto",
    pd: o.pd,
  };
}
