import type { Logger } from "pino";
import { randomUUID } from "node:crypto";
import type { PdSplitPath } from "@kv-epp/protocol";
import { isObject, type Body } from "./apis.ts";
import { concurrentLegs, type ConcurrentLegs } from "./concurrent-legs.ts";
import { decodeBody, prefillBody } from "./prefill-request.ts";
import { bootstrapHost } from "./sglang.ts";

/**
 * `--kv-connector mooncake`: vLLM's MooncakeConnector, as llm-d's sidecar drives it (connector_mooncake.go).
 *
 * 1. The prefill worker's Mooncake bootstrap server (`--mooncake-bootstrap-port`, vLLM's
 *    VLLM_MOONCAKE_BOOTSTRAP_PORT, 8998 by default on both sides) is asked `GET /query`: it answers one entry per
 *    DP rank, `{"<rank>": {"engine_id": ..., "worker_addr": {...}}}`. The rank -> engine id map is cached per
 *    prefill worker (`host:port`), as llm-d's is; unlike llm-d's (an LRU of 1024 that never forgets), an entry
 *    lives at most ENGINE_MAP_TTL_MS and is dropped when a request through it fails on the prefill worker's side
 *    (its prefill leg fails, or its decode worker answers 5xx: a stale engine id fails the transfer), since vLLM
 *    draws a new engine id each time a prefill worker starts and a stale one fails every transfer; a 4xx (a
 *    client's 400, a 429) keeps it. The query is bounded by 5 s (llm-d's); concurrent requests share one query.
 * 2. A rank is chosen: the EPP's prefill rank when it names one the map has (that rank's engine), else one drawn
 *    uniformly (llm-d takes the first of a Go map, whose order is random). A named rank the map lacks is drawn
 *    over too, not refused: the EPP numbers ranks by what it scrapes, vLLM's bootstrap server by dp_rank, and if
 *    the two disagree a refusal would fail every request. It is counted, logged once per prefill worker and rank,
 *    and the map is asked again once (a rank that registered after the query), not on every request. The prefill
 *    leg carries the rank as `x-data-parallel-rank`, so the KV lands on the engine the decode worker pulls from.
 * 3. Both legs go at once (concurrent-legs.ts), paired by a `transfer_id` (`xfer-<uuid>`, llm-d's):
 *    - prefill: the client's body for one token (prefill-request.ts) with `kv_transfer_params`
 *      `{do_remote_prefill: false, do_remote_decode: true, transfer_id}`; vLLM's prefill holds its blocks under the
 *      transfer id and answers with no parameters (its request_finished returns none);
 *    - decode: the client's body with `{do_remote_prefill: true, do_remote_decode: false, transfer_id,
 *      remote_bootstrap_addr: "http://<prefill host>:<port>", remote_engine_id}`; vLLM's decode asks that bootstrap
 *      server where the engine's workers listen and pulls the blocks, waiting for the prefill if it is not done yet.
 *    The decode answer streams back unchanged (llm-d rewrites no usage for Mooncake: the prefill's count may come
 *    after the decode's first bytes). A prefill leg that fails before the decode's first byte cuts the decode leg
 *    (concurrent-legs.ts): vLLM's prefill would never hold the transfer id, and the decode's pull would wait
 *    VLLM_MOONCAKE_ABORT_REQUEST_TIMEOUT (480 s) for it.
 */

/** llm-d's bootstrap query timeout ("the same value as the other timeout on vllm"). */
export const BOOTSTRAP_QUERY_TIMEOUT_MS = 5_000;
/** How long a prefill worker's engine map is trusted without a failure. */
export const ENGINE_MAP_TTL_MS = 60_000;
/** Prefill workers remembered at once (llm-d's LRU size). */
const ENGINE_MAP_ENTRIES = 1024;

/** A bootstrap query that failed, by why: `bootstrap_unreachable` (no answer in time) or `bootstrap_answer` (one not usable). */
export class BootstrapError extends Error {
  constructor(readonly reason: "bootstrap_unreachable" | "bootstrap_answer", message: string) {
    super(message);
  }
}

/** DP rank (as the prefill worker's `x-data-parallel-rank` numbers it) -> Mooncake engine id. */
export type EngineMap = ReadonlyMap<string, string>;

/** Reads `/query`'s answer: the ranks whose entry names an engine id (entries without one are skipped, as llm-d does). */
export function engineMap(answer: unknown): EngineMap {
  if (!isObject(answer)) throw new BootstrapError("bootstrap_answer", "bootstrap /query answer is not a JSON object");
  const map = new Map<string, string>();
  for (const [rank, entry] of Object.entries(answer)) {
    if (isObject(entry) && typeof entry.engine_id === "string") map.set(rank, entry.engine_id);
  }
  if (map.size === 0) throw new BootstrapError("bootstrap_answer", "engine_id not found in the bootstrap /query answer");
  return map;
}

/** The prefill workers' engine maps, by `host:port`: queried once, shared while in flight, forgotten on expiry or failure. */
export class EngineMapCache {
  /** `refreshed`: this map was asked for a rank the one before lacked (it is not asked again for that reason) */
  private readonly entries = new Map<string, { map: Promise<EngineMap>; until: number; refreshed: boolean }>();
  /** `prefiller#rank` named by the EPP and found in no map, already logged */
  private readonly missing = new Set<string>();

  constructor(private readonly now: () => number = performance.now.bind(performance)) {}

  get(prefiller: string, bootstrapAddr: string): Promise<EngineMap> {
    const hit = this.entries.get(prefiller);
    if (hit && hit.until > this.now()) {
      // Most recently used last: the first key is the one to evict.
      this.entries.delete(prefiller);
      this.entries.set(prefiller, hit);
      return hit.map;
    }
    return this.query(prefiller, bootstrapAddr, false);
  }

  /** Drops the prefill worker's map (only `which`, when given: a newer query's is kept). */
  forget(prefiller: string, which?: Promise<EngineMap>): void {
    if (which === undefined || this.entries.get(prefiller)?.map === which) this.entries.delete(prefiller);
  }

  /**
   * The EPP named `rank`, which `which` lacks: the map is asked again, once (not when `which` is itself such a
   * second answer, nor when a newer one replaced it). True the first time this prefill worker lacked this rank.
   */
  missingRank(prefiller: string, bootstrapAddr: string, which: Promise<EngineMap>, rank: string): boolean {
    const hit = this.entries.get(prefiller);
    if (hit?.map === which && !hit.refreshed) void this.query(prefiller, bootstrapAddr, true).catch(() => undefined);
    const key = `${prefiller}#${rank}`;
    if (this.missing.has(key)) return false;
    if (this.missing.size >= ENGINE_MAP_ENTRIES) this.missing.clear();
    this.missing.add(key);
    return true;
  }

  private query(prefiller: string, bootstrapAddr: string, refreshed: boolean): Promise<EngineMap> {
    const map = queryEngineMap(bootstrapAddr);
    const entry = { map, until: this.now() + ENGINE_MAP_TTL_MS, refreshed };
    this.entries.delete(prefiller);
    this.entries.set(prefiller, entry);
    if (this.entries.size > ENGINE_MAP_ENTRIES) this.entries.delete(this.entries.keys().next().value!);
    // A failed query is not kept: the next request asks again.
    map.catch(() => this.forget(prefiller, entry.map));
    return map;
  }
}

async function queryEngineMap(bootstrapAddr: string): Promise<EngineMap> {
  let res: Response;
  try {
    // Not the client's signal: the answer is shared by every request waiting on it.
    res = await fetch(`${bootstrapAddr}/query`, { signal: AbortSignal.timeout(BOOTSTRAP_QUERY_TIMEOUT_MS) });
  } catch (err) {
    throw new BootstrapError("bootstrap_unreachable", `Mooncake bootstrap server ${bootstrapAddr} unreachable: ${(err as Error).message}`);
  }
  let answer: unknown;
  try {
    answer = await res.json();
  } catch {
    answer = undefined;
  }
  if (!res.ok) throw new BootstrapError("bootstrap_answer", `Mooncake bootstrap server ${bootstrapAddr} answered /query with ${res.status}`);
  return engineMap(answer);
}

/**
 * The rank the prefill leg is pinned to: `named` when the map has it, else one drawn uniformly (`fallback`: the
 * EPP named a rank the map lacks).
 */
export function chooseRank(map: EngineMap, named: string | undefined, random: () => number = Math.random): { rank: string; engineId: string; fallback: boolean } {
  const engineId = named === undefined ? undefined : map.get(named);
  if (named !== undefined && engineId !== undefined) return { rank: named, engineId, fallback: false };
  const ranks = [...map.keys()];
  const rank = ranks[Math.min(ranks.length - 1, Math.floor(random() * ranks.length))]!;
  return { rank, engineId: map.get(rank)!, fallback: named !== undefined };
}

/** Both legs' bodies for one transfer. */
export function mooncakeBodies(client: Body, api: PdSplitPath, t: { transferId: string; bootstrapAddr: string; engineId: string }): { prefill: Body; decode: Body } {
  return {
    prefill: { ...prefillBody(client, api), kv_transfer_params: { do_remote_prefill: false, do_remote_decode: true, transfer_id: t.transferId } },
    decode: decodeBody(client, {
      do_remote_prefill: true, do_remote_decode: false, transfer_id: t.transferId, remote_bootstrap_addr: t.bootstrapAddr, remote_engine_id: t.engineId,
    }),
  };
}

export type MooncakeLegs = Omit<ConcurrentLegs, "prefillUrl" | "decodeUrl" | "prefillBody" | "decodeBody" | "onFailure"> & {
  prefiller: string;
  api: PdSplitPath;
  /** the path and query the client sent, for both legs */
  target: string;
  client: Body;
  decoder: string;
  bootstrapPort: number;
  /** the EPP's prefill rank, when it names one for this prefiller */
  prefillRank: string | undefined;
  engines: EngineMapCache;
  log: Logger;
};

/**
 * The engine map (rejects with a BootstrapError before any leg is sent), then both legs: resolves with the decode
 * worker's answer, to stream; rejects when the prefill leg failed before it (PrefillLegFailed) or the decode
 * worker cannot be reached.
 */
export async function mooncakeLegs(p: MooncakeLegs): Promise<Response> {
  const bootstrapAddr = `http://${bootstrapHost(p.prefiller)}:${p.bootstrapPort}`;
  const map = p.engines.get(p.prefiller, bootstrapAddr);
  const chosen = chooseRank(await map, p.prefillRank);
  if (chosen.fallback) {
    p.metrics.rankFallback();
    if (p.engines.missingRank(p.prefiller, bootstrapAddr, map, p.prefillRank!)) {
      p.log.warn({ peer: p.prefiller, rank: p.prefillRank, ranks: [...(await map).keys()], drawn: chosen.rank }, "the EPP's prefill rank is not in the Mooncake bootstrap /query answer: a drawn rank serves it (logged once)");
    }
  }
  // The client left while the map was looked up: no leg is sent.
  if (p.signal.aborted) throw p.signal.reason;
  const transferId = `xfer-${randomUUID()}`;
  const bodies = mooncakeBodies(p.client, p.api, { transferId, bootstrapAddr, engineId: chosen.engineId });
  const prefillHeaders = new Headers(p.prefillHeaders);
  prefillHeaders.set("x-data-parallel-rank", chosen.rank);
  return concurrentLegs({
    ...p, prefillHeaders,
    prefillUrl: `http://${p.prefiller}${p.target}`, decodeUrl: `${p.decoder}${p.target}`,
    prefillBody: JSON.stringify(bodies.prefill), decodeBody: JSON.stringify(bodies.decode),
    log: p.log.child({ peer: p.prefiller, transferId, rank: chosen.rank, engineId: chosen.engineId }),
    onFailure: () => p.engines.forget(p.prefiller, map),
  });
}
