import { Hono } from "hono";
import pino, { type Logger } from "pino";
import { publisherBinds, rankEndpoint } from "@kv-epp/protocol";
import { createPreprocessor, ignoredRenderingFlags, servedConversationTemplate, warmUp, type PreprocessorOptions } from "@kv-epp/tokenizer";
import { PrefixCacheSim } from "./cache/prefix-cache.ts";
import { ConfigError, engineKind, poolRole, resolveConfig, type MockWorkerConfig } from "./config.ts";
import { RankEngine } from "./engine/rank-engine.ts";
import { RankEventStream } from "./events/event-stream.ts";
import { Faults, type RankParts } from "./faults.ts";
import { adminRoutes } from "./http/admin-routes.ts";
import { MockNixlConnector } from "./kv-transfer/connector.ts";
import { nixlRoutes } from "./kv-transfer/routes.ts";
import { bootstrapRoutes } from "./kv-transfer/sglang-bootstrap.ts";
import { MockSglangConnector } from "./kv-transfer/sglang-connector.ts";
import { MockMooncakeConnector } from "./kv-transfer/mooncake-connector.ts";
import { mooncakeBootstrapRoutes } from "./kv-transfer/mooncake-bootstrap.ts";
import { openAiError } from "./http/errors.ts";
import { openAiRoutes } from "./http/openai-routes.ts";
import { sglangRoutes } from "./http/sglang-routes.ts";
import type { RankNumbering } from "./http/rank-header.ts";
import { createMetrics } from "./metrics.ts";

export type MockWorkerOptions = Partial<MockWorkerConfig> & { logger?: Logger };

export type MockWorkerRank = {
  rank: number;
  cache: PrefixCacheSim;
  engine: RankEngine;
  /** Where a subscriber connects (a wildcard bind is reported with the listen address). */
  kvEvents: string;
  replay: string | null;
};

export type MockWorker = {
  /** Base URL of the OpenAI server, e.g. `http://127.0.2.1:8000` (with --rank-ports, rank 0's). */
  url: string;
  /** Every API server's base URL, in rank order with --rank-ports (else just `url`). */
  urls: string[];
  config: MockWorkerConfig;
  ranks: MockWorkerRank[];
  /**
   * The port its bootstrap server listens on (as bound): SGLang's with --disaggregation-mode prefill, Mooncake's with
   * --kv-connector mooncake and --role prefill or both; else null.
   */
  bootstrapPort: number | null;
  close(): Promise<void>;
};

/** The address a client dials for a server bound on `listen` (a wildcard bind is reached on loopback). */
function dialHost(listen: string): string {
  return listen === "0.0.0.0" || listen === "::" ? "127.0.0.1" : listen;
}

function connectable(endpoint: string, host: string): string {
  return endpoint.replace(/^tcp:\/\/(\*|0\.0\.0\.0)(?=:)/, `tcp://${host}`);
}

// vLLM's (and SGLang's) jinja2 renders a chat however much work it takes, so the EPP's bound on a render's work
// (RenderBound, which keeps hostile input off its event loop) would make this stand-in refuse chats the engine serves.
// The library here walks a template ~100 times slower than jinja2 runs it, so no bound is both faithful and safe: 100
// times the EPP's (10 million steps, and more per input character; the largest shipped templates need ~1.3 per
// character) renders what jinja2 does in about half a second, and stops only a runaway template (loops nested over
// range()) after tens of seconds rather than stalling every test and benchmark sharing this process, or exhausting its
// memory.
const ENGINE_RENDER_BOUND_SCALE = 100;

/**
 * Starts a mock vLLM worker: `dpSize` ranks, each with its own prefix cache and KV-event publisher,
 * behind one OpenAI HTTP server. Options not given take the CLI defaults.
 */
export async function startMockWorker(opts: MockWorkerOptions = {}): Promise<MockWorker> {
  const { logger, ...given } = opts;
  const config = resolveConfig(given);
  // vLLM hashes at one granularity (hash_block_size) and groups with larger blocks scale it by a whole factor.
  if (config.kvGroups.some((g) => g.blockSize % config.blockSize !== 0))
    throw new ConfigError(`every --kv-groups block size must be a multiple of --block-size ${config.blockSize} (vLLM's hash block size)`);
  const kind = engineKind(config);
  if (config.specBigram && (kind !== "sglang" || config.kvGroups.length > 0))
    throw new ConfigError("--spec-bigram is SGLang's: it needs --event-encoding sglang-map or sglang, and no --kv-groups");
  if (config.disaggregationMode !== "null" && (kind !== "sglang" || config.role !== undefined))
    throw new ConfigError("--disaggregation-mode is SGLang's: it needs --event-encoding sglang-map or sglang, and no --role (vLLM's NixlConnector)");
  if (config.kvConnector === "mooncake" && (config.role === undefined || kind !== "vllm" || config.rankPorts))
    throw new ConfigError("--kv-connector mooncake is vLLM's MooncakeConnector: it needs --role, a vLLM --event-encoding, and no --rank-ports (one bootstrap server per worker is modelled)");
  if (config.partialEntries && !config.kvGroups.some((g) => g.kind !== "sliding_window" && g.blockSize > config.blockSize))
    throw new ConfigError("--partial-entries needs a --kv-groups main group whose block size is above --block-size (the prefix-match unit)");
  const root = logger ?? pino({ level: config.logLevel });
  const workerName = config.workerId ?? `${config.listen}:${config.port}`;
  const log = root.child({ component: "mock-worker", worker: workerName });

  // An SGLang mode stands in for SGLang's server: its chats render by SGLang's rules, as the EPP renders them for it.
  const rendering: PreprocessorOptions = {
    chatRendering: kind,
    tokenizerDir: config.tokenizerDir, model: config.model, defaultChatTemplateKwargs: config.defaultChatTemplateKwargs,
    excludeToolsWhenToolChoiceNone: config.excludeToolsWhenToolChoiceNone, chatTemplate: config.chatTemplate,
    chatTemplateContentFormat: config.chatTemplateContentFormat, trustRequestChatTemplate: config.trustRequestChatTemplate,
    responseRole: config.responseRole,
    renderBoundScale: ENGINE_RENDER_BOUND_SCALE,
  };
  // SGLang's own conversation templates are not rendered here: a stand-in for SGLang could not serve such chats.
  const conversation = servedConversationTemplate(rendering);
  if (conversation !== null) throw new ConfigError(`--chat-template ${JSON.stringify(conversation.name)}: ${conversation.why}, which the mock worker does not render; give a .jinja file`);
  const why = { no_template: "without --tokenizer-dir (the byte-level fallback has no chat template)", vllm_only: "in an SGLang --event-encoding (a vLLM flag)" };
  for (const { flag, cause } of ignoredRenderingFlags(rendering)) log.warn(`${flag} has no effect ${why[cause]}`);
  const preprocessor = await createPreprocessor(rendering);
  // Warm before it serves, as the EPP's tokenizers are: its first requests would otherwise stand in for a slow engine.
  warmUp(preprocessor);
  const timing = {
    speed: config.speed, stepBaseMs: config.stepBaseMs, msPerToken: config.stepMsPerToken,
    maxNumBatchedTokens: config.maxNumBatchedTokens, maxNumSeqs: config.maxNumSeqs,
  };

  const ranks: RankParts[] = [];
  // vLLM's external DP load balancing (--rank-ports) runs a process per rank: each API server's /metrics
  // shows its own engine only. Otherwise one server shows every rank.
  const first = config.dataParallelStartRank;
  // A P/D pool's worker runs vLLM's NixlConnector (kv_role kv_both: it serves either side of a transfer).
  const connector = config.role === undefined || config.kvConnector !== "nixl" ? undefined : new MockNixlConnector({
    msPerBlock: config.kvTransferMsPerBlock, abortTimeoutMs: config.kvTransferAbortTimeoutS * 1000,
    blockSize: config.blockSize, log: log.child({ component: "nixl" }),
  });
  // --kv-connector mooncake: vLLM's MooncakeConnector, transfers paired by id through the prefill's bootstrap port.
  const mooncake = config.role === undefined || config.kvConnector !== "mooncake" ? undefined : new MockMooncakeConnector({
    msPerBlock: config.kvTransferMsPerBlock, abortTimeoutMs: config.kvTransferAbortTimeoutS * 1000,
    blockSize: config.blockSize, dpSize: config.dpSize, log: log.child({ component: "mooncake" }),
  });
  // A kv_producer or kv_both runs the bootstrap server (a decode-only worker is vLLM's kv_consumer).
  const mooncakeBootstrap = mooncake !== undefined && config.role !== "decode";
  // SGLang's disaggregation (--disaggregation-mode): rooms paired through the prefill's bootstrap port.
  const sglangMode = config.disaggregationMode === "null" ? undefined : config.disaggregationMode;
  const sglangConnector = sglangMode === undefined ? undefined : new MockSglangConnector({
    mode: sglangMode, msPerBlock: config.kvTransferMsPerBlock, blockSize: config.blockSize,
    waitingTimeoutMs: config.disaggregationWaitingTimeoutS * 1000, bootstrapTimeoutMs: config.disaggregationBootstrapTimeoutS * 1000,
    log: log.child({ component: "sglang-disaggregation" }), bootstrapPort: config.disaggregationBootstrapPort,
  });
  const role = poolRole(config);
  // SGLang labels its scheduler series with dp_rank only on a server of several DP ranks.
  const engineType = role === "prefill" || role === "decode" ? role : "unified";
  const metricsFor = (engines: () => RankEngine[], serverRanks: number) =>
    createMetrics({
      model: config.model, engines, connector, sglangConnector, mooncake, sglang: kind === "sglang" ? { engineType, dpRankLabel: serverRanks > 1 } : undefined,
      // The mock runs any of its adapters together: a batch holds them all.
      maxLora: config.loraModules.length > 0 ? config.loraModules.length : undefined,
    });
  const allMetrics = metricsFor(() => ranks.map((r) => r.engine), config.dpSize);
  const perRank = config.rankPorts
    ? Array.from({ length: config.dpSize }, (_, i) => metricsFor(() => (ranks[i] ? [ranks[i]!.engine] : []), 1))
    : undefined;
  const metricsOf = (rank: number) => perRank?.[rank - first] ?? allMetrics;
  try {
    // Rank numbers are global (vLLM's multi-node DP): this worker's first rank is the start rank, and
    // ports and data_parallel_rank follow the global rank (vLLM's offset_endpoint_port).
    for (let rank = config.dataParallelStartRank; rank < config.dataParallelStartRank + config.dpSize; rank++) {
      const cache = new PrefixCacheSim({
        blockSize: config.blockSize, capacityBlocks: config.capacityBlocks,
        runContext: config.kvGroups.some((g) => g.blockSize !== config.blockSize) || config.specBigram,
        // Each rank is its own vLLM engine process: "random" draws a NONE_HASH per rank.
        hashSeed: config.hashSeed,
      });
      const engine = new RankEngine(rank, cache, timing, {
        onFirstToken: (s) => metricsOf(rank).firstToken(rank, s),
        onFinished: (n) => metricsOf(rank).finished(rank, n),
        onStep: metricsOf(rank).loraStep,
      });
      const events = await RankEventStream.open({
        rank,
        endpoint: rankEndpoint(config.kvEvents, rank),
        connect: config.kvEventsConnect && !publisherBinds(config.kvEvents),
        replayEndpoint: config.replay ? rankEndpoint(config.replay, rank) : undefined,
        replayBuffer: config.replayBuffer, topic: config.topic,
        encoding: config.eventEncoding, hashMode: config.hashMode, blockSize: config.blockSize, kvGroups: config.kvGroups,
        wire: { partialEntries: config.partialEntries, specBigram: config.specBigram, taggedExtraKeys: config.taggedExtraKeys },
        log: log.child({ rank }),
        onPublished: (n) => metricsOf(rank).eventsPublished(rank, n),
        onError: () => metricsOf(rank).publishFailed(rank),
      });
      cache.subscribe((changes) => events.publish(changes));
      ranks.push({ engine, events });
    }
  } catch (e) {
    await Promise.allSettled(ranks.map((r) => r.events.close()));
    throw e;
  }

  // Least loaded rank, ties broken round-robin, unless the request names its rank.
  let cursor = 0;
  const pickRank = (requested: number | undefined): RankEngine => {
    if (requested !== undefined) return ranks[requested - config.dataParallelStartRank]!.engine;
    let best = ranks[cursor % ranks.length]!.engine;
    for (let i = 1; i < ranks.length; i++) {
      const e = ranks[(cursor + i) % ranks.length]!.engine;
      if (e.load < best.load) best = e;
    }
    cursor = (cursor + 1) % ranks.length;
    return best;
  };

  const host = dialHost(config.listen);
  /** The API server for `served` ranks (all of them, or one with --rank-ports). */
  const appFor = (served: { pick: typeof pickRank; ranks: RankNumbering }) => {
    const metrics = served.ranks.count === 1 && perRank ? metricsOf(served.ranks.first) : allMetrics;
    const parts = ranks.filter((r) => r.engine.rank >= served.ranks.first && r.engine.rank < served.ranks.first + served.ranks.count);
    const app = new Hono();
    app.onError((err, c) => {
      // A client that hung up while queued or decoding is not an error of ours; its slot was freed.
      if (c.req.raw.signal.aborted) return c.body(null, 499 as never);
      log.error({ err, path: c.req.path }, "request failed");
      return openAiError(c, 500, err.message);
    });
    app.get("/health", (c) => c.body(null, 200));
    app.get("/metrics", async (c) => c.text(await metrics.registry.metrics(), 200, { "content-type": metrics.registry.contentType }));
    if (kind === "sglang") {
      app.route("/", sglangRoutes({
        model: config.model, blockSize: config.blockSize, capacityBlocks: config.capacityBlocks, kvEvents: config.kvEvents,
        topic: config.topic, role, ranks: parts, flush: () => new Faults(parts).resetPrefixCache(),
      }));
    } else {
      // vLLM #55844: each rank's publisher as bound (an ephemeral port with `:0`), for the ranks this server fronts.
      app.get("/kv_event_sources", (c) =>
        c.json({
          sources: parts.map(({ engine, events }) => ({
            data_parallel_rank: engine.rank,
            endpoint: connectable(events.endpoint, host),
            replay_endpoint: events.replayEndpoint ? connectable(events.replayEndpoint, host) : null,
            topic: config.topic,
          })),
        }));
    }
    app.route("/", openAiRoutes({
      model: config.model, preprocessor, pickRank: served.pick, ranks: served.ranks, loraModules: config.loraModules,
      connector, sglang: sglangConnector, mooncake, dpSize: config.dpSize, engine: kind,
    }));
    if (connector) app.route("/", nixlRoutes(connector));
    app.route("/", adminRoutes(new Faults(ranks), ranks, role));
    return app;
  };
  // --rank-ports: rank i's own API server on port + i, which runs everything on rank i (vLLM's external
  // load balancing: its one engine is rank 0 to it). Otherwise one server, whose rank numbering is
  // vLLM's hybrid (local) or internal (global) one.
  const served = config.rankPorts
    ? ranks.map((r, i) => ({ port: config.port === 0 ? 0 : config.port + i, pick: () => r.engine, ranks: { first: first + i, count: 1, numbering: "local" } satisfies RankNumbering }))
    : [{ port: config.port, pick: pickRank, ranks: { first, count: config.dpSize, numbering: config.dataParallelHybridLb ? "local" : "global" } satisfies RankNumbering }];

  const servers: ReturnType<typeof Bun.serve>[] = [];
  try {
    for (const s of served) servers.push(Bun.serve({ hostname: config.listen, port: s.port, fetch: appFor(s).fetch, idleTimeout: 0 }));
    // A decode server's request for a room waits here until the prefill computed it: no idle timeout.
    if (sglangMode === "prefill")
      servers.push(Bun.serve({ hostname: config.listen, port: config.disaggregationBootstrapPort, fetch: bootstrapRoutes(sglangConnector!).fetch, idleTimeout: 0 }));
    // The same for a decode worker's transfer waiting for its prefill.
    if (mooncakeBootstrap) {
      const served = ranks.map((r) => r.engine.rank);
      const key = (rank: number) => (config.dataParallelHybridLb ? rank - first : rank);
      servers.push(Bun.serve({ hostname: config.listen, port: config.mooncakeBootstrapPort, fetch: mooncakeBootstrapRoutes(mooncake!, served, key).fetch, idleTimeout: 0 }));
    }
  } catch (e) {
    for (const s of servers) void s.stop(true);
    await Promise.allSettled(ranks.map((r) => r.events.close()));
    throw e;
  }
  const bootstrapped = sglangMode === "prefill" || mooncakeBootstrap;
  const apiServers = bootstrapped ? servers.slice(0, -1) : servers;
  const bootstrapPort = bootstrapped ? servers.at(-1)!.port! : null;
  const urls = apiServers.map((s) => `http://${host}:${s.port}`);
  const url = urls[0]!;
  if (connector) connector.sideChannel = { host: config.advertiseHost ?? host, port: servers[0]!.port! };
  if (mooncakeBootstrap) mooncake!.workerAddr = { host: config.advertiseHost ?? host, port: bootstrapPort! };
  // An ephemeral bootstrap port (0) is known once bound.
  if (sglangMode === "prefill") sglangConnector!.ownBootstrapPort = bootstrapPort!;
  const view = ranks.map(({ engine, events }) => ({
    rank: engine.rank,
    cache: engine.cache,
    engine,
    kvEvents: connectable(events.endpoint, host),
    replay: events.replayEndpoint ? connectable(events.replayEndpoint, host) : null,
  }));
  log.info({ url, urls, bootstrapPort, ranks: view.map((r) => ({ rank: r.rank, kvEvents: r.kvEvents, replay: r.replay })), tokenizer: preprocessor.kind }, "mock worker listening");

  let closed: Promise<void> | undefined;
  return {
    url,
    urls,
    config,
    ranks: view,
    bootstrapPort,
    close: () =>
      (closed ??= (async () => {
        await Promise.all(servers.map((s) => s.stop(true)));
        connector?.close();
        mooncake?.close();
        await Promise.allSettled(ranks.map((r) => r.events.close()));
      })()),
  };
}
