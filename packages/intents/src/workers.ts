// From attachments to the EPP's worker set. Pod discovery guesses a worker's KV endpoint from its IP
// and the port convention; an intent states it per rank. Both paths end in one worker set: a worker
// known to both keeps the pod's address and takes the intents' endpoints.
import type { AttachmentIntent } from "./protocol.ts";

/** One rank's KV source, as an intent states it. */
export type RankSource = { dpRank: number; kvEvents: string; replay?: string; topic: string };

/** Structurally the EPP's WorkerSpec (packages/epp/src/workers/registry.ts). */
export type WorkerSpecLike = { id: string; address: string; kvEvents: string; replay?: string; dpSize: number; metricsUrl: string };

/** A WorkerSpec whose ranks come from intents: listeners follow `ranks`, not port + r. */
export type IntentWorkerSpec = WorkerSpecLike & { ranks: RankSource[] };

export type IntentWorker = { id: string; address?: string; metricsUrl?: string; ranks: RankSource[] };

/** Groups attachments by worker (input order kept: the watcher sorts by worker, then rank). */
export function intentWorkers(desired: readonly AttachmentIntent[]): IntentWorker[] {
  const byId = new Map<string, IntentWorker>();
  for (const a of desired) {
    let w = byId.get(a.workerId);
    if (!w) byId.set(a.workerId, (w = { id: a.workerId, ranks: [] }));
    w.address ??= a.address;
    w.metricsUrl ??= a.metricsUrl;
    w.ranks.push({ dpRank: a.dpRank, kvEvents: a.endpoint, ...(a.replayEndpoint ? { replay: a.replayEndpoint } : {}), topic: a.topic });
  }
  return [...byId.values()];
}

function withRanks<T extends WorkerSpecLike>(base: T, ranks: RankSource[]): T & { ranks: RankSource[] } {
  const first = ranks[0]!;
  return { ...base, kvEvents: first.kvEvents, replay: first.replay, dpSize: ranks.length, ranks };
}

/**
 * The one worker set: pod-discovered workers, with the ranks of their intents where they have some, plus
 * intent-only workers that state their own address. An intent-only worker without an address cannot be
 * routed to and waits for its pod (it is returned in `unroutable`).
 */
export function mergeWorkerSets<T extends WorkerSpecLike>(
  pods: readonly T[],
  intents: readonly IntentWorker[],
): { workers: (T | IntentWorkerSpec)[]; unroutable: string[] } {
  const byId = new Map(intents.map((w) => [w.id, w]));
  const workers: (T | IntentWorkerSpec)[] = pods.map((p) => {
    const w = byId.get(p.id);
    return w && w.ranks.length > 0 ? withRanks(p, w.ranks) : p;
  });
  const podIds = new Set(pods.map((p) => p.id));
  const unroutable: string[] = [];
  for (const w of intents) {
    if (podIds.has(w.id) || w.ranks.length === 0) continue;
    if (!w.address) {
      unroutable.push(w.id);
      continue;
    }
    const base = { id: w.id, address: w.address, kvEvents: "", dpSize: 0, metricsUrl: w.metricsUrl ?? `http://${w.address}/metrics` };
    workers.push(withRanks(base, w.ranks));
  }
  return { workers, unroutable };
}
