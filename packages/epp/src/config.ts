// The EPP's configuration, resolved once at the edge into a typed EppConfig: the options (options.ts)
// by @kv-epp/options' one rule, flag > DYN_EPP_* variable > config file > default, and the config file's
// workers and peers. Nothing below main.ts reads process.env or argv.
import { readFileSync } from "node:fs";
import { parse as parseYaml } from "yaml";
import { parseDiscoveryConfig, type DiscoveryConfig } from "@kv-epp/intents";
import { ConfigError, PRECEDENCE, resolveOptions, usageText, type Layer, type Resolved, type Values } from "@kv-epp/options";
import { routingSettings, type RoutingSettings } from "@kv-epp/routing";
import type { ChatEngine, ContentFormatOption, DisabledThinkingOption, InlineSystemOption, PreprocessorOptions } from "@kv-epp/tokenizer";
import { z } from "zod";
import { DP_LB_MODES, roleOfLabel, type DpLbMode } from "@kv-epp/protocol";
import { DEFAULT_REPLICA_AGG_PORT, EPP_OPTIONS, EPP_PROGRAM } from "./options.ts";

export { DEFAULT_REPLICA_AGG_PORT };

export { ConfigError };

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
/** The config file: the static workers and peers, and any option by its key (options.ts). */
export const StaticFile = z
  .object({
    workers: z
      .array(WorkerEntry)
      .default([])
      .refine((ws) => new Set(ws.map((w) => w.id)).size === ws.length, "worker ids must be unique"),
    peers: z.array(PeerEntry).default([]),
  })
  .catchall(z.unknown());
export type StaticWorker = z.infer<typeof WorkerEntry>;
export type StaticPeer = z.infer<typeof PeerEntry>;

export type BodyMode = Values<typeof EPP_OPTIONS>["bodyMode"];

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
  /** The workers' engine, whose chat rendering rules the preprocessors follow. */
  chatRendering: ChatEngine;
  /** The workers' vLLM --default-chat-template-kwargs (JSON text): every chat renders with them unless it sets its own. */
  defaultChatTemplateKwargs?: string;
  /** The workers' vLLM --exclude-tools-when-tool-choice-none. */
  excludeToolsWhenToolChoiceNone: boolean;
  /** The workers' --chat-template (vLLM's: a path or the template itself; SGLang's: a .jinja file or a conversation template). */
  chatTemplate?: string;
  /** The workers' SGLang --model-path (--model-path, else the model's name), from which SGLang may guess a conversation template. */
  modelPath: string;
  /** The workers' vLLM --chat-template-content-format. */
  chatTemplateContentFormat: ContentFormatOption;
  /** The workers' vLLM --trust-request-chat-template. */
  trustRequestChatTemplate: boolean;
  /** The workers' vLLM --response-role. */
  responseRole: string;
  /** The workers' vLLM --tokenizer-mode. */
  tokenizerMode: string;
  /** Where the workers' vLLM puts a Messages body's inline system messages. */
  anthropicInlineSystem: InlineSystemOption;
  /** The reasoning_effort the workers' vLLM gives a Messages body's disabled thinking. */
  anthropicDisabledThinkingEffort: DisabledThinkingOption;
  /** Tokenizer pool threads (undefined: defaultPoolSize, a CPU quota less one or else the CPUs, at most 8; 0: none, tokenize on the event loop) and the pick's tokenization budget. */
  tokenizerThreads?: number;
  /** Nice value of the tokenizer pool's threads (0: the decision thread's). */
  tokenizerNice: number;
  /** Time slice the decision thread and the tokenizer threads ask the kernel for, µs (0: its default). */
  threadSliceUs: number;
  /** The segment cache's bound for the process (the pool's members each a share); 0: no cache. */
  tokenizerCacheBytes: number;
  tokenizeBudgetMs: number;
  /** Route a long text as soon as its known prefix settles the pick (Picker.settles), not once it is all tokenized. */
  routeOnSettledPrefix: boolean;
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
  /** Routing's settings, from its options (routing options.ts). */
  picker: RoutingSettings;
  explain: boolean;
  /** GAIE's conformance-suite hooks (extproc/conformance.ts); off outside test clusters. */
  conformanceTestHooks: boolean;
  scrapeIntervalMs: number;
  maxInflight: number;
  /** Picks this slow are logged with their breakdown (0: never). */
  slowPickMs: number;
  /** Invented exchanges run through the decision path before the servers start (warm-decisions.ts; 0: none). */
  warmUpPicks: number;
  /** Bound on request-body bytes held across ext_proc streams; undefined: derived from the memory limit at start. */
  extProcBufferMaxBytes?: number;
  /** Next-best distinct endpoints sent after the pick (GAIE protocol's ordered list). */
  fallbackEndpoints: number;
  /** Each scored endpoint's score in the route's envoy.lb metadata (llm-d's --emit-endpoint-scores). */
  emitEndpointScores: boolean;
  /** x-gateway-inference-objective name -> priority. */
  objectivePriorities: Map<string, number>;
  /** The filter's request and response body modes, for streams that carry no protocol_config (extproc/assumed-modes.ts). */
  bodyMode: BodyMode;
  responseBodyMode: BodyMode;
  shutdownDelayMs: number;
  logLevel: string;
};

/** The replica-agg endpoint of a static peer (docs/CONTRACTS.md §11). */
export function staticPeerEndpoint(peer: string | { url: string; replicaAgg?: string }, defaultPort: number): string {
  if (typeof peer !== "string" && peer.replicaAgg) return peer.replicaAgg;
  const host = new URL(typeof peer === "string" ? peer : peer.url).hostname; // IPv6 stays bracketed
  return `tcp://${host}:${defaultPort}`;
}

type StaticFileConfig = { workers: StaticWorker[]; peers: StaticPeer[]; options: Layer };

/** Reads the config file: its workers and peers checked here, its options left to the one rule. */
export function loadStaticFile(path: string): StaticFileConfig {
  const label = `--config ${JSON.stringify(path)}`;
  let text: string;
  try {
    text = readFileSync(path, "utf8");
  } catch (e) {
    throw new ConfigError(`cannot read ${label}: ${(e as Error).message}`);
  }
  let doc: unknown;
  try {
    doc = path.endsWith(".json") ? JSON.parse(text) : parseYaml(text);
  } catch (e) {
    throw new ConfigError(`cannot parse ${label}: ${(e as Error).message}`);
  }
  const parsed = StaticFile.safeParse(doc ?? {});
  if (!parsed.success) {
    const issue = parsed.error.issues[0]!;
    const at = issue.path.join(".");
    let got: unknown = doc;
    for (const p of issue.path) got = (got as Record<PropertyKey, unknown> | undefined)?.[p as PropertyKey];
    throw new ConfigError(`invalid ${label}: ${at || "(root)"} = ${JSON.stringify(got)}: ${issue.message}`);
  }
  const { workers, peers, ...options } = parsed.data;
  return { workers, peers, options: { label, values: options } };
}

type Options = Resolved<typeof EPP_OPTIONS>;

/** Resolves flags, environment and the config file into an EppConfig; throws ConfigError naming the bad option, its source and value. */
export function parseConfig(argv: string[], env: Record<string, string | undefined>): EppConfig {
  // The file's path comes from a flag or the environment; then every option resolves over all three.
  const path = resolveOptions(EPP_OPTIONS, EPP_PROGRAM, { argv, env }).values.config;
  const file = path === undefined ? undefined : loadStaticFile(path);
  const r = resolveOptions(EPP_OPTIONS, EPP_PROGRAM, { argv, env, file: file?.options });
  const o = r.values;

  // Rank r listens on the base port + r: the last rank's port must exist.
  for (const k of ["kvEventsPort", "kvReplayPort"] as const) {
    const base = o[k];
    if (base !== undefined && base + o.dpSize - 1 > 65535) r.fail(k, `rank ${o.dpSize - 1} of --dp-size ${o.dpSize} would be on port ${base + o.dpSize - 1}`);
  }
  let workers: EppConfig["workers"];
  if (file) workers = { mode: "static", list: file.workers };
  else if (o.poolName) workers = { mode: "kubernetes", poolName: o.poolName, namespace: o.poolNamespace, kvEventsPort: o.kvEventsPort, kvReplayPort: o.kvReplayPort, dpSize: o.dpSize };
  else throw new ConfigError("no workers: give --config FILE (static mode) or --pool-name NAME (Kubernetes mode)");

  let intents: EppConfig["intents"];
  if (o.intentDiscovery) {
    try {
      intents = { discovery: parseDiscoveryConfig(o.intentDiscovery, env), hostInstance: o.kvHost };
    } catch (e) {
      r.fail("intentDiscovery", (e as Error).message);
    }
  }

  const { tlsCertFile: certFile, tlsKeyFile: keyFile } = o;
  if (!certFile !== !keyFile) throw new ConfigError("--tls-cert-file and --tls-key-file go together (neither: a self-signed certificate)");
  if (!o.secureServing && certFile) throw new ConfigError(`--tls-cert-file is given but ${r.source("secureServing")} is false`);
  const tls: EppConfig["tls"] = !o.secureServing ? { mode: "off" } : certFile && keyFile ? { mode: "files", certFile, keyFile } : { mode: "self-signed" };

  const peers = file?.peers ?? [];
  let replicaAgg: ReplicaAggConfig = { mode: "off" };
  if (o.replicaAgg) {
    // A timeout within one heartbeat would drop every peer between two snapshots.
    if (o.replicaAggTimeoutMs <= o.replicaAggHeartbeatMs) r.fail("replicaAggTimeoutMs", `expected > the heartbeat, ${o.replicaAggHeartbeatMs} ms`);
    const peerPort = o.replicaAggPort || DEFAULT_REPLICA_AGG_PORT;
    replicaAgg = {
      mode: "on",
      heartbeatMs: o.replicaAggHeartbeatMs,
      timeoutMs: o.replicaAggTimeoutMs,
      peers: o.peerService
        ? { mode: "kubernetes", peerService: o.peerService, namespace: o.poolNamespace }
        : peers.length > 0
          ? { mode: "static", endpoints: peers.map((p) => staticPeerEndpoint(p, peerPort)) }
          : { mode: "none" },
    };
  }

  return {
    listen: o.listen,
    ports: { grpc: o.grpcPort, grpcHealth: o.grpcHealthPort, metrics: o.metricsPort, replicaAgg: o.replicaAggPort, selection: o.selectionPort },
    healthOnExtProc: o.healthChecking,
    model: { name: o.model, tenant: o.tenant, blockSize: o.blockSize, loraAdapters: [...new Set(o.loraAdapters)] },
    tokenizerDir: o.tokenizerDir,
    chatRendering: o.chatRendering,
    defaultChatTemplateKwargs: o.defaultChatTemplateKwargs,
    excludeToolsWhenToolChoiceNone: o.excludeToolsWhenToolChoiceNone,
    chatTemplate: o.chatTemplate,
    modelPath: o.modelPath ?? o.model,
    chatTemplateContentFormat: o.chatTemplateContentFormat,
    trustRequestChatTemplate: o.trustRequestChatTemplate,
    responseRole: o.responseRole,
    tokenizerMode: o.tokenizerMode,
    anthropicInlineSystem: o.anthropicInlineSystem,
    anthropicDisabledThinkingEffort: o.anthropicDisabledThinkingEffort,
    tokenizerThreads: o.tokenizerThreads,
    tokenizerNice: o.tokenizerNice,
    threadSliceUs: o.threadSliceUs,
    tokenizerCacheBytes: o.tokenizerCacheBytes,
    tokenizeBudgetMs: o.tokenizeBudgetMs,
    routeOnSettledPrefix: o.routeOnSettledPrefix,
    workers,
    kvTopic: o.kvTopic,
    kvHeartbeatMs: o.kvHeartbeatMs,
    kvMaxMessageBytes: o.kvMaxMessageBytes,
    intents,
    recovery: o.peerService
      ? { mode: "kubernetes", peerService: o.peerService, namespace: o.poolNamespace }
      : peers.length > 0
        ? { mode: "static", peers: peers.map((p) => (typeof p === "string" ? p : p.url)) }
        : { mode: "disabled" },
    recoveryTimeoutMs: o.recoveryTimeoutMs,
    recoveryBudgetMiB: o.recoveryBudgetMib,
    recoveryMinRate: { bytesPerSec: o.recoveryMinRateBytes, windowMs: o.recoveryRateWindowMs },
    recoveryPeerMaxFailures: o.recoveryPeerMaxFailures,
    recoveryDeadlineMs: o.recoveryDeadlineMs,
    maxBlocksPerRank: o.maxBlocksPerRank,
    indexReserve: o.indexReserve,
    subscribeWaitMs: o.subscribeWaitMs,
    replicaAgg,
    peerToken: o.peerToken,
    podIp: o.podIp,
    tls,
    picker: routingSettings(o),
    explain: o.explain,
    conformanceTestHooks: o.conformanceTestHooks,
    scrapeIntervalMs: o.scrapeIntervalMs,
    maxInflight: o.maxInflight,
    slowPickMs: o.slowPickMs,
    warmUpPicks: o.warmUpPicks,
    extProcBufferMaxBytes: o.extProcBufferMaxBytes,
    fallbackEndpoints: o.fallbackEndpoints,
    emitEndpointScores: o.emitEndpointScores,
    objectivePriorities: parsePriorities(r),
    bodyMode: o.bodyMode,
    responseBodyMode: o.responseBodyMode,
    shutdownDelayMs: o.shutdownDelayMs,
    logLevel: o.logLevel,
  };
}

/** "name=priority,..." -> Map; a malformed entry is named. */
function parsePriorities(r: Options): Map<string, number> {
  const out = new Map<string, number>();
  for (const entry of r.values.objectivePriorities.split(",").map((e) => e.trim()).filter(Boolean)) {
    const m = /^([^=\s]+)=([+-]?\d{1,9})$/.exec(entry);
    if (!m) r.fail("objectivePriorities", `${JSON.stringify(entry)} (expected name=integer)`);
    out.set(m[1]!, Number(m[2]));
  }
  return out;
}

/**
 * What every preprocessor of the EPP is built with, on the event loop and in each tokenizer pool member: the
 * tokenizer, the workers' engine and their flags that change the prompt they render, and the segment cache's bound
 * (the pool splits it between its members).
 */
export function preprocessorOptions(cfg: EppConfig): Omit<PreprocessorOptions, "registry"> {
  return {
    tokenizerDir: cfg.tokenizerDir,
    chatRendering: cfg.chatRendering,
    model: cfg.model.name,
    defaultChatTemplateKwargs: cfg.defaultChatTemplateKwargs,
    excludeToolsWhenToolChoiceNone: cfg.excludeToolsWhenToolChoiceNone,
    chatTemplate: cfg.chatTemplate,
    modelPath: cfg.modelPath,
    chatTemplateContentFormat: cfg.chatTemplateContentFormat,
    trustRequestChatTemplate: cfg.trustRequestChatTemplate,
    responseRole: cfg.responseRole,
    tokenizerMode: cfg.tokenizerMode,
    anthropicInlineSystem: cfg.anthropicInlineSystem,
    anthropicDisabledThinkingEffort: cfg.anthropicDisabledThinkingEffort,
    cache: cfg.tokenizerCacheBytes === 0 ? false : { maxBytes: cfg.tokenizerCacheBytes },
  };
}

export function usage(): string {
  return usageText(EPP_OPTIONS, {
    ...EPP_PROGRAM,
    command: "bun run epp",
    note: `Each flag also reads its variable, and the config file its camelCase key; ${PRECEDENCE}.`,
  });
}

/**
 * Whether any source of `cfg` reads the Kubernetes API server (the pool's pods, the peer Service for recovery or
 * replica-agg, Lease-backed intents): only then does the EPP load the Kubernetes client (kube-sources.ts).
 */
export function usesKubernetes(cfg: Pick<EppConfig, "workers" | "recovery" | "replicaAgg" | "intents">): boolean {
  return cfg.workers.mode === "kubernetes"
    || cfg.recovery.mode === "kubernetes"
    || (cfg.replicaAgg.mode === "on" && cfg.replicaAgg.peers.mode === "kubernetes")
    || cfg.intents?.discovery.kind === "kubernetes";
}
