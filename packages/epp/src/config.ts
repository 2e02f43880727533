// Configuration, parsed once at the edge (flags > environment > defaults), plus the optional
// static config file (YAML or JSON). Nothing below main.ts reads process.env or argv.
import { readFileSync } from "node:fs";
import { parseArgs } from "node:util";
import { parse as parseYaml } from "yaml";
import { parseDiscoveryConfig, type DiscoveryConfig } from "@kv-epp/intents";
import { z } from "zod";
import { DEFAULT_KV_MAX_MESSAGE_SIZE, LISTENER_HEARTBEAT } from "@kv-epp/kv-events";
import { DEFAULT_SHAPE, DEFAULT_WEIGHTS, SCORE_SHAPE, type CostShape, followerRange, type FollowerRange, DEFAULT_AWAY_WEIGHT, DEFAULT_FOLLOWER_WEIGHT, DEFAULT_FOLLOWER_WEIGHT_MAX, DEFAULT_COST, type CostModel, DEFAULT_PENDING, INFLIGHT_PREFIX_DEFAULT, DEFAULT_PD_THRESHOLD_TOKENS } from "@kv-epp/routing";
import { DP_LB_MODES, roleOfLabel, type DpLbMode } from "@kv-epp/protocol";

export class ConfigError extends Error {}

type Kind = "string" | "port" | "int" | "number" | "bool";
type Option = { flag: string; env: string; kind: Kind; default?: string; help: string };

/** Every option is a flag and an environment variable (docs/CONTRACTS.md §11); extra options follow the same naming. */
export const OPTIONS = {
  config: { flag: "config", env: "DYN_EPP_CONFIG", kind: "string", help: "static config file (YAML/JSON)" },
  listen: { flag: "listen", env: "DYN_EPP_LISTEN", kind: "string", default: "0.0.0.0", help: "address every server binds" },
  grpcPort: { flag: "grpc-port", env: "DYN_EPP_GRPC_PORT", kind: "port", default: "9002", help: "ext_proc gRPC port" },
  grpcHealthPort: { flag: "grpc-health-port", env: "DYN_EPP_GRPC_HEALTH_PORT", kind: "port", default: "9003", help: "grpc-health port" },
  healthChecking: { flag: "health-checking", env: "DYN_EPP_HEALTH_CHECKING", kind: "bool", default: "false", help: "also serve grpc.health.v1.Health/Check on the ext_proc port (as GAIE's --health-checking)" },
  metricsPort: { flag: "metrics-port", env: "DYN_EPP_METRICS_PORT", kind: "port", default: "9090", help: "Prometheus port" },
  replicaAggPort: { flag: "replica-agg-port", env: "DYN_EPP_REPLICA_AGG_PORT", kind: "port", default: "9092", help: "replica-agg port" },
  replicaAgg: { flag: "replica-agg", env: "DYN_EPP_REPLICA_AGG", kind: "bool", default: "true", help: "share in-flight load with peer replicas" },
  replicaAggHeartbeatMs: { flag: "replica-agg-heartbeat-ms", env: "DYN_EPP_REPLICA_AGG_HEARTBEAT_MS", kind: "int", default: "1000", help: "period of replica-agg snapshots (heartbeats)" },
  replicaAggTimeoutMs: { flag: "replica-agg-timeout-ms", env: "DYN_EPP_REPLICA_AGG_TIMEOUT_MS", kind: "int", default: "3000", help: "drop a peer's load after this long without a snapshot" },
  selectionPort: { flag: "selection-port", env: "DYN_EPP_SELECTION_PORT", kind: "port", default: "9093", help: "selection-http port" },
  peerService: { flag: "peer-service", env: "DYN_EPP_PEER_SERVICE", kind: "string", help: "peer Service (EndpointSlices) for recovery" },
  poolName: { flag: "pool-name", env: "DYN_EPP_POOL_NAME", kind: "string", help: "InferencePool name (Kubernetes mode)" },
  poolNamespace: { flag: "pool-namespace", env: "POD_NAMESPACE", kind: "string", default: "default", help: "namespace of the pool and peers" },
  subscribeWaitMs: { flag: "subscribe-wait-ms", env: "DYN_EPP_SUBSCRIBE_WAIT_MS", kind: "int", default: "5000", help: "before recovery, wait this long at most for KV listeners to connect" },
  recoveryTimeoutMs: { flag: "recovery-timeout-ms", env: "DYN_EPP_RECOVERY_HTTP_TIMEOUT_MS", kind: "int", default: "30000", help: "dump no-progress timeout" },
  recoveryBudgetMiB: { flag: "recovery-budget-mib", env: "DYN_EPP_RECOVERY_BUDGET_MIB", kind: "int", help: "most a dump may stage, MiB (default: half the cgroup memory limit, else of host memory)" },
  recoveryMinRate: { flag: "recovery-min-rate-bytes", env: "DYN_EPP_RECOVERY_MIN_RATE_BYTES", kind: "int", default: "65536", help: "a dump body slower than this many bytes/s over a window fails (0: off)" },
  recoveryRateWindowMs: { flag: "recovery-rate-window-ms", env: "DYN_EPP_RECOVERY_RATE_WINDOW_MS", kind: "int", default: "10000", help: "window of the dump rate floor" },
  recoveryPeerMaxFailures: { flag: "recovery-peer-max-failures", env: "DYN_EPP_RECOVERY_PEER_MAX_FAILURES", kind: "int", default: "3", help: "set a peer aside after this many failed dumps in a row (0: never)" },
  recoveryDeadlineMs: { flag: "recovery-deadline-ms", env: "DYN_EPP_RECOVERY_DEADLINE_MS", kind: "int", default: "0", help: "give up recovery after this long and start with an EMPTY index (0: wait for a peer)" },
  indexReserve: { flag: "index-reserve", env: "DYN_EPP_INDEX_RESERVE", kind: "bool", default: "true", help: "size the index's tables for the ranks' scraped num_gpu_blocks (summed) as they report it, so filling caches never stops ingestion for a table rebuild" },
  maxBlocksPerRank: { flag: "max-blocks-per-rank", env: "DYN_EPP_MAX_BLOCKS_PER_RANK", kind: "int", default: "1048576", help: "blocks a worker rank may hold in the index when its num_gpu_blocks is not known (0: no bound)" },
  peerToken: { flag: "peer-token", env: "DYN_EPP_PEER_TOKEN", kind: "string", help: "bearer token for /dump" },
  secureServing: { flag: "secure-serving", env: "DYN_SECURE_SERVING", kind: "bool", default: "true", help: "TLS (ALPN h2) on the ext_proc port; false: h2c" },
  tlsCertFile: { flag: "tls-cert-file", env: "DYN_EPP_TLS_CERT_FILE", kind: "string", help: "PEM certificate, reloaded when it changes (unset: a self-signed one)" },
  tlsKeyFile: { flag: "tls-key-file", env: "DYN_EPP_TLS_KEY_FILE", kind: "string", help: "PEM private key of --tls-cert-file" },
  podIp: { flag: "pod-ip", env: "POD_IP", kind: "string", help: "this replica's own IP (excluded from peers)" },
  model: { flag: "model", env: "DYN_EPP_MODEL", kind: "string", default: "default", help: "model name (Kubernetes mode)" },
  tenant: { flag: "tenant", env: "DYN_EPP_TENANT", kind: "string", default: "default", help: "tenant of the indexer key" },
  loraAdapters: { flag: "lora-adapters", env: "DYN_EPP_LORA_ADAPTERS", kind: "string", help: "LoRA adapter names served by the model, comma-separated (more are learned from events' lora_name)" },
  blockSize: { flag: "block-size", env: "DYN_EPP_BLOCK_SIZE", kind: "int", default: "16", help: "KV block size in tokens (Kubernetes mode)" },
  kvEventsPort: { flag: "kv-events-port", env: "DYN_EPP_KV_EVENTS_PORT", kind: "port", default: "5557", help: "workers' KV event port (rank r: +r)" },
  kvReplayPort: { flag: "kv-replay-port", env: "DYN_EPP_KV_REPLAY_PORT", kind: "port", help: "workers' KV replay port (rank r: +r)" },
  kvTopic: { flag: "kv-topic", env: "DYN_EPP_KV_TOPIC", kind: "string", default: "", help: "KV event topic" },
  kvHeartbeatMs: { flag: "kv-heartbeat-ms", env: "DYN_EPP_KV_HEARTBEAT_MS", kind: "int", default: String(LISTENER_HEARTBEAT.intervalMs), help: "ZMTP PING to a KV publisher this often; dropped and redialed after 3 silent intervals (0: off)" },
  kvMaxMessageBytes: { flag: "kv-max-message-bytes", env: "DYN_EPP_KV_MAX_MESSAGE_BYTES", kind: "int", default: String(DEFAULT_KV_MAX_MESSAGE_SIZE), help: "largest KV-event message read from a worker; a larger one closes that connection and is counted (default: a 1M-token step of a hybrid model, see the kv-events README)" },
  dpSize: { flag: "dp-size", env: "DYN_EPP_DP_SIZE", kind: "int", default: "1", help: "data-parallel ranks per worker (Kubernetes mode)" },
  intentDiscovery: { flag: "intent-discovery", env: "DYN_EPP_INTENT_DISCOVERY", kind: "string", help: "attach workers' KV intents: kubernetes | http://HOST:PORT (off when unset)" },
  kvHost: { flag: "kv-host", env: "DYN_EPP_KV_HOST", kind: "string", default: "dynamo-epp", help: "host instance workers address their intents to" },
  tokenizerDir: { flag: "tokenizer-dir", env: "DYN_EPP_TOKENIZER_DIR", kind: "string", help: "tokenizer.json directory" },
  tokenizerThreads: { flag: "tokenizer-threads", env: "DYN_EPP_TOKENIZER_THREADS", kind: "int", help: "worker threads that render and tokenize off the decision thread (default: the process's CPU limit, its cgroup quota; 0: on the event loop)" },
  tokenizeBudgetMs: { flag: "tokenize-budget-ms", env: "DYN_EPP_TOKENIZE_BUDGET_MS", kind: "int", default: "50", help: "a pick whose tokenization would take longer is routed on the prefix already known (Envoy's message_timeout is 200 ms)" },
  prefillLoadScale: { flag: "prefill-load-scale", env: "DYN_EPP_PREFILL_LOAD_SCALE", kind: "number", default: String(DEFAULT_WEIGHTS.prefillLoadScale), help: "cost weight of blocks to prefill" },
  decodeLoadScale: { flag: "decode-load-scale", env: "DYN_EPP_DECODE_LOAD_SCALE", kind: "number", default: String(DEFAULT_WEIGHTS.decodeLoadScale), help: "cost weight of active blocks" },
  costShape: { flag: "cost-shape", env: "DYN_EPP_COST_SHAPE", kind: "string", default: DEFAULT_SHAPE.kind, help: "shape of the weights cost: score (prefix-weight x overlap share + load-weight x min-max normalised in-flight load) | blocks (prefill-load-scale x blocks to prefill + decode-load-scale x active blocks)" },
  prefixWeight: { flag: "prefix-weight", env: "DYN_EPP_PREFIX_WEIGHT", kind: "number", default: String(SCORE_SHAPE.prefix), help: "score shape: weight of the cached share of the request's blocks" },
  loadWeight: { flag: "load-weight", env: "DYN_EPP_LOAD_WEIGHT", kind: "number", default: String(SCORE_SHAPE.load), help: "score shape: weight of the normalised in-flight load" },
  loadBy: { flag: "load-by", env: "DYN_EPP_LOAD_BY", kind: "string", default: SCORE_SHAPE.loadBy, help: "score shape: in-flight load as requests | blocks" },
  prefixCapBlocks: { flag: "prefix-cap-blocks", env: "DYN_EPP_PREFIX_CAP_BLOCKS", kind: "int", default: String(SCORE_SHAPE.prefixCapBlocks), help: "score shape: the cached share is of at most this many leading blocks (0: all)" },
  queueWeight: { flag: "queue-weight", env: "DYN_EPP_QUEUE_WEIGHT", kind: "number", default: "0", help: "cost per scraped waiting request" },
  queueThreshold: { flag: "queue-threshold", env: "DYN_EPP_QUEUE_THRESHOLD", kind: "int", default: "0", help: "skip workers with more waiting requests (0: off)" },
  cost: { flag: "cost", env: "DYN_EPP_COST", kind: "string", default: DEFAULT_COST, help: "routing cost: latency (lowest predicted TTFT, calibrated online, plus the delay its prefill adds to the requests behind it) | weights (the cost shape's weights)" },
  latencyFollowerWeight: { flag: "latency-follower-weight", env: "DYN_EPP_LATENCY_FOLLOWER_WEIGHT", kind: "number", default: String(DEFAULT_FOLLOWER_WEIGHT), help: "latency cost: weight of the delay a request's own prefill adds to each request queued behind it, where the caches hold their working set (0: greedy, its own TTFT alone)" },
  latencyAwayWeight: { flag: "latency-away-weight", env: "DYN_EPP_LATENCY_AWAY_WEIGHT", kind: "number", default: String(DEFAULT_AWAY_WEIGHT), help: "latency cost: share of the request's whole prefill time added on the workers outside this replica's home share when replica-agg has peers, so replicas deciding at the same instant split near-equal workers instead of herding onto one (0: off)" },
  latencyFollowerWeightMax: { flag: "latency-follower-weight-max", env: "DYN_EPP_LATENCY_FOLLOWER_WEIGHT_MAX", kind: "number", default: String(DEFAULT_FOLLOWER_WEIGHT_MAX), help: "latency cost: the follower weight where the workers recompute what they evicted; it moves from --latency-follower-weight to this with the eviction regret seen in their KV events (equal to --latency-follower-weight: a fixed weight; below it: raised to it)" },
  inflightPrefix: { flag: "inflight-prefix", env: "DYN_EPP_INFLIGHT_PREFIX", kind: "bool", default: String(INFLIGHT_PREFIX_DEFAULT), help: "count the blocks of requests routed to a worker and not yet ended as overlap there (the index learns them only after their prefill)" },
  inflightPrefixMaxBlocks: { flag: "inflight-prefix-max-blocks", env: "DYN_EPP_INFLIGHT_PREFIX_MAX_BLOCKS", kind: "int", default: String(DEFAULT_PENDING.maxBlocks), help: "most in-flight prefix blocks held (oldest requests' leave first)" },
  inflightPrefixTtlMs: { flag: "inflight-prefix-ttl-ms", env: "DYN_EPP_INFLIGHT_PREFIX_TTL_MS", kind: "int", default: String(DEFAULT_PENDING.ttlMs), help: "an in-flight prefix leaves after this long even if its request never ended" },
  pdThresholdTokens: { flag: "pd-threshold-tokens", env: "DYN_EPP_PD_THRESHOLD_TOKENS", kind: "int", default: String(DEFAULT_PD_THRESHOLD_TOKENS), help: "with prefill-role workers: name a prefill worker (x-prefiller-host-port) when the decode worker would prefill at least this many uncached tokens itself (llm-d's nonCachedTokens; 0: never)" },
  explain: { flag: "explain", env: "DYN_EPP_EXPLAIN", kind: "bool", default: "false", help: "explain every decision in an x-kv-epp-decision header (else only requests sending x-kv-epp-explain: 1)" },
  conformanceTestHooks: { flag: "conformance-test-hooks", env: "DYN_EPP_CONFORMANCE_TEST_HOOKS", kind: "bool", default: "false", help: "GAIE conformance suite hooks: a request's test-epp-endpoint-selection header picks its candidates, responses echo the served and selected endpoints (x-conformance-test-*); test clusters only, any client could steer its requests" },
  temperature: { flag: "temperature", env: "DYN_EPP_TEMPERATURE", kind: "number", default: "0", help: "softmax temperature (0: argmin)" },
  scrapeIntervalMs: { flag: "scrape-interval-ms", env: "DYN_EPP_SCRAPE_INTERVAL_MS", kind: "int", default: "1000", help: "vLLM /metrics scrape period (0: off)" },
  fallbackEndpoints: { flag: "fallback-endpoints", env: "DYN_EPP_FALLBACK_ENDPOINTS", kind: "int", default: "0", help: "also name this many next-best distinct endpoints after the pick, for the gateway's retries" },
  objectivePriorities: { flag: "objective-priorities", env: "DYN_EPP_OBJECTIVE_PRIORITIES", kind: "string", default: "", help: "InferenceObjective priorities, name=priority,... (x-gateway-inference-objective; < 0: sheddable)" },
  maxInflight: { flag: "max-inflight", env: "DYN_EPP_MAX_INFLIGHT", kind: "int", default: "0", help: "shed (429) above this many in-flight requests (0: off)" },
  bodyMode: { flag: "body-mode", env: "DYN_EPP_BODY_MODE", kind: "string", default: "auto", help: "ext_proc request body mode: auto|buffered|full-duplex" },
  shutdownDelayMs: { flag: "shutdown-delay-ms", env: "DYN_EPP_SHUTDOWN_DELAY_MS", kind: "int", default: "0", help: "on SIGTERM, keep serving this long after NOT_SERVING before draining" },
  logLevel: { flag: "log-level", env: "DYN_EPP_LOG_LEVEL", kind: "string", default: "info", help: "pino level" },
} as const satisfies Record<string, Option>;

type Key = keyof typeof OPTIONS;

// Decimal digits only: Number() would also take "", " ", "0x10" and "1e3".
const decimal = z.string().regex(/^\d+$/).transform(Number);
const port = decimal.pipe(z.number().max(65535));
/** Also bounds millisecond options: timers wrap past 2^31-1 ms and fire at once. */
const int = decimal.pipe(z.number().max(2 ** 31 - 1));
const bool = z.enum(["true", "false", "1", "0", "yes", "no"]).transform((v) => v === "true" || v === "1" || v === "yes");
const KIND_SCHEMA: Record<Kind, z.ZodType> = {
  string: z.string(),
  port,
  int,
  number: z.string().regex(/^(\d+(\.\d*)?|\.\d+)$/).transform(Number),
  bool,
};

const portInRange = (s: string) => Number(s.slice(s.lastIndexOf(":") + 1)) <= 65535;
const tcpEndpoint = z.string().regex(/^tcp:\/\/[^\s:]+:\d+$/, "expected tcp://host:port").refine(portInRange, "port above 65535");
const ipPort = z.string().regex(/^[^\s:]+:\d+$/, "expected ip:port").refine(portInRange, "port above 65535");
const WorkerEntry = z.object({
  id: z.string().min(1),
  /** One API server, or several (vLLM's external DP load balancing): `dpSize` ranks behind each, in order. */
  address: z.union([ipPort, z.array(ipPort).min(1).refine((a) => new Set(a).size === a.length, "addresses must be distinct")]),
  kvEvents: tcpEndpoint,
  replay: tcpEndpoint.optional(),
  dpSize: z.number().int().min(1).default(1),
  /** Global DP rank of the worker's first rank (vLLM's --data-parallel-start-rank on a multi-node DP group). */
  dpStartRank: z.number().int().min(0).max(4095).default(0),
  /** The EPP binds kvEvents (+ rank) and the worker's PUBs connect to it (vLLM with a non-wildcard endpoint). */
  kvEventsBind: z.boolean().default(false),
  metrics: z.string().url().optional(),
  /**
   * vLLM's DP load balancing (DpLbMode), which sets the x-data-parallel-rank numbering: internal (the
   * default for one address: global ranks), hybrid or external (the server's own ranks from 0).
   */
  dpLb: z.enum(DP_LB_MODES as [DpLbMode, ...DpLbMode[]]).optional(),
  /** Prefill/decode disaggregation: prefill | decode | both (or llm-d's label spelling prefill-decode); absent: a destination only. */
  role: z.enum(["prefill", "decode", "both", "prefill-decode"]).transform((v) => roleOfLabel(v)!).optional(),
}).superRefine((w, ctx) => {
  if (w.dpLb === "internal" && typeof w.address !== "string")
    ctx.addIssue({ code: "custom", path: ["dpLb"], message: "internal DP load balancing has one API server for every rank: give one address, or dpLb hybrid/external for one server per address" });
  if (w.dpLb === "external" && w.dpSize > 1)
    ctx.addIssue({ code: "custom", path: ["dpLb"], message: "external DP load balancing runs one API server per rank: dpSize must be 1 (list one address per rank), or use dpLb hybrid" });
});
const PeerEntry = z.union([
  z.string().url(),
  z.object({ url: z.string().url(), replicaAgg: z.string().regex(/^tcp:\/\/(\[[^\]\s]+\]|[^\s:/\[\]]+):\d+$/, "expected tcp://host:port").optional() }),
]);
export const StaticFile = z.object({
  model: z.string().min(1),
  tenant: z.string().min(1).default("default"),
  blockSize: z.number().int().min(1).max(4096),
  tokenizerDir: z.string().optional(),
  loraAdapters: z.array(z.string().min(1)).default([]),
  workers: z
    .array(WorkerEntry)
    .default([])
    .refine((ws) => new Set(ws.map((w) => w.id)).size === ws.length, "worker ids must be unique"),
  peers: z.array(PeerEntry).default([]),
});
export type StaticWorker = z.infer<typeof WorkerEntry>;
export type StaticFileConfig = z.infer<typeof StaticFile>;

/** "a, b,,c" -> ["a", "b", "c"]. */
function splitList(v: string | undefined): string[] {
  return (v ?? "").split(",").map((x) => x.trim()).filter((x) => x.length > 0);
}

export type BodyMode = "auto" | "buffered" | "full-duplex";

/** The replica-agg endpoint a static peer gets when it names none (docs/CONTRACTS.md §11). */
export const DEFAULT_REPLICA_AGG_PORT = 9092;

export type ReplicaAggConfig =
  | { mode: "off" }
  | {
      mode: "on";
      heartbeatMs: number;
      timeoutMs: number;
      peers:
        | { mode: "static"; endpoints: string[] }
        | { mode: "kubernetes"; peerService: string; namespace: string }
        | { mode: "none" };
    };

export type EppConfig = {
  listen: string;
  ports: { grpc: number; grpcHealth: number; metrics: number; replicaAgg: number; selection: number };
  /** grpc.health.v1.Health/Check on the ext_proc port as well. */
  healthOnExtProc: boolean;
  /** `loraAdapters`: names a request's `model` may give to run in an adapter's identity. */
  model: { name: string; tenant: string; blockSize: number; loraAdapters: string[] };
  tokenizerDir?: string;
  /** Tokenizer pool threads (undefined: the CPU limit; 0: none, tokenize on the event loop) and the pick's tokenization budget. */
  tokenizerThreads?: number;
  tokenizeBudgetMs: number;
  workers:
    | { mode: "static"; list: StaticWorker[] }
    | { mode: "kubernetes"; poolName: string; namespace: string; kvEventsPort: number; kvReplayPort?: number; dpSize: number };
  kvTopic: string;
  /** ZMTP heartbeat interval of the KV listeners (see listenerHeartbeat); 0: off. */
  kvHeartbeatMs: number;
  kvMaxMessageBytes: number;
  /** Attachment intents (@kv-epp/intents), beside the static list or the pod informer. */
  intents?: { discovery: DiscoveryConfig; hostInstance: string };
  recovery:
    | { mode: "static"; peers: string[] }
    | { mode: "kubernetes"; peerService: string; namespace: string }
    | { mode: "disabled" };
  recoveryTimeoutMs: number;
  /** Explicit recovery staging budget; undefined: derived from the memory limit at start. */
  recoveryBudgetMiB?: number;
  /** Rate floor of a dump body (bytesPerSec 0: off). */
  recoveryMinRate: { bytesPerSec: number; windowMs: number };
  recoveryPeerMaxFailures: number;
  /** 0: no deadline. */
  recoveryDeadlineMs: number;
  /** Per-rank block bound when the worker's own num_gpu_blocks is unknown; 0: none. */
  maxBlocksPerRank: number;
  /** Reserve the index's tables for the pool's scraped KV capacity (ModelIndexes.reserve). */
  indexReserve: boolean;
  /** Bound on waiting for KV listeners to connect before recovery (subscribe first). */
  subscribeWaitMs: number;
  replicaAgg: ReplicaAggConfig;
  peerToken?: string;
  podIp?: string;
  /** ext_proc transport: h2c, TLS with a certificate made at start, or TLS with (reloaded) files. */
  tls: { mode: "off" } | { mode: "self-signed" } | { mode: "files"; certFile: string; keyFile: string };
  picker: {
    prefillLoadScale: number;
    decodeLoadScale: number;
    queueWeight: number;
    queueThreshold: number;
    temperature: number;
    cost: CostModel;
    /**
     * The latency cost's weight of the delay a request's prefill adds to the requests behind it
     * (routing latency.ts): `base` where the caches hold their working set, up to `max` with the
     * eviction regret (routing eviction-regret.ts); max >= base.
     */
    latencyFollowerWeight: FollowerRange;
    /** The latency cost's charge on a worker outside this replica's home share, in prefills of the request (routing home.ts). */
    awayWeight: number;
    /** In-flight prefixes (routing pending.ts); off: the index's overlap alone. */
    inflightPrefix: { mode: "off" } | { mode: "on"; maxBlocks: number; ttlMs: number };
    shape: CostShape;
    /** Prefill/decode disaggregation's decider threshold, in uncached tokens on the decode worker (routing disagg.ts); 0: never. */
    pdThresholdTokens: number;
  };
  explain: boolean;
  /** GAIE's conformance-suite hooks (extproc/conformance.ts); off outside test clusters. */
  conformanceTestHooks: boolean;
  scrapeIntervalMs: number;
  maxInflight: number;
  /** Next-best distinct endpoints sent after the pick (GAIE protocol's ordered list). */
  fallbackEndpoints: number;
  /** x-gateway-inference-objective name -> priority. */
  objectivePriorities: Map<string, number>;
  bodyMode: BodyMode;
  shutdownDelayMs: number;
  logLevel: string;
};

/** The replica-agg endpoint of a static peer (docs/CONTRACTS.md §11). */
export function staticPeerEndpoint(peer: string | { url: string; replicaAgg?: string }, defaultPort: number): string {
  if (typeof peer !== "string" && peer.replicaAgg) return peer.replicaAgg;
  const host = new URL(typeof peer === "string" ? peer : peer.url).hostname; // IPv6 stays bracketed
  return `tcp://${host}:${defaultPort}`;
}

function raw(argv: string[], env: Record<string, string | undefined>): Record<Key, { value?: string; source: string }> {
  const options = Object.fromEntries(
    Object.values(OPTIONS).map((o) => [o.flag, { type: o.kind === "bool" ? ("string" as const) : ("string" as const) }]),
  );
  let values: Record<string, unknown>;
  try {
    // A bare boolean flag (--secure-serving) means =true, so every flag has one shape: a value.
    const bools = new Set(Object.values(OPTIONS).filter((o: Option) => o.kind === "bool").map((o) => `--${o.flag}`));
    const args = argv.map((a, i) => (bools.has(a) && (argv[i + 1] === undefined || argv[i + 1]!.startsWith("--")) ? `${a}=true` : a));
    values = parseArgs({ args, options, strict: true, allowPositionals: false }).values;
  } catch (e) {
    throw new ConfigError((e as Error).message);
  }
  const out = {} as Record<Key, { value?: string; source: string }>;
  for (const [key, o] of Object.entries(OPTIONS) as [Key, Option][]) {
    const fromFlag = values[o.flag] as string | undefined;
    if (fromFlag !== undefined) out[key] = { value: fromFlag, source: `--${o.flag}` };
    else if (env[o.env] !== undefined && env[o.env] !== "") out[key] = { value: env[o.env], source: `${o.env} (--${o.flag})` };
    else out[key] = { value: o.default, source: `--${o.flag} default` };
  }
  return out;
}

function value<T>(r: { value?: string; source: string }, kind: Kind): T | undefined {
  if (r.value === undefined) return undefined;
  const parsed = KIND_SCHEMA[kind].safeParse(r.value);
  if (!parsed.success) throw new ConfigError(`invalid value for ${r.source}: ${JSON.stringify(r.value)} (expected ${kind})`);
  return parsed.data as T;
}

export function loadStaticFile(path: string): StaticFileConfig {
  let text: string;
  try {
    text = readFileSync(path, "utf8");
  } catch (e) {
    throw new ConfigError(`cannot read --config ${JSON.stringify(path)}: ${(e as Error).message}`);
  }
  let doc: unknown;
  try {
    doc = path.endsWith(".json") ? JSON.parse(text) : parseYaml(text);
  } catch (e) {
    throw new ConfigError(`cannot parse --config ${JSON.stringify(path)}: ${(e as Error).message}`);
  }
  const parsed = StaticFile.safeParse(doc);
  if (!parsed.success) {
    const issue = parsed.error.issues[0]!;
    const at = issue.path.join(".");
    let got: unknown = doc;
    for (const p of issue.path) got = (got as Record<PropertyKey, unknown> | undefined)?.[p as PropertyKey];
    throw new ConfigError(`invalid --config ${JSON.stringify(path)}: ${at || "(root)"} = ${JSON.stringify(got)}: ${issue.message}`);
  }
  return parsed.data;
}

/** Parses flags and environment into an EppConfig; throws ConfigError naming the bad flag and value. */
export function parseConfig(argv: string[], env: Record<string, string | undefined>): EppConfig {
  const r = raw(argv, env);
  const get = <T>(k: Key): T | undefined => value<T>(r[k], OPTIONS[k].kind);
  // Every value is checked before cross-field rules, so the first message names the bad flag.
  for (const k of Object.keys(OPTIONS) as Key[]) get(k);

  const costModel = get<string>("cost")!;
  if (costModel !== "weights" && costModel !== "latency")
    throw new ConfigError(`invalid value for ${r.cost.source}: ${JSON.stringify(costModel)} (expected weights|latency)`);
  const followerBase = get<number>("latencyFollowerWeight")!;
  if (followerBase < 0) throw new ConfigError(`invalid value for ${r.latencyFollowerWeight.source}: ${followerBase} (expected >= 0)`);
  const awayWeight = get<number>("latencyAwayWeight")!;
  if (awayWeight < 0) throw new ConfigError(`invalid value for ${r.latencyAwayWeight.source}: ${awayWeight} (expected >= 0)`);
  if (get<number>("inflightPrefixMaxBlocks") === 0) throw new ConfigError(`invalid value for ${r.inflightPrefixMaxBlocks.source}: 0 (turn in-flight prefixes off with --inflight-prefix false)`);
  const shapeKind = get<string>("costShape")!;
  if (shapeKind !== "score" && shapeKind !== "blocks")
    throw new ConfigError(`invalid value for ${r.costShape.source}: ${JSON.stringify(shapeKind)} (expected score|blocks)`);
  const loadBy = get<string>("loadBy")!;
  if (loadBy !== "requests" && loadBy !== "blocks")
    throw new ConfigError(`invalid value for ${r.loadBy.source}: ${JSON.stringify(loadBy)} (expected requests|blocks)`);
  const shape: CostShape =
    shapeKind === "blocks"
      ? { kind: "blocks" }
      : { kind: "score", prefix: get<number>("prefixWeight")!, load: get<number>("loadWeight")!, loadBy, prefixCapBlocks: get<number>("prefixCapBlocks")! };
  const bodyMode = get<string>("bodyMode")!;
  if (!["auto", "buffered", "full-duplex"].includes(bodyMode))
    throw new ConfigError(`invalid value for ${r.bodyMode.source}: ${JSON.stringify(bodyMode)} (expected auto|buffered|full-duplex)`);
  const logLevel = get<string>("logLevel")!;
  if (!["fatal", "error", "warn", "info", "debug", "trace", "silent"].includes(logLevel))
    throw new ConfigError(`invalid value for ${r.logLevel.source}: ${JSON.stringify(logLevel)}`);
  const blockSize = get<number>("blockSize")!;
  if (blockSize < 1) throw new ConfigError(`invalid value for ${r.blockSize.source}: ${JSON.stringify(r.blockSize.value)} (expected >= 1)`);
  const dpSize = get<number>("dpSize")!;
  if (dpSize < 1) throw new ConfigError(`invalid value for ${r.dpSize.source}: ${JSON.stringify(r.dpSize.value)} (expected >= 1)`);
  // Rank r listens on the base port + r: the last rank's port must exist.
  for (const k of ["kvEventsPort", "kvReplayPort"] as const) {
    const base = get<number>(k);
    if (base !== undefined && base + dpSize - 1 > 65535)
      throw new ConfigError(`invalid value for ${r[k].source}: ${JSON.stringify(r[k].value)} (rank ${dpSize - 1} of --dp-size ${dpSize} would be on port ${base + dpSize - 1})`);
  }

  const file = get<string>("config");
  const staticFile = file ? loadStaticFile(file) : undefined;
  const poolName = get<string>("poolName");
  const namespace = get<string>("poolNamespace")!;
  if (!staticFile && !poolName) throw new ConfigError("no workers: give --config FILE (static mode) or --pool-name NAME (Kubernetes mode)");

  const intentDiscovery = get<string>("intentDiscovery");
  let intents: EppConfig["intents"];
  if (intentDiscovery) {
    try {
      intents = { discovery: parseDiscoveryConfig(intentDiscovery, env), hostInstance: get<string>("kvHost")! };
    } catch (e) {
      throw new ConfigError(`invalid value for ${r.intentDiscovery.source}: ${(e as Error).message}`);
    }
  }

  const peerService = get<string>("peerService");
  const secure = get<boolean>("secureServing")!;
  const certFile = get<string>("tlsCertFile");
  const keyFile = get<string>("tlsKeyFile");
  if (!certFile !== !keyFile) throw new ConfigError("--tls-cert-file and --tls-key-file go together (neither: a self-signed certificate)");
  if (!secure && certFile) throw new ConfigError(`--tls-cert-file is given but ${r.secureServing.source} is false`);

  const replicaAggPort = get<number>("replicaAggPort")!;
  let replicaAgg: ReplicaAggConfig = { mode: "off" };
  if (get<boolean>("replicaAgg")) {
    const heartbeatMs = get<number>("replicaAggHeartbeatMs")!;
    const timeoutMs = get<number>("replicaAggTimeoutMs")!;
    if (heartbeatMs < 1) throw new ConfigError(`invalid value for ${r.replicaAggHeartbeatMs.source}: ${JSON.stringify(r.replicaAggHeartbeatMs.value)} (expected >= 1)`);
    // A timeout within one heartbeat would drop every peer between two snapshots.
    if (timeoutMs <= heartbeatMs)
      throw new ConfigError(`invalid value for ${r.replicaAggTimeoutMs.source}: ${JSON.stringify(r.replicaAggTimeoutMs.value)} (expected > the heartbeat, ${heartbeatMs} ms)`);
    const peerPort = replicaAggPort || DEFAULT_REPLICA_AGG_PORT;
    replicaAgg = {
      mode: "on",
      heartbeatMs,
      timeoutMs,
      peers: peerService
        ? { mode: "kubernetes", peerService, namespace }
        : staticFile && staticFile.peers.length > 0
          ? { mode: "static", endpoints: staticFile.peers.map((p) => staticPeerEndpoint(p, peerPort)) }
          : { mode: "none" },
    };
  }

  return {
    listen: get<string>("listen")!,
    ports: {
      grpc: get<number>("grpcPort")!,
      grpcHealth: get<number>("grpcHealthPort")!,
      metrics: get<number>("metricsPort")!,
      replicaAgg: replicaAggPort,
      selection: get<number>("selectionPort")!,
    },
    healthOnExtProc: get<boolean>("healthChecking")!,
    model: {
      ...(staticFile
        ? { name: staticFile.model, tenant: staticFile.tenant, blockSize: staticFile.blockSize }
        : { name: get<string>("model")!, tenant: get<string>("tenant")!, blockSize }),
      loraAdapters: [...new Set([...(staticFile?.loraAdapters ?? []), ...splitList(get<string>("loraAdapters"))])],
    },
    tokenizerDir: get<string>("tokenizerDir") ?? staticFile?.tokenizerDir,
    tokenizerThreads: get<number>("tokenizerThreads"),
    tokenizeBudgetMs: get<number>("tokenizeBudgetMs")!,
    workers: staticFile
      ? { mode: "static", list: staticFile.workers }
      : {
          mode: "kubernetes",
          poolName: poolName!,
          namespace,
          kvEventsPort: get<number>("kvEventsPort")!,
          kvReplayPort: get<number>("kvReplayPort"),
          dpSize,
        },
    kvTopic: get<string>("kvTopic")!,
    kvHeartbeatMs: get<number>("kvHeartbeatMs")!,
    kvMaxMessageBytes: get<number>("kvMaxMessageBytes")!,
    intents,
    recovery: peerService
      ? { mode: "kubernetes", peerService, namespace }
      : staticFile && staticFile.peers.length > 0
        ? { mode: "static", peers: staticFile.peers.map((p) => (typeof p === "string" ? p : p.url)) }
        : { mode: "disabled" },
    recoveryTimeoutMs: get<number>("recoveryTimeoutMs")!,
    recoveryBudgetMiB: get<number>("recoveryBudgetMiB"),
    recoveryMinRate: { bytesPerSec: get<number>("recoveryMinRate")!, windowMs: get<number>("recoveryRateWindowMs")! },
    recoveryPeerMaxFailures: get<number>("recoveryPeerMaxFailures")!,
    recoveryDeadlineMs: get<number>("recoveryDeadlineMs")!,
    maxBlocksPerRank: get<number>("maxBlocksPerRank")!,
    indexReserve: get<boolean>("indexReserve")!,
    subscribeWaitMs: get<number>("subscribeWaitMs")!,
    replicaAgg,
    peerToken: get<string>("peerToken"),
    podIp: get<string>("podIp"),
    tls: !secure ? { mode: "off" } : certFile ? { mode: "files", certFile, keyFile: keyFile! } : { mode: "self-signed" },
    picker: {
      prefillLoadScale: get<number>("prefillLoadScale")!,
      decodeLoadScale: get<number>("decodeLoadScale")!,
      queueWeight: get<number>("queueWeight")!,
      queueThreshold: get<number>("queueThreshold")!,
      temperature: get<number>("temperature")!,
      cost: costModel,
      latencyFollowerWeight: followerRange(followerBase, get<number>("latencyFollowerWeightMax")!),
      awayWeight,
      inflightPrefix: get<boolean>("inflightPrefix")
        ? { mode: "on", maxBlocks: get<number>("inflightPrefixMaxBlocks")!, ttlMs: get<number>("inflightPrefixTtlMs")! }
        : { mode: "off" },
      shape,
      pdThresholdTokens: get<number>("pdThresholdTokens")!,
    },
    explain: get<boolean>("explain")!,
    conformanceTestHooks: get<boolean>("conformanceTestHooks")!,
    scrapeIntervalMs: get<number>("scrapeIntervalMs")!,
    maxInflight: get<number>("maxInflight")!,
    fallbackEndpoints: get<number>("fallbackEndpoints")!,
    objectivePriorities: parsePriorities(get<string>("objectivePriorities")!, r.objectivePriorities.source),
    bodyMode: bodyMode as BodyMode,
    shutdownDelayMs: get<number>("shutdownDelayMs")!,
    logLevel,
  };
}

/** "name=priority,..." -> Map; a malformed entry names the flag. */
function parsePriorities(text: string, source: string): Map<string, number> {
  const out = new Map<string, number>();
  for (const entry of text.split(",").map((e) => e.trim()).filter(Boolean)) {
    const m = /^([^=\s]+)=([+-]?\d{1,9})$/.exec(entry);
    if (!m) throw new ConfigError(`invalid value for ${source}: ${JSON.stringify(entry)} (expected name=integer)`);
    out.set(m[1]!, Number(m[2]));
  }
  return out;
}

export function usage(): string {
  const lines = Object.values(OPTIONS).map(
    (o: Option) => `  --${o.flag.padEnd(22)} ${o.env.padEnd(34)} ${o.help}${o.default !== undefined ? ` (default ${JSON.stringify(o.default)})` : ""}`,
  );
  return `usage: bun run epp [flags]\n${lines.join("\n")}`;
}
