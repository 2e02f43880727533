import { Hono, type Context } from "hono";
import { parseEndpoint, type WorkerRole } from "@kv-epp/protocol";
import type { RankParts } from "../faults.ts";

/**
 * SGLang's own routes, for a worker standing for SGLang (an SGLang --event-encoding): `GET /server_info`
 * with its `kv_events` descriptor, and `/flush_cache`. SGLang serves no `/kv_event_sources` (vLLM's), so a
 * reader falls back to `/server_info` as it would against SGLang.
 */
export type SglangRoutesDeps = {
  model: string;
  blockSize: number;
  capacityBlocks: number;
  /** --kv-events as configured (SGLang's --kv-events-config endpoint). */
  kvEvents: string;
  topic: string;
  role: WorkerRole | undefined;
  /** The ranks this server fronts, in rank order. */
  ranks: readonly RankParts[];
  /** Drops every rank's cache (AllBlocksCleared). */
  flush(): void;
};

/** What `/flush_cache` answers, success or not: SGLang's text. */
export const FLUSH_CACHE_TEXT =
  "Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting requests, the operation will not be performed.)\n";

export function sglangRoutes(deps: SglangRoutesDeps): Hono {
  const app = new Hono();

  // A subset of what SGLang's /server_info holds (its server args, scheduler info and version): the fields a
  // router reads, and kv_events.
  app.get("/server_info", (c) =>
    c.json({
      model_path: deps.model,
      served_model_name: deps.model,
      page_size: deps.blockSize,
      tp_size: 1,
      pp_size: 1,
      dp_size: deps.ranks.length,
      disaggregation_mode: deps.role === "prefill" || deps.role === "decode" ? deps.role : "null",
      kv_events_config: JSON.stringify({ publisher: "zmq", endpoint: deps.kvEvents, topic: deps.topic }),
      max_total_num_tokens: deps.capacityBlocks * deps.blockSize,
      version: "mock",
      kv_events: kvEventsDescriptor(deps),
    }));

  // SGLang flushes only an idle server (no request running or waiting): else it answers 400, the same text.
  app.on(["GET", "POST"], "/flush_cache", (c: Context) => {
    const idle = deps.ranks.every((r) => r.engine.load === 0);
    if (idle) deps.flush();
    return c.text(FLUSH_CACHE_TEXT, idle ? 200 : 400);
  });
  return app;
}

/**
 * SGLang's `kv_events` descriptor (server_args.describe_kv_events_publisher): the publisher's host as
 * configured (a wildcard stays one: the reader substitutes the host it asked), the base port, rank r on
 * base + r for r < dp_size, the topic and the block (page) size. SGLang cannot advertise an ephemeral
 * port (it answers null); the mock, whose ranks can each bind one, or a later start rank, also lists each
 * rank's endpoint in `publishers` (the EPP reads it) when they are not base + r.
 */
function kvEventsDescriptor(deps: SglangRoutesDeps) {
  const ranks = deps.ranks;
  const host = /^tcp:\/\/(\[[^\]]+\]|[^:/]+):/.exec(deps.kvEvents)?.[1]?.replace(/^\[|\]$/g, "") ?? "*";
  const ports = ranks.map((r) => parseEndpoint(r.events.endpoint).port);
  const base = ports[0] ?? 0;
  const consecutive = ranks.every((r, i) => r.engine.rank === i && ports[i] === base + i);
  return {
    publisher: "zmq",
    endpoint_host: host,
    endpoint_port_base: base,
    topic: deps.topic,
    block_size: deps.blockSize,
    dp_size: ranks.length,
    ...(consecutive ? {} : { publishers: ranks.map((r) => ({ dp_rank: r.engine.rank, endpoint: r.events.endpoint })) }),
  };
}
