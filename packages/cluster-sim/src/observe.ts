// What the scenario reads from the processes, through their own interfaces only: an EPP's /dump,
// /workers and recovery-state metric, a mock worker's cache usage, and the order of log lines.
import { readDump } from "@kv-epp/recovery";

export type EppPorts = { metrics: number; selection: number };
const EPP_PORTS: EppPorts = { metrics: 9090, selection: 9093 };

/**
 * An EPP's /dump as a sorted list of canonical events: model key, block size, worker, rank, parent
 * and blocks (u64 values as exact decimal strings). Event ids are left out: each replica numbers its
 * own events.
 */
export async function dumpEvents(eppIp: string, ports: EppPorts = EPP_PORTS): Promise<string[]> {
  const res = await fetch(`http://${eppIp}:${ports.selection}/dump`, { signal: AbortSignal.timeout(15_000) });
  if (!res.ok || !res.body) throw new Error(`${eppIp} /dump answered ${res.status}`);
  const out: string[] = [];
  for await (const { key, blockSize, event: e } of readDump(res.body)) {
    out.push(JSON.stringify([key, blockSize, e.workerId, e.dpRank, e.parentHash?.toString() ?? null, e.blocks.map((b) => [b.blockHash.toString(), b.tokensHash.toString()])]));
  }
  return out.sort();
}

/**
 * The blocks of canonical events, one fact per block (its worker, rank, parent, hash, tokens hash):
 * the index's content whatever the chains were cut into events, for "contains" comparisons.
 */
export function blockFacts(events: string[]): Set<string> {
  const facts = new Set<string>();
  for (const line of events) {
    const [key, , worker, rank, parent, blocks] = JSON.parse(line) as [string, number, string, number, string | null, [string, string][]];
    let prev = parent;
    for (const [hash, tokens] of blocks) {
      facts.add(JSON.stringify([key, worker, rank, prev, hash, tokens]));
      prev = hash;
    }
  }
  return facts;
}

export type RecoveryStateName = "recovered" | "empty_bootstrap" | "recovery_disabled";

/** The state `dynamo_epp_kv_recovery_state{state}` reports as 1; undefined before recovery has ended. */
export async function recoveryState(eppIp: string, ports: EppPorts = EPP_PORTS): Promise<RecoveryStateName | undefined> {
  const text = await (await fetch(`http://${eppIp}:${ports.metrics}/metrics`, { signal: AbortSignal.timeout(5000) })).text();
  const m = /^dynamo_epp_kv_recovery_state\{state="(\w+)"\} 1$/m.exec(text);
  return m?.[1] as RecoveryStateName | undefined;
}

export type EppLoad = { inflight: number; peerRequests: number };

/**
 * Requests an EPP counts in flight: its own (`dynamo_epp_inflight_requests`) and those its peer
 * replicas attributed to the workers over replica-agg (`dynamo_epp_replica_agg_sibling_requests`, 0
 * where the EPP has no such metric). Load weighs in the pick, so a routing assertion waits for 0.
 */
export async function eppLoad(eppIp: string, ports: EppPorts = EPP_PORTS): Promise<EppLoad> {
  const text = await (await fetch(`http://${eppIp}:${ports.metrics}/metrics`, { signal: AbortSignal.timeout(5000) })).text();
  const gauge = (name: string) => Number(new RegExp(`^${name} (\\S+)$`, "m").exec(text)?.[1] ?? 0);
  return { inflight: gauge("dynamo_epp_inflight_requests"), peerRequests: gauge("dynamo_epp_replica_agg_sibling_requests") };
}

export type EppWorker = { worker_id: string; dp_rank: number; address: string; connected: boolean; blocks: number };

export async function eppWorkers(eppIp: string, ports: EppPorts = EPP_PORTS): Promise<EppWorker[]> {
  const res = await fetch(`http://${eppIp}:${ports.selection}/workers`, { signal: AbortSignal.timeout(5000) });
  return ((await res.json()) as EppWorker[]).sort((a, b) => a.worker_id.localeCompare(b.worker_id) || a.dp_rank - b.dp_rank);
}

/**
 * Distinct blocks a mock worker's caches hold, summed over its ranks (any of its API servers answers
 * for all of them), read from its ground truth (`GET /admin/cache`). vLLM's metrics cannot say this:
 * `vllm:kv_cache_usage_perc` counts the slots running requests reference, not the cached ones.
 */
export async function workerCachedBlocks(address: string): Promise<number> {
  const res = await fetch(`http://${address}/admin/cache`, { signal: AbortSignal.timeout(5000) });
  if (!res.ok) throw new Error(`${address}: GET /admin/cache answered ${res.status}`);
  const truth = (await res.json()) as { ranks: { blocks: unknown[] }[] };
  return truth.ranks.reduce((n, r) => n + r.blocks.length, 0);
}

export type LogRecord = { msg: string } & Record<string, unknown>;

/** Each JSON (pino) log line with a `msg`, parsed, in order; other lines are skipped. */
export function logRecords(lines: readonly string[]): LogRecord[] {
  const out: LogRecord[] = [];
  for (const line of lines) {
    if (!line.startsWith("{")) continue;
    try {
      const rec = JSON.parse(line) as Record<string, unknown>;
      if (typeof rec.msg === "string") out.push(rec as LogRecord);
    } catch {
      // not a log record
    }
  }
  return out;
}

/** The `msg` of each JSON (pino) log line, in order; other lines are skipped. */
export function logMessages(lines: readonly string[]): string[] {
  return logRecords(lines).map((r) => r.msg);
}
