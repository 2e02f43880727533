// Prometheus metrics of the EPP. One registry per EPP instance so in-process tests can run several.
import type { WorkerRef } from "@kv-epp/protocol";
import type { RoutingMetrics } from "@kv-epp/routing";
import { cpuThrottlingReader, type ReadFile } from "@kv-epp/tokenizer";
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from "prom-client";
import { llmdSeries } from "./llmd-metrics.ts";

export type RequestOutcome = "routed" | "no_endpoint" | "shed" | "bad_request" | "error";

/**
 * `readCgroup`: how the cgroup's files are read (tests pass their own; see cpuThrottlingReader). `process: false`: without
 * the process's own figures (runtime, CPU throttling), for a registry nothing scrapes (the decision warm-up's).
 */
export function createMetrics(readCgroup?: ReadFile, o: { process?: boolean } = {}) {
  const registry = new Registry();
  if (o.process !== false) {
    collectDefaultMetrics({ register: registry, prefix: "dynamo_epp_" });
    cpuThrottlingMetrics(registry, readCgroup);
  }
  // v8.getHeapSpaceStatistics() took 30-55 ms of event loop per scrape on Bun (bench:hostile's
  // scrape flood): every ext_proc request waited behind it. The heap totals stay (nodejs_heap_size_*).
  for (const kind of ["total", "used", "available"]) registry.removeSingleMetric(`dynamo_epp_nodejs_heap_space_size_${kind}_bytes`);
  const m = {
    registry,
    requests: new Counter({
      name: "dynamo_epp_requests_total",
      help: "ext_proc and /select decisions by outcome",
      labelNames: ["outcome"] as const,
      registers: [registry],
    }),
    pickLatency: new Histogram({
      name: "dynamo_epp_pick_duration_seconds",
      help: "time from a complete request body to the decision",
      // A pick that tokenizes takes 10-100 ms on a busy node. With one bucket from 50 to 250 ms, the demo's p99 read
      // ~210 ms by interpolation while a probe of the same picks put it at ~80 ms (max 139 ms).
      buckets: [0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.075, 0.1, 0.15, 0.25, 0.5, 1],
      registers: [registry],
    }),
    overlapRatio: new Histogram({
      name: "dynamo_epp_overlap_ratio",
      help: "overlap blocks of the chosen worker / request blocks (a pick routed on a known prefix the worker holds whole counts that prefix)",
      buckets: [0, 0.1, 0.25, 0.5, 0.75, 0.9, 1],
      registers: [registry],
    }),
    cachedTokensError: new Histogram({
      name: "dynamo_epp_cached_tokens_prediction_error",
      help: "predicted minus actual cached prompt tokens per routed request (actual: the response's usage.prompt_tokens_details.cached_tokens; a prediction made on a known prefix the worker holds whole is a lower bound, below 0 there no misprediction)",
      buckets: [-16384, -4096, -1024, -256, -64, -16, 0, 16, 64, 256, 1024, 4096, 16384],
      registers: [registry],
    }),
    cachedTokensPredictions: new Counter({
      name: "dynamo_epp_cached_tokens_predictions_total",
      help: "routed requests whose response reported cached tokens, per worker rank",
      labelNames: ["worker", "dp_rank"] as const,
      registers: [registry],
    }),
    cachedTokensMispredictions: new Counter({
      name: "dynamo_epp_cached_tokens_mispredictions_total",
      help: "routed requests whose predicted cached tokens were off by more than one block, per worker rank",
      labelNames: ["worker", "dp_rank"] as const,
      registers: [registry],
    }),
    cachedTokensUnscored: new Counter({
      name: "dynamo_epp_cached_tokens_unscored_total",
      help: "routed requests whose response is not compared with the prediction, by reason (batched_prompts: a /v1/completions batch, whose usage adds up all its prompts; cache_namespace: a request to SGLang workers with an extra_key, routed by load since no KV event names its namespace)",
      labelNames: ["reason"] as const,
      registers: [registry],
    }),
    observedTtft: new Histogram({
      name: "dynamo_epp_observed_ttft_seconds",
      help: "time from the routing decision to the first response body chunk of a streamed (SSE) response, per worker rank",
      labelNames: ["worker", "dp_rank"] as const,
      buckets: [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30],
      registers: [registry],
    }),
    inflight: new Gauge({ name: "dynamo_epp_inflight_requests", help: "requests routed and not finished", registers: [registry] }),
    inflightPrefixBlocks: new Gauge({
      name: "dynamo_epp_inflight_prefix_blocks",
      help: "prefix blocks of requests this replica routed and that have not ended, counted as overlap where they were routed (--inflight-prefix)",
      registers: [registry],
    }),
    inflightPrefixPeerBlocks: new Gauge({
      name: "dynamo_epp_inflight_prefix_peer_blocks",
      help: "prefix blocks of requests peer replicas routed and that have not ended, as replica-agg told them, held under bounds of their own",
      registers: [registry],
    }),
    inflightPrefixDropped: new Gauge({
      name: "dynamo_epp_inflight_prefix_dropped",
      help: "in-flight prefixes dropped before their request ended: expired (--inflight-prefix-ttl-ms) or evicted (--inflight-prefix-max-blocks)",
      labelNames: ["reason"] as const,
      registers: [registry],
    }),
    indexBlocks: new Gauge({ name: "dynamo_epp_kv_index_blocks", help: "blocks in the KV index", labelNames: ["model"] as const, registers: [registry] }),
    indexResidencies: new Gauge({
      name: "dynamo_epp_kv_index_residencies",
      help: "(block, worker) residencies in the KV index",
      labelNames: ["model"] as const,
      registers: [registry],
    }),
    indexWorkers: new Gauge({ name: "dynamo_epp_kv_index_workers", help: "workers in the KV index", labelNames: ["model"] as const, registers: [registry] }),
    workers: new Gauge({ name: "dynamo_epp_workers", help: "known workers (ranks)", registers: [registry] }),
    evictionRegret: new Gauge({
      name: "dynamo_epp_kv_eviction_regret",
      help: "share of the blocks worker ranks store that the same rank had evicted a while before (decayed over ~20k blocks): near 0 while the caches hold their working set; it moves the latency cost's follower weight",
      registers: [registry],
    }),
    listenersConnected: new Gauge({
      name: "dynamo_epp_kv_listeners_connected",
      help: "KV listeners (one per worker rank) connected to their publisher; below dynamo_epp_workers, some ranks' events are not arriving",
      registers: [registry],
    }),
    ready: new Gauge({ name: "dynamo_epp_ready", help: "1 when this replica reports readiness SERVING (recovered, not draining)", registers: [registry] }),
    indexReserved: new Gauge({
      name: "dynamo_epp_kv_index_reserved_residencies",
      help: "residencies the KV index tables are sized for: the ranks' scraped num_gpu_blocks summed (0: not reserved)",
      registers: [registry],
    }),
    indexTableRebuilds: new Gauge({
      name: "dynamo_epp_kv_index_table_rebuilds",
      help: "table rebuilds of the current KV index since it was created: growth, tombstone sweeps and reservations (each stops ingestion while every entry is re-placed)",
      labelNames: ["model"] as const,
      registers: [registry],
    }),
    indexTraps: new Counter({
      name: "dynamo_epp_kv_index_traps_total",
      help: "KV indexes replaced by an empty one after their WebAssembly module trapped (e.g. out of memory)",
      registers: [registry],
    }),
    eventsApplied: new Counter({ name: "dynamo_epp_kv_events_applied_total", help: "KV events applied to the index", registers: [registry] }),
    blockSizeMismatches: new Counter({
      name: "dynamo_epp_kv_block_size_mismatch_total",
      help: "KV stores whose block size is not their index's: the configured size replaced by the workers' (once, while nothing was indexed), or a rank's stores refused",
      registers: [registry],
    }),
    rankMismatches: new Counter({
      name: "dynamo_epp_kv_rank_mismatch_total",
      help: "KV event batches whose data_parallel_rank is not the rank their listener follows (a port or start-rank misconfiguration); applied to the listener's rank",
      registers: [registry],
    }),
    eventsIgnored: new Counter({
      name: "dynamo_epp_kv_events_ignored_total",
      help: "well-formed KV events that name nothing to index, by reason: placeholder (an offloading connector's hash-only store: block_size 0, no tokens), non_main_group (a sliding-window, Mamba... KV cache group), extra_main_group (a main group other than the rank's indexed one), partial_entry (vLLM's partial prefix-cache entry: one block of the prefix-match unit, inside a physical block), offload_tier (published by a secondary offloading tier: ownership set)",
      labelNames: ["reason"] as const,
      registers: [registry],
    }),
    eventsRejected: new Counter({
      name: "dynamo_epp_kv_events_rejected_total",
      help: "KV events not applied, by reason: index (unknown parent, hash conflict), medium (not GPU), partial_block, unaligned (more whole blocks of token_ids than block_hashes: which blocks are left out is unknown), block_size (not the model's), adapter_limit (a LoRA adapter name, from an event or a peer's dump, past the learned-adapter limit: the name is not learned, the event's blocks still are indexed)",
      labelNames: ["reason"] as const,
      registers: [registry],
    }),
    listenerGaps: new Gauge({ name: "dynamo_epp_kv_listener_gaps", help: "sequence gaps seen by the KV listeners (a batch that fails to decode counts as one: its events are lost)", registers: [registry] }),
    listenerReplays: new Gauge({ name: "dynamo_epp_kv_listener_replays", help: "replays done by the KV listeners", registers: [registry] }),
    listenerRestarts: new Gauge({ name: "dynamo_epp_kv_listener_restarts", help: "publisher restarts seen by the KV listeners", registers: [registry] }),
    listenerHeartbeatTimeouts: new Gauge({ name: "dynamo_epp_kv_listener_heartbeat_timeouts", help: "KV publishers dropped (and redialed) for going silent past the ZMTP heartbeat timeout", registers: [registry] }),
    listenerProtocolErrors: new Gauge({
      name: "dynamo_epp_kv_listener_protocol_errors",
      help: "KV publisher connections closed by the listeners for broken ZMTP or an oversize message (then redialed)",
      registers: [registry],
    }),
    listenerOversize: new Gauge({
      name: "dynamo_epp_kv_listener_oversize_messages",
      help: "KV-event messages refused for exceeding --kv-max-message-bytes (the connection is closed and redialed; the lost batch resets or replays its rank)",
      registers: [registry],
    }),
    kvMalformed: new Counter({
      name: "dynamo_epp_kv_malformed_messages_total",
      help: "KV-event messages skipped as malformed, by kind: frames (not topic, 8-byte seq, payload), payload (not a vLLM event batch), replay (a bad replay reply)",
      labelNames: ["kind"] as const,
      registers: [registry],
    }),
    eventsDropped: new Counter({
      name: "dynamo_epp_kv_events_dropped_total",
      help: "KV events the decoder dropped from a batch that was otherwise applied, by reason: unknown_type (a tag this EPP does not know), malformed (fields of the wrong type, bigram token pairs that do not chain)",
      labelNames: ["reason"] as const,
      registers: [registry],
    }),
    unknownFields: new Counter({
      name: "dynamo_epp_kv_unknown_fields_total",
      help: "fields of KV events and batches (map keys, array positions, extra-key entries) read and skipped as unknown: a producer newer than this EPP; never a reason to drop",
      registers: [registry],
    }),
    listenerResets: new Counter({
      name: "dynamo_epp_kv_listener_resets_total",
      help: "times a worker's blocks were dropped",
      labelNames: ["reason"] as const,
      registers: [registry],
    }),
    rankOverCapacity: new Counter({
      name: "dynamo_epp_kv_rank_capacity_resets_total",
      help: "worker ranks whose blocks were dropped because the index held more than the rank can (its num_gpu_blocks, else --max-blocks-per-rank)",
      registers: [registry],
    }),
    scrapeErrors: new Counter({ name: "dynamo_epp_worker_scrape_errors_total", help: "failed vLLM /metrics scrapes", registers: [registry] }),
    aggPeers: new Gauge({ name: "dynamo_epp_replica_agg_siblings", help: "peer replicas known from peer discovery", registers: [registry] }),
    aggPeersConnected: new Gauge({
      name: "dynamo_epp_replica_agg_siblings_connected",
      help: "peer replicas with a live replica-agg session",
      registers: [registry],
    }),
    aggRefusedSubscribers: new Gauge({
      name: "dynamo_epp_replica_agg_refused_subscribers",
      help: "replica-agg subscriber connections closed for broken ZMTP, an oversize message or subscriptions past 1024 prefixes / 64 KiB",
      registers: [registry],
    }),
    aggPeerRequests: new Gauge({
      name: "dynamo_epp_replica_agg_sibling_requests",
      help: "in-flight requests attributed to peer replicas (all workers)",
      registers: [registry],
    }),
    aggPeerBlocks: new Gauge({
      name: "dynamo_epp_replica_agg_sibling_blocks",
      help: "active blocks attributed to peer replicas, per worker rank (added to the decode load)",
      labelNames: ["worker", "dp_rank"] as const,
      registers: [registry],
    }),
    aggMessages: new Counter({
      name: "dynamo_epp_replica_agg_messages_total",
      help: "replica-agg messages sent and received",
      labelNames: ["direction", "kind"] as const,
      registers: [registry],
    }),
    aggBytes: new Counter({
      name: "dynamo_epp_replica_agg_bytes_total",
      help: "replica-agg payload bytes sent and received",
      labelNames: ["direction"] as const,
      registers: [registry],
    }),
    aggSequenceErrors: new Counter({
      name: "dynamo_epp_replica_agg_sequence_errors_total",
      help: "replica-agg messages missed (gap) or seen twice (duplicate)",
      labelNames: ["kind"] as const,
      registers: [registry],
    }),
    aggPeerDrops: new Counter({
      name: "dynamo_epp_replica_agg_sibling_drops_total",
      help: "times a peer's load was dropped",
      labelNames: ["reason"] as const,
      registers: [registry],
    }),
    extProcRejected: new Counter({
      name: "dynamo_epp_ext_proc_rejected_messages_total",
      help: "ext_proc streams ended with a gRPC error for what the client sent, by reason: framing, too_large, too_large_field (over 1 MiB outside its body), unparsable, handler (a bug hit by the message), no_request (no request case set), unexpected (a case the stream's state does not take), grpc_body_mode (the filter set body mode GRPC, which is not supported), held_overflow (too many messages, or too many bytes of them, while its route was pending), budget (a message arriving past --ext-proc-buffer-max-bytes), stalled (a message that stopped arriving), unread (answers the client did not read), output_budget (answers waiting to go out past --ext-proc-buffer-max-bytes)",
      labelNames: ["reason"] as const,
      registers: [registry],
    }),
    jsonDepthRefusals: new Counter({
      name: "dynamo_epp_json_depth_refusals_total",
      help: "request bodies refused (400) for nesting arrays/objects past the JSON depth limit, by where: ext_proc, score, select",
      labelNames: ["where"] as const,
      registers: [registry],
    }),
    bodiesRead: new Counter({
      name: "dynamo_epp_ext_proc_bodies_read_total",
      help: "request bodies read (parsed, validated, model rewritten) by where they came (ext_proc, select, score: the selection port's dry runs) and thread: tokenizer_pool (the default), event_loop (no pool, a body of token ids, or a body of at most 1 MiB no member had read by the budget), unread (a larger body no member was live to read: routed by load on its model, found without parsing the body)",
      labelNames: ["where", "thread"] as const,
      registers: [registry],
    }),
    partialBodies: new Counter({
      name: "dynamo_epp_ext_proc_partial_bodies_total",
      help: "BUFFERED_PARTIAL request bodies cut at Envoy's buffer limit that do not parse: routed by load alone",
      registers: [registry],
    }),
    unrenderedBodies: new Counter({
      name: "dynamo_epp_ext_proc_unrendered_bodies_total",
      help: "request bodies whose prompt is not rendered here though the workers may serve it, routed by load alone, by cause: stored_history (a Responses previous_response_id), template_engine (the chat template fails in this process's engine without raising), render_bound (the chat template's render passed this process's bound on work, set in proportion to its input), responses_rules (a Responses request to SGLang workers, whose Responses chat is not mirrored), messages_rules (a /v1/messages request to SGLang workers, whose Messages chat is not mirrored), routing_cut (the chat template raises on the chat as cut at the routing bound)",
      labelNames: ["cause"] as const,
      registers: [registry],
    }),
    extProcBufferOverflows: new Counter({
      name: "dynamo_epp_ext_proc_buffer_overflows_total",
      help: "request bodies that would have passed the process's body budget (--ext-proc-buffer-max-bytes): routed by load on what had come, the rest passed through unbuffered",
      registers: [registry],
    }),
    replyWarmsDropped: new Counter({
      name: "dynamo_epp_reply_warms_dropped_total",
      help: "routed chat completions not warmed from their reply, by cause: budget (what reply warming keeps, bodies and replies until their response ends, would have passed its share, a quarter, of --ext-proc-buffer-max-bytes), too_large (a body past the largest the tokenizer pool warms, which is not kept)",
      labelNames: ["cause"] as const,
      registers: [registry],
    }),
    extProcBufferedBytes: new Gauge({
      name: "dynamo_epp_ext_proc_buffered_bytes",
      help: "bytes ext_proc streams hold, against --ext-proc-buffer-max-bytes: bodies waiting for their route, parts of gRPC messages still arriving, and chats' bodies and replies kept to warm their next turn",
      registers: [registry],
    }),
    releasedWithoutResponseBody: new Counter({
      name: "dynamo_epp_released_without_response_body_total",
      help: "routed requests whose load was released with no response body message seen (response_body_mode NONE): held to the stream's end, prefill never marked done",
      registers: [registry],
    }),
    servedElsewhere: new Counter({
      name: "dynamo_epp_served_elsewhere_total",
      help: "responses the data plane reports served by another endpoint than the pick (a retry or fallback): moved (the load follows) or unknown_endpoint",
      labelNames: ["result"] as const,
      registers: [registry],
    }),
    shedByClass: new Counter({
      name: "dynamo_epp_shed_total",
      help: "requests answered 429 under saturation, by priority class: sheddable (objective priority < 0, shed first), standard (0), critical (> 0)",
      labelNames: ["class"] as const,
      registers: [registry],
    }),
    fairnessRequests: new Counter({
      name: "dynamo_epp_fairness_requests_total",
      help: "requests by x-gateway-inference-fairness-id (default-flow when absent; the first 64 ids, then other)",
      labelNames: ["fairness_id"] as const,
      registers: [registry],
    }),
    tlsReloads: new Counter({
      name: "dynamo_epp_tls_certificate_reloads_total",
      help: "reloads of the ext_proc TLS certificate files, by result (error: the previous certificate stays)",
      labelNames: ["result"] as const,
      registers: [registry],
    }),
    modelRewrites: new Counter({
      name: "dynamo_epp_model_rewrites_total",
      help: "requests with x-gateway-model-name-rewrite: rewritten (the forwarded body names the model scored, the response maps it back), same_name (the body already names it), body_not_held (the body mode forwards the body before the route: it goes as the client wrote it); requests an InferenceModelRewrite rule matched (over the header): rule_rewritten, rule_same_name, rule_no_targets (refused, 400); rules_not_applied (the pool has rules, the body mode forwards the body before the route)",
      labelNames: ["result"] as const,
      registers: [registry],
    }),
    pdDecisions: new Counter({
      name: "dynamo_epp_pd_decisions_total",
      help: "requests routed in a pool with prefill workers, by the P/D decider's verdict (disaggregated: a prefill worker named in x-prefiller-host-port) and reason",
      labelNames: ["decision", "reason"] as const,
      registers: [registry],
    }),
    ioErrors: new Counter({
      name: "dynamo_epp_io_errors_total",
      help: "errors caught at I/O boundaries",
      labelNames: ["where"] as const,
      registers: [registry],
    }),
    /** The same figures under llm-d's names (llmd-metrics.ts). */
    llmd: llmdSeries(registry),
  };
  return m;
}

export type Metrics = ReturnType<typeof createMetrics>;

/**
 * The cgroup's CFS throttling, read at scrape time, where the cgroup tells it: while throttled every thread of the
 * process waits for the next period, the decision thread too (picks stall up to a period, 100 ms by default).
 */
function cpuThrottlingMetrics(registry: Registry, read: ReadFile | undefined): void {
  // Where the throttling is counted is found once: a scrape reads that one file, on the decision thread.
  const throttling = cpuThrottlingReader(read);
  if (throttling === null) return;
  const series = [
    ["dynamo_epp_cpu_throttled_seconds_total", "time the process's cgroup was throttled by its CPU quota (cpu.stat throttled_usec): every thread stopped, the decision thread too", "seconds"],
    ["dynamo_epp_cpu_throttled_periods_total", "CFS periods in which the process's cgroup was throttled by its CPU quota (cpu.stat nr_throttled)", "periods"],
  ] as const;
  for (const [name, help, field] of series) {
    new Counter({
      name, help, registers: [registry],
      collect() {
        const now = throttling();
        if (now === null) return;
        this.reset();
        this.inc(now[field]);
      },
    });
  }
}

/** Routing's figures as this process exports them. */
export function routingMetrics(m: Metrics): RoutingMetrics {
  const rank = (r: WorkerRef) => ({ worker: r.workerId, dp_rank: String(r.dpRank) });
  return {
    routed: (ratio) => {
      if (ratio !== undefined) m.overlapRatio.observe(ratio);
    },
    inflight: (n) => m.inflight.set(n),
    servedElsewhere: (result) => m.servedElsewhere.inc({ result }),
    unscored: (reason) => m.cachedTokensUnscored.inc({ reason }),
    cachedTokens: (r, error, mispredicted) => {
      m.cachedTokensError.observe(error);
      m.cachedTokensPredictions.inc(rank(r));
      // Incremented by 0 when right: every worker with predictions has the series, so a ratio of the two
      // counters reads 0 for it rather than no data.
      m.cachedTokensMispredictions.inc(rank(r), mispredicted ? 1 : 0);
    },
    observedTtft: (r, seconds) => m.observedTtft.observe(rank(r), seconds),
    disaggregation: (disaggregated, reason) => m.pdDecisions.inc({ decision: disaggregated ? "disaggregated" : "local", reason }),
    forgetRank: (r) => {
      for (const series of [m.cachedTokensPredictions, m.cachedTokensMispredictions, m.observedTtft]) series.remove(rank(r));
    },
  };
}
