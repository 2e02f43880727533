// The validation scenario of issue 7 (the same five steps deploy/kind/e2e-validate.ts runs on kind),
// against deploy/base in the cluster simulation: two EPP replicas and two mock workers as real
// processes, each pod on its own 127.0.5.x with the standard ports, a fake API server holding the EPP
// to its Role, a simulated kubelet (grpc readiness probe, preStop, SIGTERM) and EndpointSlice
// controller. The steps share one cluster, in order; each is its own test.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { killAll, waitFor } from "@kv-epp/testkit";
import { blockFacts, dumpEvents, eppWorkers, Gateway, logMessages, ReadyEndpointsWatch, recoveryState, SimulatedCluster, workerCachedBlocks, type Routed } from "../src/index.ts";

const MODEL = "Qwen/Qwen3-0.6B"; // deploy/base's DYN_EPP_MODEL and the mock workers' --model
const REQUEST_SERVICE = "dynamo-epp"; // what the gateway calls
const PEER_SERVICE = "dynamo-epp-peer";
const FAMILIES = 6; // prompts sharing a long prefix

let cluster: SimulatedCluster;
let gateway: Gateway;

beforeAll(async () => {
  cluster = await SimulatedCluster.start();
  gateway = new Gateway();
}, 30_000);

afterAll(async () => {
  gateway?.close();
  await cluster?.close();
  await killAll("SIGKILL", 0);
}, 30_000);

const workerAddress = (pod: string) => `${cluster.ip(pod)}:8000`;

/**
 * ~70 blocks shared by every prompt of a family (byte tokens), then a question of its own. The
 * family comes first so that families share no block: a new family may land on either worker.
 */
function prompt(family: number, question: string): string {
  return `Family ${family} system prompt. ${"The quick brown fox jumps over the lazy dog. ".repeat(24)}Question ${question}?`;
}

/** One request as a gateway sends it: to the `via`-th ready EPP of the request Service (modulo their number), then to its pick. */
async function request(family: number, question: string, via = family): Promise<Routed> {
  const epps = cluster.readyAddresses(REQUEST_SERVICE);
  if (epps.length === 0) throw new Error("no ready EPP behind the request Service");
  const r = await gateway.completion(epps[via % epps.length]!, { model: MODEL, prompt: prompt(family, question), max_tokens: 4 });
  expect(r.status).toBe(200);
  return r;
}

/**
 * Waits until every ready EPP indexes exactly what the workers' caches hold (per worker, in blocks),
 * and every ready EPP's /dump is the same; returns that dump.
 */
async function settled(what: string): Promise<string[]> {
  let last = "";
  try {
    return await waitFor(
      async () => {
        const epps = cluster.readyEpps();
        const cached = new Map(await Promise.all(cluster.readyWorkers().map(async (w) => [w, await workerCachedBlocks(workerAddress(w))] as const)));
        for (const e of epps) {
          const listed = await eppWorkers(cluster.ip(e));
          last = `${e} lists ${JSON.stringify(listed)}; workers' caches ${JSON.stringify([...cached])}`;
          if (listed.length !== cached.size) return undefined;
          for (const w of listed) if (!w.connected || w.blocks !== cached.get(w.worker_id)) return undefined;
        }
        const dumps = await Promise.all(epps.map((e) => dumpEvents(cluster.ip(e))));
        last = `dumps of ${epps.join(", ")}: ${dumps.map((d) => `${d.length} events / ${blockFacts(d).size} blocks`).join(", ")}`;
        return dumps.every((d) => JSON.stringify(d) === JSON.stringify(dumps[0])) ? dumps[0] : undefined;
      },
      { timeoutMs: 30_000, intervalMs: 200, message: what },
    );
  } catch (e) {
    throw new Error(`${(e as Error).message}; last seen: ${last}`);
  }
}

async function cachedTotal(): Promise<number> {
  let n = 0;
  for (const w of cluster.readyWorkers()) n += await workerCachedBlocks(workerAddress(w));
  return n;
}

const logOf = (pod: string) => logMessages(cluster.sim.process(pod).lines);

/** Every pod's API client stayed within the Roles deploy/base binds to its service account. */
function expectNothingForbidden(): void {
  expect(cluster.api.requests.filter((r) => r.status === 403).map((r) => `${r.user} ${r.verb} ${r.plural}`)).toEqual([]);
}

/**
 * Subscribe first (DESIGN 7.1), checked in a recovering replica's log: "subscribed" comes before
 * "recovered ... from peer", and the subscription is real by then: its listener to every worker has
 * connected before the dump is fetched (a listener still connecting misses what is published
 * between the peer's snapshot and its connection).
 */
function expectSubscribedBeforeRecovery(pod: string): void {
  const msgs = logOf(pod);
  const subscribed = msgs.findIndex((m) => /subscribed/.test(m));
  const fetching = msgs.findIndex((m) => /fetching dump/.test(m));
  const recovered = msgs.findIndex((m) => /recovered\b.*\bfrom peer/.test(m));
  expect(subscribed).toBeGreaterThanOrEqual(0);
  expect(recovered).toBeGreaterThan(subscribed);
  const connected = msgs.slice(0, fetching).filter((m) => m === "publisher connected").length;
  expect({ pod, workersConnectedBeforeDump: connected }).toEqual({ pod, workersConnectedBeforeDump: cluster.readyWorkers().length });
}

test("1. cold start: two replicas started together both become Ready (no deadlock) and report empty_bootstrap", async () => {
  // Both are held out of the EndpointSlices until each is SERVING on its own: neither can have seen
  // the other as a serving peer, whatever their start-up speeds.
  const pods = await cluster.coldStart(2);
  expect(cluster.readyEpps()).toEqual([...pods].sort());
  for (const p of pods) {
    expect(await recoveryState(cluster.ip(p))).toBe("empty_bootstrap");
    expect(logOf(p).some((m) => m.includes("EMPTY KV index"))).toBe(true);
  }
  await waitFor(() => cluster.readyWorkers().length === 2, { timeoutMs: 30_000, message: "two ready mock workers" });
  expectNothingForbidden();
}, 90_000);

test("2. traffic through the EPPs fills the workers' caches, and both replicas' indexes agree", async () => {
  const workers = cluster.readyWorkers();
  for (const e of cluster.readyEpps()) {
    await waitFor(async () => (await eppWorkers(cluster.ip(e))).filter((w) => w.connected).length === workers.length, {
      timeoutMs: 30_000,
      message: `${e} subscribed to both workers`,
    });
  }
  // Round 1 places each family on some worker, through alternating EPPs.
  const placed = new Map<number, string>();
  for (let f = 0; f < FAMILIES; f++) placed.set(f, (await request(f, "a")).endpoint);
  for (const endpoint of placed.values()) expect(workers.map(workerAddress)).toContain(endpoint);
  await settled("both indexes equal to the workers' caches after round 1");

  // Round 2 goes through the other EPP for each family: it routes by what the worker's events told it.
  for (let f = 0; f < FAMILIES; f++) {
    const r = await request(f, "b", f + 1);
    expect(r.endpoint).toBe(placed.get(f)!);
    expect(r.cachedTokens).toBeGreaterThan(0);
  }
  const dump = await settled("both indexes equal to the workers' caches after round 2");
  expect(dump.length).toBeGreaterThan(0);
  expect(blockFacts(dump).size).toBe(await cachedTotal());
}, 90_000);

test("3. a deleted replica's replacement subscribes, then recovers from the survivor, and holds the survivor's events", async () => {
  const [victim, survivor] = cluster.readyEpps() as [string, string];
  const before = await dumpEvents(cluster.ip(survivor));
  await cluster.sim.deletePod(victim, { wait: false });
  const fresh = await waitFor(() => cluster.readyEpps().find((p) => p !== victim && p !== survivor), {
    timeoutMs: 60_000,
    message: "a ready replacement",
  });

  expectSubscribedBeforeRecovery(fresh);
  const line = cluster.sim.process(fresh).lines.find((l) => /recovered\b.*\bfrom peer/.test(l))!;
  expect(line).toContain(cluster.ip(survivor)); // never the terminating victim
  expect(await recoveryState(cluster.ip(fresh))).toBe("recovered");

  const after = await dumpEvents(cluster.ip(fresh));
  expect(after.length).toBe(before.length);
  expect(after).toEqual(before);
  expect(await dumpEvents(cluster.ip(survivor))).toEqual(before);
}, 90_000);

test("4. a rolling update never leaves zero ready replicas, and the index survives it", async () => {
  const before = await settled("indexes settled before the rollout");
  const old = cluster.epps.pods();
  const watch = await ReadyEndpointsWatch.start(cluster.api.kubeConfig, cluster.namespace, PEER_SERVICE);
  // New families keep arriving during the rollout: their events must reach replicas that are
  // recovering at that moment (subscribed before the dump).
  let rolling = true;
  let sent = 0;
  const traffic = (async () => {
    while (rolling) await request(FAMILIES + sent++, "c");
  })();
  try {
    const fresh = await cluster.epps.rolloutRestart();
    await waitFor(() => old.every((p) => cluster.sim.podState(p) === "gone"), { timeoutMs: 60_000, message: "old replicas gone" });
    rolling = false;
    await traffic;
    expect(cluster.readyEpps()).toEqual([...fresh].sort());
    for (const p of fresh) {
      expect(await recoveryState(cluster.ip(p))).toBe("recovered");
      expectSubscribedBeforeRecovery(p);
    }
  } finally {
    rolling = false;
    await traffic.catch(() => {});
    await watch.stop();
  }
  expect(watch.errors).toEqual([]);
  expect(watch.history.length).toBeGreaterThan(4); // it saw the rollout's slice changes
  expect(watch.min).toBeGreaterThanOrEqual(1);
  expect(sent).toBeGreaterThan(0);

  const after = await settled("indexes settled after the rollout");
  const kept = blockFacts(after);
  for (const fact of blockFacts(before)) expect(kept.has(fact)).toBe(true);
  expect(kept.size).toBeGreaterThan(blockFacts(before).size); // plus what the rollout-time traffic stored
  expect(kept.size).toBe(await cachedTotal()); // and nothing else
}, 120_000);

test("5. both replicas deleted at once: the new ones bootstrap empty and say so", async () => {
  const old = cluster.readyEpps();
  cluster.holdNewEpps(true);
  await Promise.all(old.map((p) => cluster.sim.deletePod(p, { wait: false })));
  const pods = await cluster.coldStart(2);
  for (const p of pods) {
    expect(old).not.toContain(p);
    expect(await recoveryState(cluster.ip(p))).toBe("empty_bootstrap");
    expect(logOf(p).some((m) => m.includes("EMPTY KV index"))).toBe(true);
    expect(await dumpEvents(cluster.ip(p))).toEqual([]);
  }
  expectNothingForbidden();
}, 90_000);
