// The validation scenario (the same five steps deploy/kind/e2e-validate.ts runs on kind),
// against deploy/base in the cluster simulation: two EPP replicas and two mock workers as real
// processes, each pod on its own 127.0.5.x with the standard ports, a fake API server holding the EPP
// to its Role, a simulated kubelet (grpc readiness probe, preStop, SIGTERM) and EndpointSlice
// controller. The steps share one cluster, in order; each is its own test. Step 6 checks what the
// manifests add on top: attachment intents, registered by the workers as Leases their pods own.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { waitFor } from "@kv-epp/testkit";
import {
  blockFacts,
  dumpEvents,
  eppLoad,
  eppWorkers,
  Gateway,
  hostLease,
  intentLeases,
  loggedAttachments,
  logMessages,
  logRecords,
  ReadyEndpointsWatch,
  recoveryState,
  SimulatedCluster,
  tearDown,
  workerCachedBlocks,
  type IntentLease,
  type Routed,
} from "../src/index.ts";

const MODEL = "Qwen/Qwen3-0.6B"; // deploy/base's DYN_EPP_MODEL and the mock workers' --model
const REQUEST_SERVICE = "dynamo-epp"; // what the gateway calls
const PEER_SERVICE = "dynamo-epp-peer";
const FAMILIES = 6; // prompts sharing a long prefix
const KV_HOST = "dynamo-epp"; // deploy/base's DYN_EPP_KV_HOST and MOCK_WORKER_KV_HOST

let cluster: SimulatedCluster;
let gateway: Gateway;

beforeAll(async () => {
  cluster = await SimulatedCluster.start();
  gateway = new Gateway();
}, 30_000);

afterAll(() => tearDown(cluster, gateway), 30_000);

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

/** Until no ready EPP counts a request in flight, its own or a peer's (replica-agg). */
async function idle(): Promise<void> {
  await waitFor(async () => (await Promise.all(cluster.readyEpps().map((e) => eppLoad(cluster.ip(e))))).every((l) => l.inflight === 0 && l.peerRequests === 0), {
    timeoutMs: 10_000,
    message: "no request in flight in any EPP's view",
  });
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
 * Subscribe first (docs/CONTRACTS.md §8 rule 1), checked in a recovering replica's log: "subscribed" comes before
 * "recovered ... from peer", and the subscription is real by then: for every worker, the listener in
 * place when the dump is fetched (the last one added: pod discovery and the intents may each have
 * produced one) has connected before the fetch (a listener still connecting misses what is published
 * between the peer's snapshot and its connection).
 */
function expectSubscribedBeforeRecovery(pod: string): void {
  const recs = logRecords(cluster.sim.process(pod).lines);
  const subscribed = recs.findIndex((r) => /subscribed/.test(r.msg));
  const fetching = recs.findIndex((r) => /fetching dump/.test(r.msg));
  const recovered = recs.findIndex((r) => /recovered\b.*\bfrom peer/.test(r.msg));
  expect(subscribed).toBeGreaterThanOrEqual(0);
  expect(fetching).toBeGreaterThan(subscribed);
  expect(recovered).toBeGreaterThan(fetching);
  const beforeDump = recs.slice(0, fetching);
  const connectedBeforeDump = cluster.readyWorkers().filter((w) => {
    const added = beforeDump.findLastIndex((r) => r.msg === "worker added" && r.worker === w);
    return added >= 0 && beforeDump.slice(added).some((r) => r.msg === "publisher connected" && r.worker === w);
  });
  expect({ pod, connectedBeforeDump }).toEqual({ pod, connectedBeforeDump: cluster.readyWorkers() });
}

const podUid = (pod: string) => cluster.api.get("Pod", cluster.namespace, pod)?.metadata?.uid;

/**
 * Waits until the attachment intents are live: each ready worker has its intent Lease (rank 0: the
 * manifests run one DP rank), owned by its pod, stating its pod IP; and every ready EPP attaches
 * exactly the intents that exist. Returns the intents of the ready workers.
 */
async function intentsLive(what: string): Promise<IntentLease[]> {
  let last = "";
  try {
    return await waitFor(
      () => {
        const workers = cluster.readyWorkers();
        const leases = intentLeases(cluster.api, cluster.namespace);
        last = `intents ${JSON.stringify(leases.map((l) => [l.name, l.owners.map((o) => o.name)]))}`;
        const mine = workers.map((w) => leases.filter((l) => l.intent.workerId === w && l.owners.some((o) => o.uid === podUid(w))));
        if (mine.some((m) => m.length !== 1)) return undefined;
        const attachments = leases.map((l) => `${l.intent.workerId}/${l.intent.dpRank}`).sort();
        for (const e of cluster.readyEpps()) {
          const attached = loggedAttachments(cluster.sim.process(e).lines);
          last += `; ${e} attaches ${JSON.stringify(attached)}`;
          if (JSON.stringify(attached) !== JSON.stringify(attachments)) return undefined;
        }
        return mine.flat();
      },
      { timeoutMs: 30_000, intervalMs: 100, message: what },
    );
  } catch (e) {
    throw new Error(`${(e as Error).message}; last seen: ${last}`);
  }
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
  await cluster.waitReadyWorkers(2);
  // The workers register once the EPPs advertise the KV host (they retry until then). Traffic waits
  // for it: an intent that arrives later changes the worker's spec in the EPP (see step 6).
  await intentsLive("the workers' attachment intents registered and attached by both EPPs");
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
  // Load weighs in the pick too, and the previous request's end reaches the peer over replica-agg a
  // moment later: each request waits until no EPP counts one in flight.
  for (let f = 0; f < FAMILIES; f++) {
    await idle();
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

test("6. attachment intents: Leases owned by the worker pods, attached by every EPP; a dead worker's pod deletion collects them and the EPPs drop it", async () => {
  const epps = cluster.readyEpps();
  const workers = cluster.readyWorkers();
  expect(workers.length).toBe(2);
  const intents = await intentsLive("intents attached by the replicas of step 5");
  for (const w of workers) {
    const { intent, owners, holder } = intents.find((l) => l.intent.workerId === w)!;
    // Owned by the pod without blockOwnerDeletion (which would need update on pods/finalizers).
    expect(owners).toEqual([{ apiVersion: "v1", kind: "Pod", name: w, uid: podUid(w)! }]);
    expect(holder).toBe(w);
    expect(intent).toMatchObject({ host: KV_HOST, dpRank: 0, endpoint: `tcp://${cluster.ip(w)}:${cluster.kvEventsPort}`, address: workerAddress(w), blockSize: 16, model: MODEL });
  }
  // Pod discovery and the intents name each worker the same (pod name): one worker, one listener per rank.
  for (const e of epps) {
    const listed = await eppWorkers(cluster.ip(e));
    expect(listed.map((w) => [w.worker_id, w.dp_rank, w.address])).toEqual(workers.map((w) => [w, 0, workerAddress(w)]));
  }

  // The victim holds blocks in both indexes: the worker the first request of a new family lands on.
  const victimAddress = (await request(1000, "d", 0)).endpoint;
  const victim = workers.find((w) => workerAddress(w) === victimAddress)!;
  await waitFor(async () => (await Promise.all(epps.map(async (e) => (await eppWorkers(cluster.ip(e))).find((w) => w.worker_id === victim)?.blocks ?? 0))).every((n) => n > 0), {
    timeoutMs: 30_000,
    message: `${victim}'s blocks in both indexes`,
  });
  const victimLease = intents.find((l) => l.intent.workerId === victim)!.name;

  // Its process dies (no withdrawal), then its pod is deleted: the garbage collector takes its Lease.
  await cluster.sim.process(victim).kill("SIGKILL", 0);
  await waitFor(() => !cluster.sim.isReady(victim), { timeoutMs: 10_000, message: `${victim} not ready` });
  expect(intentLeases(cluster.api, cluster.namespace).map((l) => l.name)).toContain(victimLease);
  await cluster.sim.deletePod(victim);
  expect(intentLeases(cluster.api, cluster.namespace).map((l) => l.name)).not.toContain(victimLease);

  // Both EPPs drop it: no listener, no attachment, none of its blocks in the index.
  for (const e of epps) {
    await waitFor(async () => !(await eppWorkers(cluster.ip(e))).some((w) => w.worker_id === victim), { timeoutMs: 15_000, message: `${e} dropped ${victim}` });
    // Its log line may trail the HTTP answer (a pipe): waited for too.
    await waitFor(() => !loggedAttachments(cluster.sim.process(e).lines)?.includes(`${victim}/0`), { timeoutMs: 15_000, message: `${e} logged the attachment gone` });
    expect((await dumpEvents(cluster.ip(e))).filter((line) => JSON.parse(line)[2] === victim)).toEqual([]);
  }

  // The Deployment's replacement registers its own intent, and both EPPs attach it.
  const replacement = await waitFor(() => cluster.readyWorkers().find((w) => !workers.includes(w)), { timeoutMs: 30_000, message: "a replacement worker" });
  const after = await intentsLive("the replacement's intent attached");
  expect(after.map((l) => l.intent.workerId).sort()).toEqual(cluster.readyWorkers());
  expect(after.find((l) => l.intent.workerId === replacement)!.owners.map((o) => o.uid)).toEqual([podUid(replacement)!]);
  for (const e of epps) {
    await waitFor(async () => (await eppWorkers(cluster.ip(e))).some((w) => w.worker_id === replacement && w.connected), { timeoutMs: 15_000, message: `${e} connected to ${replacement}` });
  }

  // One host record for all replicas (a worker must find exactly one host), owned by each live one:
  // the replicas step 5 replaced left it when they stopped.
  await waitFor(() => cluster.epps.pods().length === epps.length, { timeoutMs: 30_000, message: "the replaced EPP replicas gone" });
  const host = hostLease(cluster.api, cluster.namespace, KV_HOST)!;
  expect(host.name).toBe(`kvh-${KV_HOST}`);
  expect(host.host.hostInstance).toBe(KV_HOST);
  expect(host.owners.map((o) => [o.name, o.uid]).sort()).toEqual(epps.map((e) => [e, podUid(e)!]));
  expect(host.holders.length).toBe(epps.length);
  expectNothingForbidden();
}, 90_000);

// How the EPP merges pod discovery and intents (both steps failed before ff2ea7f / 8d5dd63).

test("7. an intent that goes away for a worker pod discovery still lists keeps that worker's listener and its blocks", async () => {
  const epps = cluster.readyEpps();
  const { worker } = await placedOnSomeWorker(2000);
  const blocks = async (e: string) => (await eppWorkers(cluster.ip(e))).find((w) => w.worker_id === worker)?.blocks;
  const before = new Map(await Promise.all(epps.map(async (e) => [e, await blocks(e)] as const)));
  const lease = intentLeases(cluster.api, cluster.namespace).find((l) => l.intent.workerId === worker)!;
  // What a withdrawn or expired intent looks like to the EPP; the pod is still Ready and listed.
  cluster.api.remove("Lease", cluster.namespace, lease.name);
  for (const e of epps) await waitFor(() => !loggedAttachments(cluster.sim.process(e).lines)?.includes(`${worker}/0`), { timeoutMs: 15_000, message: `${e} saw the intent go` });
  // The EPP logs the change, then reconciles its worker set in the same turn: read once, no waiting
  // (a wait would also pass on blocks dropped and restored).
  for (const e of epps) expect([e, await blocks(e)]).toEqual([e, before.get(e)]);
}, 60_000);

test("8. a worker whose pod is not Ready leaves the EPPs' worker set at once, as without intents, whatever its intent says", async () => {
  // Pod discovery drops a NotReady pod at once; its intent must not keep it (listener, index entries,
  // routable until 3 failed /metrics scrapes or until the Lease goes, as it did before 8d5dd63).
  const { worker } = await placedOnSomeWorker(3000, (w) => intentLeases(cluster.api, cluster.namespace).some((l) => l.intent.workerId === w));
  await cluster.sim.process(worker).kill("SIGKILL", 0); // crashed: the pod stays, NotReady, its intent Lease too
  await waitFor(() => (cluster.api.get("Pod", cluster.namespace, worker)?.status as { phase?: string }).phase === "Failed", { message: `${worker} Failed` });
  for (const e of cluster.readyEpps()) {
    // Without the fix it stayed as long as its Lease (for good: the pod stays Failed), so a generous cap loses nothing on a busy machine.
    await waitFor(async () => !(await eppWorkers(cluster.ip(e))).some((w) => w.worker_id === worker), { timeoutMs: 30_000, message: `${e} drops the NotReady ${worker}` });
  }
}, 60_000);

/** What an EPP would pick for a prompt now (a dry run: it records no load). */
async function selectOn(epp: string, family: number, question: string): Promise<{ endpoint?: string; overlap_blocks?: number; request_blocks?: number }> {
  const res = await fetch(`http://${cluster.ip(epp)}:9093/select`, { method: "POST", body: JSON.stringify({ model: MODEL, prompt: prompt(family, question) }) });
  return (await res.json()) as { endpoint?: string; overlap_blocks?: number; request_blocks?: number };
}

/**
 * A ready worker (among those `accept`s) whose blocks of a new family every EPP indexes (its /select
 * picks that worker with the whole prompt as overlap); sends requests until one lands on such a worker.
 */
async function placedOnSomeWorker(firstFamily: number, accept: (w: string) => boolean = () => true): Promise<{ worker: string; family: number }> {
  for (let f = firstFamily; f < firstFamily + 16; f++) {
    await idle();
    // Alternating EPPs: with replica-agg peers, a prompt nothing holds goes to the routing replica's
    // home share of the workers, so one EPP alone may never reach an accepted worker.
    const { endpoint } = await request(f, "e", f);
    const worker = cluster.readyWorkers().find((w) => workerAddress(w) === endpoint && accept(w));
    if (!worker) continue;
    for (const e of cluster.readyEpps()) {
      await waitFor(async () => {
        const pick = await selectOn(e, f, "e");
        return pick.endpoint === endpoint && pick.overlap_blocks === pick.request_blocks;
      }, { timeoutMs: 15_000, message: `${e} indexes family ${f} on ${worker}` });
    }
    return { worker, family: f };
  }
  throw new Error("no request landed on an accepted worker");
}
