import { parseDiscoveryConfig } from "@kv-epp/intents";
import { WORKER_ROLES, type WorkerRole } from "@kv-epp/protocol";
import { EVENT_ENCODINGS, type EventEncoding } from "@kv-epp/kv-events";
import { z } from "zod";
import { DEFAULT_TIMING } from "./engine/scheduler.ts";
import { parseKvGroups, type KvGroup } from "./events/kv-groups.ts";

/**
 * The mock worker's configuration, parsed once at the edge from flags and environment variables.
 * Every flag `--some-name` also reads `MOCK_WORKER_SOME_NAME`; a flag wins over its variable.
 */

const port = z.coerce.number().int().min(0).max(65535);
const positiveInt = z.coerce.number().int().positive();
const nonNegative = z.coerce.number().min(0);
// A ZeroMQ TCP endpoint as vLLM takes it: `tcp://*:5557`, `tcp://127.0.0.2:5557`, port 0 for ephemeral.
const tcpEndpoint = z.string().regex(/^tcp:\/\/(\*|[^:\s]+|\[[0-9a-fA-F:]+\]):\d{1,5}$/, "expected tcp://HOST:PORT");
// The intents package's own rule (the EPP's --intent-discovery uses it too), checked at start: a value it
// refuses would otherwise start the worker and fail only later, in the background registration.
const discoveryValue = z.string().superRefine((v, ctx) => {
  try {
    parseDiscoveryConfig(v, {});
  } catch (e) {
    ctx.addIssue({ code: "custom", message: (e as Error).message });
  }
});

// vLLM's --lora-modules: `name=path` entries (the path means nothing to a mock), comma-separated on the
// command line or a list in code. An adapter's lora_int_id is its 1-based position, as vLLM numbers them.
const loraModules = z
  .union([z.string(), z.array(z.string())])
  .transform((v) => (typeof v === "string" ? v.split(",") : v).map((e) => e.split("=")[0]!.trim()).filter((n) => n.length > 0))
  .pipe(z.array(z.string()).refine((names) => new Set(names).size === names.length, "adapter names must be distinct"));

const kvGroups = z
  .union([z.string(), z.array(z.object({ kind: z.enum(["full_attention", "mla_attention", "sliding_window"]), blockSize: z.number(), slidingWindow: z.number().nullable() }))])
  .transform((v, ctx) => {
    try {
      return typeof v === "string" ? (v === "" ? [] : parseKvGroups(v)) : (v as KvGroup[]);
    } catch (e) {
      ctx.addIssue({ code: "custom", message: (e as Error).message });
      return z.NEVER;
    }
  });

export const OPTIONS = {
  listen: { schema: z.union([z.ipv4(), z.ipv6(), z.literal("localhost")], { error: "expected an IP address" }).default("0.0.0.0"), help: "IP the HTTP server binds" },
  port: { schema: port.default(8000), help: "OpenAI HTTP port" },
  "kv-events": { schema: tcpEndpoint.default("tcp://*:5557"), help: "KV-event PUB endpoint; rank r binds port + r (with --kv-events-connect vLLM's rule: connects unless a wildcard)" },
  "kv-events-connect": {
    schema: z.union([z.boolean(), z.enum(["true", "false"]).transform((v) => v === "true")]).default(false),
    help: "true: follow vLLM's publisher rule, connect the PUB to a --kv-events that is not a wildcard (*, ::) instead of binding it",
  },
  replay: { schema: tcpEndpoint.optional(), help: "replay ROUTER endpoint; rank r binds port + r" },
  "replay-buffer": { schema: positiveInt.default(10_000), help: "batches kept for replay per rank" },
  "block-size": { schema: positiveInt.default(16), help: "tokens per KV block" },
  "capacity-blocks": { schema: positiveInt.default(8192), help: "KV cache capacity per rank, in blocks" },
  "dp-size": { schema: positiveInt.max(256).default(1), help: "data-parallel ranks, each with its own cache" },
  "data-parallel-start-rank": {
    schema: z.coerce.number().int().min(0).max(4095).default(0),
    help: "global DP rank of this worker's first rank (vLLM's multi-node DP): ports and data_parallel_rank follow the global rank",
  },
  "data-parallel-hybrid-lb": {
    schema: z.union([z.boolean(), z.enum(["true", "false"]).transform((v) => v === "true")]).default(false),
    help: "true: vLLM's --data-parallel-hybrid-lb, this node's API server numbers its ranks from 0 in x-data-parallel-rank (KV-event ports stay global: port + global rank)",
  },
  "kv-groups": {
    schema: kvGroups.default([]),
    help: "hybrid KV cache groups, kind:blockSize[:window],... (full_attention, mla_attention, sliding_window; block size = --block-size): per-group events",
  },
  "rank-ports": {
    schema: z.union([z.boolean(), z.enum(["true", "false"]).transform((v) => v === "true")]).default(false),
    help: "true: one API server per rank, rank r on --port + r (vLLM's external DP load balancing, one endpoint per InferencePool target port)",
  },
  "partial-entries": {
    schema: z.union([z.boolean(), z.enum(["true", "false"]).transform((v) => v === "true")]).default(false),
    help: "true: publish vLLM's partial prefix-cache entries (--prefix-match-unit = --block-size) for every --kv-groups main group with larger blocks",
  },
  "spec-bigram": {
    schema: z.union([z.boolean(), z.enum(["true", "false"]).transform((v) => v === "true")]).default(false),
    help: "true: SGLang under EAGLE speculative decoding, token_ids as bigram pairs (needs --event-encoding sglang-map or sglang)",
  },
  role: {
    schema: z.enum(WORKER_ROLES as [WorkerRole, ...WorkerRole[]]).optional(),
    help: "prefill, decode or both (llm-d's prefill-decode): a P/D pool's worker with vLLM's NixlConnector (kv_transfer_params honoured both ways), its role in its intents; absent: no connector (kv_transfer_params ignored)",
  },
  "kv-transfer-ms-per-block": {
    schema: nonNegative.default(0.1),
    help: "decode side: simulated time to pull one KV block from the prefill worker (scaled by --speed)",
  },
  "kv-transfer-abort-timeout-s": {
    schema: z.coerce.number().positive().default(480),
    help: "prefill side: vLLM's VLLM_NIXL_ABORT_REQUEST_TIMEOUT, how long a prefilled request's blocks wait for the decode worker to read them",
  },
  "lora-modules": { schema: loraModules.default([]), help: "LoRA adapters served (name[=path],...): requests name them in `model`" },
  "event-encoding": { schema: z.enum(EVENT_ENCODINGS as [EventEncoding, ...EventEncoding[]]).default("vllm"), help: "KV event wire shape: vllm (today: array batch, map events), vllm-map, vllm-array (older vLLM), sglang-map (SGLang today), sglang (older SGLang, arrays)" },
  "hash-mode": { schema: z.enum(["int", "bytes"]).default("int"), help: "block hashes as u64 ints or 32-byte digests" },
  "hash-seed": {
    schema: z.string().min(1).optional(),
    help: "vLLM's PYTHONHASHSEED: seeds the root block's parent hash (NONE_HASH) of every rank; random: each rank draws its own, as vLLM without PYTHONHASHSEED; absent: no seed (every worker names a prefix alike)",
  },
  topic: { schema: z.string().default(""), help: "ZeroMQ topic frame" },
  speed: { schema: nonNegative.default(1), help: "time scale of every engine step; 0 answers at once" },
  "max-num-seqs": { schema: positiveInt.default(DEFAULT_TIMING.maxNumSeqs), help: "vLLM's --max-num-seqs: requests running at once per rank; others wait" },
  "max-num-batched-tokens": { schema: positiveInt.default(DEFAULT_TIMING.maxNumBatchedTokens), help: "vLLM's --max-num-batched-tokens: tokens one engine step computes (chunked prefill and decodes share it)" },
  "step-base-ms": { schema: nonNegative.default(DEFAULT_TIMING.stepBaseMs), help: "fixed cost of one engine step" },
  "step-ms-per-token": { schema: nonNegative.default(DEFAULT_TIMING.msPerToken), help: "cost of each token a step computes (prefill or decode)" },
  "tokenizer-dir": { schema: z.string().min(1).optional(), help: "dir with tokenizer.json (+ tokenizer_config.json)" },
  model: { schema: z.string().min(1).default("Qwen/Qwen3-0.6B"), help: "served model name" },
  "worker-id": { schema: z.string().min(1).optional(), help: "name used in logs and intents (default host:port)" },
  discovery: { schema: discoveryValue.optional(), help: "register KV attachment intents: kubernetes | http://HOST:PORT" },
  "kv-host": { schema: z.string().min(1).default("dynamo-epp"), help: "host instance (EPP) the intents are addressed to" },
  "advertise-host": { schema: z.string().min(1).optional(), help: "IP the EPP reaches this worker on (pod IP), written in intents" },
  "log-level": { schema: z.enum(["fatal", "error", "warn", "info", "debug", "trace", "silent"]).default("info"), help: "pino level" },
} as const;

type Options = typeof OPTIONS;
type FlagName = keyof Options;
type CamelCase<S extends string> = S extends `${infer H}-${infer T}` ? `${H}${Capitalize<CamelCase<T>>}` : S;

export type MockWorkerConfig = { [K in FlagName as CamelCase<K>]: z.output<Options[K]["schema"]> };

export class ConfigError extends Error {
  override name = "ConfigError";
}

export const envName = (flag: string) => `MOCK_WORKER_${flag.toUpperCase().replaceAll("-", "_")}`;
const camel = (flag: string) => flag.replace(/-([a-z])/g, (_, c: string) => c.toUpperCase());

/** Parses `--flag value` / `--flag=value` arguments over environment variables; throws ConfigError naming the flag. */
export function parseConfig(argv: string[], env: Record<string, string | undefined> = {}): MockWorkerConfig {
  const raw = new Map<FlagName, string>();
  for (const flag of Object.keys(OPTIONS) as FlagName[]) {
    const v = env[envName(flag)];
    if (v !== undefined) raw.set(flag, v);
  }
  for (let i = 0; i < argv.length; i++) {
    const arg = argv[i]!;
    const m = /^--([a-z-]+)(?:=(.*))?$/s.exec(arg);
    if (!m || !(m[1]! in OPTIONS)) throw new ConfigError(`unknown argument ${JSON.stringify(arg)}\n${usage()}`);
    const flag = m[1] as FlagName;
    let value = m[2];
    if (value === undefined) {
      value = argv[++i];
      if (value === undefined) throw new ConfigError(`--${flag} needs a value`);
    }
    raw.set(flag, value);
  }
  const out: Record<string, unknown> = {};
  for (const [flag, opt] of Object.entries(OPTIONS) as [FlagName, Options[FlagName]][]) {
    const given = raw.get(flag);
    const parsed = opt.schema.safeParse(given);
    if (!parsed.success) {
      const source = argv.some((a) => a === `--${flag}` || a.startsWith(`--${flag}=`)) ? `--${flag}` : envName(flag);
      const why = parsed.error.issues.map((i) => i.message).join("; ");
      throw new ConfigError(`invalid ${source} ${JSON.stringify(given)}: ${why}`);
    }
    out[camel(flag)] = parsed.data;
  }
  return out as MockWorkerConfig;
}

/** The library's door: options given in code are validated like flags, defaults fill the rest. */
export function resolveConfig(given: Partial<MockWorkerConfig>): MockWorkerConfig {
  const out = parseConfig([], {}) as Record<string, unknown>;
  for (const [flag, opt] of Object.entries(OPTIONS) as [FlagName, Options[FlagName]][]) {
    const value = (given as Record<string, unknown>)[camel(flag)];
    if (value === undefined) continue;
    const parsed = opt.schema.safeParse(value);
    if (!parsed.success) throw new ConfigError(`invalid option ${camel(flag)} ${JSON.stringify(value)}: ${parsed.error.issues.map((i) => i.message).join("; ")}`);
    out[camel(flag)] = parsed.data;
  }
  return out as MockWorkerConfig;
}

export function usage(): string {
  const lines = Object.entries(OPTIONS).map(([flag, o]) => `  --${flag.padEnd(22)} ${envName(flag).padEnd(34)} ${o.help}`);
  return `usage: bun run mock-worker [flags]   (each flag also reads its environment variable)\n${lines.join("\n")}`;
}
