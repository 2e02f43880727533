// A sidecar's job next to a real vLLM: read where the worker says its ranks publish KV events (its HTTP
// `GET /kv_event_sources`, or `Control.GetKvEventSources` over gRPC: reported-sources.ts) and register
// one attachment intent per reported rank. The EPP then subscribes to the ports the publishers really
// bound, ephemeral ones (`tcp://*:0`) included, with no port convention to agree on.
import { Backoff, pause } from "@kv-epp/protocol";
import pino from "pino";
import type { IntentOwner } from "./owner.ts";
import { readReportedSources, ReportedSourcesError, type ReportedSources } from "./reported-sources.ts";
import { REGISTER_BACKOFF } from "./retry.ts";
import { registerWorkerIntents, type RegisterWorkerIntentsOptions } from "./worker-side.ts";

export type RegisterReportedIntentsOptions = Omit<RegisterWorkerIntentsOptions, "ranks" | "topic"> & {
  /** The worker's API server (`http://host:port`) or gRPC server (`grpc://host:port`). */
  from: string;
  timeoutMs?: number;
};

/**
 * Reads the worker's reported KV-event sources, then registers their intents. With `retry`, a worker
 * not answering yet or reporting no source (events not enabled yet, engines still starting) is asked
 * again with backoff until `signal` aborts.
 */
export async function registerReportedIntents(o: RegisterReportedIntentsOptions): Promise<{ owner: IntentOwner; reported: ReportedSources }> {
  const log = o.log ?? pino({ level: "silent" });
  const sleep = o.sleep ?? pause;
  const backoff = new Backoff(REGISTER_BACKOFF);
  let reported: ReportedSources;
  for (;;) {
    try {
      reported = await readReportedSources(o.from, { timeoutMs: o.timeoutMs });
      if (reported.sources.length === 0) throw new ReportedSourcesError(`${o.from} reports no ZMQ KV-event source`);
      break;
    } catch (err) {
      if (!o.retry || !(err instanceof ReportedSourcesError) || o.signal?.aborted) throw err;
      const delay = backoff.next();
      log.warn({ worker: o.workerId, err: err.message, ms: delay }, "reading the worker's KV-event sources failed, retrying");
      await sleep(delay, o.signal ?? new AbortController().signal);
      if (o.signal?.aborted) throw err;
    }
  }
  if (reported.skipped + reported.unknownFields > 0)
    log.info({ worker: o.workerId, skipped: reported.skipped, unknownFields: reported.unknownFields }, "KV-event sources: entries or fields skipped");
  // One topic per worker: vLLM's publishers all take it from the one --kv-events-config.
  const topics = new Set(reported.sources.map((s) => s.topic));
  if (topics.size > 1) throw new ReportedSourcesError(`${o.from} reports several topics (${[...topics].join(", ")}); an intent worker has one`);
  const { from: _from, timeoutMs: _t, ...rest } = o;
  const owner = await registerWorkerIntents({ ...rest, ranks: reported.sources, topic: reported.sources[0]!.topic, log });
  return { owner, reported };
}
