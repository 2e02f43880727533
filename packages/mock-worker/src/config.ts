import { parseDiscoveryConfig } from "@kv-epp/intents";
import { WORKER_ROLES, type WorkerRole } from "@kv-epp/protocol";
import { EVENT_ENCODINGS, type EventEncoding } from "@kv-epp/kv-events";
import { ConfigError, count, group, jsonObjectText, nonNegative, opt, port, positive, resolveOptions, usageText, type Values } from "@kv-epp/options";
import { z } from "zod";
import { CONTENT_FORMAT_OPTIONS, DEFAULT_RESPONSE_ROLE } from "@kv-epp/tokenizer";
import { DEFAULT_TIMING } from "./engine/scheduler.ts";
import { parseKvGroups, type KvGroup } from "./events/kv-groups.ts";

/**
 * The mock worker's configuration, resolved once at the edge by @kv-epp/options' rule: every flag
 * `--some-name` also reads `MOCK_WORKER_SOME_NAME`, and a library caller's options stand where a config
 * file would; flag > variable > caller's options > default.
 */

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
  .array(z.string())
  .transform((v) => v.map((e) => e.split("=")[0]!.trim()).filter((n) => n.length > 0))
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

export const MOCK_WORKER_PROGRAM = { envPrefix: "MOCK_WORKER_" } as const;

export const MOCK_WORKER_OPTIONS = {
  ...group("Server", {
    listen: opt.string(z.union([z.ipv4(), z.ipv6(), z.literal("localhost")], { error: "expected an IP address" }).default("0.0.0.0"), "IP the HTTP server binds"),
    port: opt.int(port.default(8000), "OpenAI HTTP port"),
    rankPorts: opt.bool(
      z.boolean().default(false),
      "true: one API server per rank, rank r on --port + r (vLLM's external DP load balancing, one endpoint per InferencePool target port)",
    ),
    logLevel: opt.choice(["fatal", "error", "warn", "info", "debug", "trace", "silent"], "info", "pino level"),
  }),
  ...group("KV events", {
    kvEvents: opt.string(tcpEndpoint.default("tcp://*:5557"), "KV-event PUB endpoint; rank r binds port + r (with --kv-events-connect vLLM's rule: connects unless a wildcard)"),
    kvEventsConnect: opt.bool(
      z.boolean().default(false),
      "true: follow vLLM's publisher rule, connect the PUB to a --kv-events that is not a wildcard (*, ::) instead of binding it",
    ),
    replay: opt.string(tcpEndpoint.optional(), "replay ROUTER endpoint; rank r binds port + r"),
    replayBuffer: opt.int(positive.default(10_000), "batches kept for replay per rank"),
    topic: opt.string(z.string().default(""), "ZeroMQ topic frame"),
    eventEncoding: opt.choice(
      EVENT_ENCODINGS as unknown as [EventEncoding, ...EventEncoding[]],
      "vllm",
      "KV event wire shape: vllm (today: array batch, map events), vllm-map, vllm-array (older vLLM), sglang-map (SGLang today), sglang (older SGLang, arrays); an SGLang shape also renders chats by SGLang's rules",
    ),
    hashMode: opt.choice(["int", "bytes"], "int", "block hashes as u64 ints or 32-byte digests"),
    hashSeed: opt.string(
      z.string().min(1).optional(),
      "vLLM's PYTHONHASHSEED: seeds the root block's parent hash (NONE_HASH) of every rank; random: each rank draws its own, as vLLM without PYTHONHASHSEED; absent: no seed (every worker names a prefix alike)",
    ),
    kvGroups: opt.string(
      kvGroups.default([]),
      "hybrid KV cache groups, kind:blockSize[:window],... (full_attention, mla_attention, sliding_window; block size = --block-size): per-group events",
    ),
    partialEntries: opt.bool(
      z.boolean().default(false),
      "true: publish vLLM's partial prefix-cache entries (--prefix-match-unit = --block-size) for every --kv-groups main group with larger blocks",
    ),
    specBigram: opt.bool(
      z.boolean().default(false),
      "true: SGLang under EAGLE speculative decoding, token_ids as bigram pairs (needs --event-encoding sglang-map or sglang)",
    ),
    taggedExtraKeys: opt.bool(
      z.boolean().default(false),
      "true: extra_keys labelled by source, [\"lora\", name] and [\"cache_salt\", salt], as open vLLM PRs (#44706, #51899) would publish them",
    ),
  }),
  ...group("Cache and engine", {
    blockSize: opt.int(positive.default(16), "tokens per KV block"),
    capacityBlocks: opt.int(positive.default(8192), "KV cache capacity per rank, in blocks"),
    dpSize: opt.int(positive.max(256).default(1), "data-parallel ranks, each with its own cache"),
    dataParallelStartRank: opt.int(
      count.max(4095).default(0),
      "global DP rank of this worker's first rank (vLLM's multi-node DP): ports and data_parallel_rank follow the global rank",
    ),
    dataParallelHybridLb: opt.bool(
      z.boolean().default(false),
      "true: vLLM's --data-parallel-hybrid-lb, this node's API server numbers its ranks from 0 in x-data-parallel-rank (KV-event ports stay global: port + global rank)",
    ),
    speed: opt.number(nonNegative.default(1), "time scale of every engine step; 0 answers at once"),
    maxNumSeqs: opt.int(positive.default(DEFAULT_TIMING.maxNumSeqs), "vLLM's --max-num-seqs: requests running at once per rank; others wait"),
    maxNumBatchedTokens: opt.int(
      positive.default(DEFAULT_TIMING.maxNumBatchedTokens),
      "vLLM's --max-num-batched-tokens: tokens one engine step computes (chunked prefill and decodes share it)",
    ),
    stepBaseMs: opt.number(nonNegative.default(DEFAULT_TIMING.stepBaseMs), "fixed cost of one engine step"),
    stepMsPerToken: opt.number(nonNegative.default(DEFAULT_TIMING.msPerToken), "cost of each token a step computes (prefill or decode)"),
  }),
  ...group("Prefill/decode", {
    role: opt.string(
      z.enum(WORKER_ROLES as unknown as [WorkerRole, ...WorkerRole[]]).optional(),
      "prefill, decode or both (llm-d's prefill-decode): a P/D pool's worker with vLLM's NixlConnector (kv_transfer_params honoured both ways), its role in its intents; absent: no connector (kv_transfer_params ignored)",
    ),
    kvConnector: opt.choice(
      ["nixl", "mooncake"],
      "nixl",
      "with --role: the vLLM connector stood in for, nixl (NixlConnector: the prefill answers with the parameters the decode reads) or mooncake (MooncakeConnector: legs paired by transfer_id, engine ids on a bootstrap port)",
    ),
    mooncakeBootstrapPort: opt.int(port.default(8998), "with --kv-connector mooncake and --role prefill or both: where the Mooncake bootstrap server listens (vLLM's VLLM_MOONCAKE_BOOTSTRAP_PORT; 0: ephemeral)"),
    kvTransferMsPerBlock: opt.number(nonNegative.default(0.1), "decode side: simulated time to pull one KV block from the prefill worker (scaled by --speed)"),
    kvTransferAbortTimeoutS: opt.number(
      z.number().positive().default(480),
      "prefill side: vLLM's VLLM_NIXL_ABORT_REQUEST_TIMEOUT (VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT with mooncake, which also bounds a decode's wait for its prefill), how long a prefilled request's blocks wait for the decode worker to read them",
    ),
    disaggregationMode: opt.choice(
      ["null", "prefill", "decode"],
      "null",
      "SGLang's --disaggregation-mode (needs an SGLang --event-encoding, no --role): prefill or decode, paired per request by bootstrap_host/bootstrap_port/bootstrap_room; null: not disaggregated",
    ),
    disaggregationBootstrapPort: opt.int(port.default(8998), "SGLang's --disaggregation-bootstrap-port: where a prefill-mode worker's bootstrap server listens (0: ephemeral)"),
    disaggregationWaitingTimeoutS: opt.number(
      z.number().positive().default(300),
      "decode mode: SGLang's SGLANG_DISAGGREGATION_WAITING_TIMEOUT, how long a request waits for its room's KV before it fails (500)",
    ),
    disaggregationBootstrapTimeoutS: opt.number(
      z.number().positive().default(300),
      "prefill mode: SGLang's SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT, how long a computed room waits for its decode server before it fails (500)",
    ),
  }),
  ...group("Model", {
    model: opt.string(z.string().min(1).default("Qwen/Qwen3-0.6B"), "served model name"),
    tokenizerDir: opt.string(z.string().min(1).optional(), "dir with tokenizer.json (+ tokenizer_config.json)"),
    defaultChatTemplateKwargs: opt.string(jsonObjectText.optional(), "vLLM's --default-chat-template-kwargs: template variables every chat renders with unless the request sets them, a JSON object (e.g. {\"enable_thinking\": false})"),
    excludeToolsWhenToolChoiceNone: opt.bool(z.boolean().default(false), "vLLM's --exclude-tools-when-tool-choice-none: a chat whose tool_choice is \"none\" renders without its tools"),
    chatTemplate: opt.string(z.string().min(1).optional(), "vLLM's --chat-template: a file's path, or the template itself (a value that opens as no file and holds {, } or a newline), in place of the tokenizer's templates"),
    chatTemplateContentFormat: opt.choice(CONTENT_FORMAT_OPTIONS, "auto", "vLLM's --chat-template-content-format: string or openai forces the shape of every message's content; auto detects it on the template"),
    trustRequestChatTemplate: opt.bool(z.boolean().default(false), "vLLM's --trust-request-chat-template: a request's own template (chat_template, or chat_template_kwargs' chat_template) renders it; without it such a request is refused (400)"),
    responseRole: opt.string(z.string().min(1).default(DEFAULT_RESPONSE_ROLE), "vLLM's --response-role: the role a chat's reply comes in when the chat asks for a generation prompt (else the final message's own role)"),
    loraModules: opt.list(loraModules.default([]), "LoRA adapters served (name[=path],...): requests name them in `model`"),
  }),
  ...group("Intents", {
    workerId: opt.string(z.string().min(1).optional(), "name used in logs and intents (default host:port)"),
    discovery: opt.string(discoveryValue.optional(), "register KV attachment intents: kubernetes | http://HOST:PORT"),
    kvHost: opt.string(z.string().min(1).default("dynamo-epp"), "host instance (EPP) the intents are addressed to"),
    advertiseHost: opt.string(z.string().min(1).optional(), "IP the EPP reaches this worker on (pod IP), written in intents"),
  }),
};

export type MockWorkerConfig = Values<typeof MOCK_WORKER_OPTIONS>;

/**
 * The engine the worker stands for on the wire, named by its --event-encoding: an SGLang one makes it SGLang
 * throughout (its metrics, `/server_info`, `/flush_cache`), any other vLLM.
 */
export type EngineKind = "vllm" | "sglang";
export const engineKind = (c: Pick<MockWorkerConfig, "eventEncoding">): EngineKind => (c.eventEncoding.startsWith("sglang") ? "sglang" : "vllm");

/**
 * The worker's P/D role, whichever way it was given: vLLM's NixlConnector (`--role`) or SGLang's
 * `--disaggregation-mode`; undefined for neither.
 */
export function poolRole(c: Pick<MockWorkerConfig, "role" | "disaggregationMode">): WorkerRole | undefined {
  return c.role ?? (c.disaggregationMode === "null" ? undefined : c.disaggregationMode);
}

export { ConfigError };

/** Parses `--flag value` / `--flag=value` arguments over MOCK_WORKER_* variables; throws ConfigError naming the flag or variable. */
export function parseConfig(argv: string[], env: Record<string, string | undefined> = {}): MockWorkerConfig {
  return resolveOptions(MOCK_WORKER_OPTIONS, MOCK_WORKER_PROGRAM, { argv, env }).values;
}

/** The library's door: options given in code are validated like flags, defaults fill the rest. */
export function resolveConfig(given: Partial<MockWorkerConfig>): MockWorkerConfig {
  return resolveOptions(MOCK_WORKER_OPTIONS, MOCK_WORKER_PROGRAM, { file: { label: "the options given", values: given } }).values;
}

export function usage(): string {
  return usageText(MOCK_WORKER_OPTIONS, { ...MOCK_WORKER_PROGRAM, command: "bun run mock-worker", note: "Each flag also reads its variable; flag > variable > default (a library caller's options stand between the variable and the default)." });
}
