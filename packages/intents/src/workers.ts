// From attachments to the EPP's worker set. Pod discovery guesses a worker's KV endpoint from its IP
// and the port convention; an intent states it per rank. Both paths end in one worker set.
import { rankSources, type DpLbMode, type RankSource, type WorkerRole, type WorkerSpec } from "@kv-epp/protocol";
import type { AttachmentIntent } from "./protocol.ts";


/** A WorkerSpec whose ranks come from intents: listeners follow `ranks`, not port + r. */
export type IntentWorkerSpec = WorkerSpec & { ranks: RankSource[] };

/** `dpLb`, `role`: the LB mode and the disaggregation role its intents state (the first that states one). */
export type IntentWorker = { id: string; address?: string; metricsUrl?: string; dpLb?: DpLbMode; role?: WorkerRole; ranks: RankSource[] };

/**
 * `kubernetes`: pod discovery (Ready pods only) decides membership; intents only describe the ranks of
 * the pods it lists. `static`: the configured list and the intents together define the workers.
 */
export type MergeMode = "kubernetes" | "static";

/** An intent worker that is not in the worker set: no listener, never picked. */
export type UnroutableWorker = {
  id: string;
  /** `no-ready-pod`: kubernetes mode, no Ready pod matches it (crashed, terminating, not yet Ready). `no-address`: static mode, its intents state no address. */
  reason: "no-ready-pod" | "no-address";
  address?: string;
};

/** An intent worker merged into a worker of another id (same address): one listener per endpoint. */
export type MergedAlias = { intentWorker: string; worker: string };

export type MergedWorkers<T extends WorkerSpec> = { workers: (T | IntentWorkerSpec)[]; unroutable: UnroutableWorker[]; aliases: MergedAlias[] };

/** Groups attachments by worker (input order kept: the watcher sorts by worker, then rank). */
export function intentWorkers(desired: readonly AttachmentIntent[]): IntentWorker[] {
  const byId = new Map<string, IntentWorker>();
  for (const a of desired) {
    let w = byId.get(a.workerId);
    if (!w) byId.set(a.workerId, (w = { id: a.workerId, ranks: [] }));
    w.address ??= a.address;
    w.metricsUrl ??= a.metricsUrl;
    w.dpLb ??= a.dpLb;
    w.role ??= a.role;
    w.ranks.push({
      dpRank: a.dpRank,
      kvEvents: a.endpoint,
      ...(a.replayEndpoint ? { replay: a.replayEndpoint } : {}),
      topic: a.topic,
      blockSize: a.blockSize,
    });
  }
  return [...byId.values()];
}

/**
 * `base` with the intents' ranks. A worker whose intents state hybrid or external LB serves its ranks
 * from one API server that numbers them from 0 (unless it already lists its servers, one per port).
 * The role the listing gives (a pod's label, a static entry's `role`) wins over the intents'.
 */
function withRanks<T extends WorkerSpec>(base: T, ranks: RankSource[], from: readonly IntentWorker[]): T & { ranks: RankSource[] } {
  const first = ranks[0]!;
  const dpLb = from.find((w) => w.dpLb)?.dpLb;
  const role = base.role ?? from.find((w) => w.role)?.role;
  const local = dpLb !== undefined && dpLb !== "internal" && !(base.servers && base.servers.length > 1);
  return {
    ...base, kvEvents: first.kvEvents, replay: first.replay, dpSize: ranks.length, ranks,
    ...(local ? { servers: [{ address: base.address, ranks: ranks.map((r) => r.dpRank) }] } : {}),
    ...(role ? { role } : {}),
  };
}

/**
 * The ranks of several intent workers on one worker: per rank, the first one stating it wins; a rank
 * none states keeps its `listed` source (the port convention). A worker registers one intent per rank,
 * so the EPP sees them arrive one at a time (and go one at a time): without that fallback a listed
 * rank whose intent is not (or no longer) there would lose its listener and its blocks. The fallback
 * holds only while the intents and the listing share a rank: intents that state none of the listed
 * ranks (a worker starting at rank 2 on a pod listed with the default rank 0) show the listing was a
 * guess, and a guessed rank would be a listener on a port nobody publishes.
 */
function unionRanks(from: readonly IntentWorker[], listed: readonly RankSource[] = []): RankSource[] {
  const byRank = new Map<number, RankSource>();
  for (const w of from) for (const r of w.ranks) if (!byRank.has(r.dpRank)) byRank.set(r.dpRank, r);
  const agree = listed.some((r) => byRank.has(r.dpRank));
  if (agree) for (const r of listed) if (!byRank.has(r.dpRank)) byRank.set(r.dpRank, r);
  return [...byRank.values()].sort((a, b) => a.dpRank - b.dpRank);
}

/** `ranks` without those the listing leaves out (a pod's active-ports annotation): they get no listener, whatever intents state. */
export function servedRanks(base: WorkerSpec, ranks: RankSource[]): RankSource[] {
  const out = base.inactiveRanks;
  return out === undefined ? ranks : ranks.filter((r) => !out.includes(r.dpRank));
}

/** The host part of `ip:port`, `[v6]:port` or `tcp://ip:port`, brackets removed. */
export function hostOf(endpoint: string): string | undefined {
  const m = /^(?:[a-z]+:\/\/)?(\[[^\]]*\]|[^:/]+)(?::\d+)?(?:\/.*)?$/.exec(endpoint);
  return m ? m[1]!.replace(/^\[|\]$/g, "") : undefined;
}

/** The addresses an intent worker can be recognised by: its stated address, else its ranks' endpoints. */
function intentHosts(w: IntentWorker): string[] {
  const hosts = w.address ? [hostOf(w.address)] : w.ranks.map((r) => hostOf(r.kvEvents));
  return [...new Set(hosts.filter((h): h is string => h !== undefined))];
}

/**
 * The worker an intent worker belongs to: same id; else same address (ip:port); else, in kubernetes
 * mode, the one pod with that IP (a pod IP is the pod's; ignored when several pods share an IP, as
 * with hostNetwork). Static entries may share an IP (several workers on one machine), so not there.
 */
function matcher<T extends WorkerSpec>(pods: readonly T[], mode: MergeMode): (w: IntentWorker) => T | undefined {
  const byId = new Map(pods.map((p) => [p.id, p]));
  const byAddress = new Map<string, T | null>();
  const byIp = new Map<string, T | null>();
  for (const p of pods) {
    byAddress.set(p.address, byAddress.has(p.address) ? null : p);
    const ip = hostOf(p.address);
    if (ip !== undefined) byIp.set(ip, byIp.has(ip) ? null : p);
  }
  return (w) => {
    const same = byId.get(w.id) ?? (w.address ? byAddress.get(w.address) : undefined);
    if (same) return same;
    if (mode !== "kubernetes") return undefined;
    const found = new Set(intentHosts(w).map((h) => byIp.get(h)));
    const [only] = found;
    return found.size === 1 && only ? only : undefined;
  };
}

/**
 * The one worker set from pod discovery (or the static list) and the intents.
 *
 * Both modes: an intent worker matched to a listed worker (by id, or by address under another id)
 * gives it its per-rank sources (endpoints, topic, block size), rank by rank: a listed rank no intent
 * states keeps its listed source. The listed worker keeps its id, address and metrics URL. Several
 * intent workers on one listed worker: the one of the same id first, then the others for ranks still
 * missing, so each endpoint gets one listener (an alias is reported for each that gives it a rank).
 *
 * `static` (the default, no pod discovery): an unmatched intent worker joins with the address its
 * intent states; one without an address is `unroutable` (`no-address`).
 *
 * `kubernetes`: pod discovery decides membership. An unmatched intent worker (its pod crashed, is
 * terminating or not Ready, or is not in the pool) is `unroutable` (`no-ready-pod`): it gets no
 * listener, so it can never be picked, and its blocks stay out of the index; they come through the
 * listener (replay, or the worker's next events) once its pod is Ready again.
 */
export function mergeWorkerSets<T extends WorkerSpec>(
  pods: readonly T[],
  intents: readonly IntentWorker[],
  opts: { mode?: MergeMode } = {},
): MergedWorkers<T> {
  const mode = opts.mode ?? "static";
  const match = matcher(pods, mode);
  const contributions = new Map<T, IntentWorker[]>();
  const unroutable: UnroutableWorker[] = [];
  /** Static mode: intent workers joined to the first of their address. */
  const joined: MergedAlias[] = [];
  /** Static mode: intent-only workers by the address they state (two ids on one address are one worker). */
  const joining = new Map<string, IntentWorker[]>();
  for (const w of intents) {
    if (w.ranks.length === 0) continue;
    const pod = match(w);
    if (pod) {
      const list = contributions.get(pod) ?? [];
      // The same-id intent worker goes first: its ranks win.
      if (pod.id === w.id) list.unshift(w);
      else list.push(w);
      contributions.set(pod, list);
    } else if (mode === "kubernetes") {
      unroutable.push({ id: w.id, reason: "no-ready-pod", ...(w.address ? { address: w.address } : {}) });
    } else if (!w.address) {
      unroutable.push({ id: w.id, reason: "no-address" });
    } else {
      const list = joining.get(w.address) ?? [];
      if (list.length > 0) joined.push({ intentWorker: w.id, worker: list[0]!.id });
      joining.set(w.address, [...list, w]);
    }
  }
  const aliases: MergedAlias[] = [];
  const workers: (T | IntentWorkerSpec)[] = pods.map((p) => {
    const from = contributions.get(p);
    const ranks = from ? servedRanks(p, unionRanks(from, rankSources(p))) : [];
    if (!from || ranks.length === 0) return p;
    // An alias only for an intent worker whose ranks the worker took: not one whose ranks are all behind
    // inactive ports or all stated by the worker's own intents.
    for (const w of from) if (w.id !== p.id && w.ranks.some((r) => ranks.includes(r))) aliases.push({ intentWorker: w.id, worker: p.id });
    return withRanks(p, ranks, from);
  });
  aliases.push(...joined);
  for (const [address, [first, ...rest]] of joining) {
    const metricsUrl = first!.metricsUrl ?? rest.find((w) => w.metricsUrl)?.metricsUrl ?? `http://${address}/metrics`;
    const all = [first!, ...rest];
    workers.push(withRanks({ id: first!.id, address, kvEvents: "", dpSize: 0, metricsUrl }, unionRanks(all), all));
  }
  return { workers, unroutable, aliases };
}
