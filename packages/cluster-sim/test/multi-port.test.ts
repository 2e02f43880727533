// deploy/base in the cluster simulation with an InferencePool of two target ports: every mock worker
// pod serves each DP rank on its own port (vLLM's external DP load balancing), and both EPP replicas
// treat each port as an endpoint of its own, indexed and loaded as its own rank. Real processes, the
// gateway over ext_proc TLS.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { waitFor } from "@kv-epp/testkit";
import { eppWorkers, Gateway, intentLeases, loggedAttachments, logRecords, SimulatedCluster, tearDown, workerCachedBlocks } from "../src/index.ts";

const MODEL = "Qwen/Qwen3-0.6B";
let cluster: SimulatedCluster;
let gateway: Gateway;

beforeAll(async () => {
  cluster = await SimulatedCluster.start({ targetPorts: 2, firstHost: 140 });
  gateway = new Gateway();
}, 30_000);
afterAll(() => tearDown(cluster, gateway), 30_000);

const logOf = (pod: string) => logRecords(cluster.sim.process(pod).lines);

/**
 * Until every ready replica indexes, per worker pod, exactly the blocks its ranks cache (each port's
 * API server answers /admin/cache for both ranks); the failure names what each side held last.
 */
async function indexesExact(what: string): Promise<void> {
  for (const epp of cluster.readyEpps())
    for (const w of cluster.readyWorkers()) {
      let last = "";
      await waitFor(
        async () => {
          const ranks = (await eppWorkers(cluster.ip(epp))).filter((r) => r.worker_id === w);
          const cached = await workerCachedBlocks(`${cluster.ip(w)}:8001`);
          last = `ranks ${JSON.stringify(ranks.map((r) => [r.dp_rank, r.connected, r.blocks]))}, cached ${cached}`;
          const indexed = ranks.reduce((n, r) => n + r.blocks, 0);
          return indexed > 0 && indexed === cached;
        },
        { timeoutMs: 20_000, message: `${epp} indexes ${w}'s ranks exactly ${what}` },
      ).catch((e) => {
        throw new Error(`${(e as Error).message}; last seen: ${last}`);
      });
    }
}

const prompt = (n: number) => `Conversation ${n}. ${"A long shared system prompt about ports and ranks. ".repeat(20)}Question ${n}?`;

test("each worker pod's two target ports are two endpoints, each a rank of its own with its own KV port, on every replica", async () => {
  await cluster.coldStart(2);
  const workers = await cluster.waitReadyWorkers(2);
  const expected = workers.flatMap((w) => [0, 1].map((r) => `${w}/${r}@${cluster.ip(w)}:${8000 + r}`)).sort();
  for (const epp of cluster.readyEpps()) {
    await waitFor(
      async () => {
        const rows = await eppWorkers(cluster.ip(epp));
        return rows.every((w) => w.connected) && rows.map((w) => `${w.worker_id}/${w.dp_rank}@${w.address}`).sort().join() === expected.join();
      },
      { timeoutMs: 20_000, message: `${epp} lists every rank at its own port, connected` },
    );
  }
}, 90_000);

test("traffic reaches both ports of the pods; a repeated prompt goes back to the port whose rank cached it", async () => {
  const epps = cluster.readyAddresses("dynamo-epp");
  const ports = new Set<string>();
  for (let n = 0; n < 12; n++) {
    const r = await gateway.completion(epps[n % epps.length]!, { model: MODEL, prompt: prompt(n), max_tokens: 2 });
    expect(r.status).toBe(200);
    ports.add(r.endpoint.slice(r.endpoint.lastIndexOf(":") + 1));
  }
  expect([...ports].sort()).toEqual(["8000", "8001"]);

  const first = await gateway.completion(epps[0]!, { model: MODEL, prompt: prompt(100), max_tokens: 2 });
  // The other replica learns the blocks from that rank's KV events (its own port + rank).
  await waitFor(
    async () => (await eppWorkers(cluster.ip(cluster.readyEpps()[1]!))).some((w) => `${w.address}` === first.endpoint && w.blocks > 0),
    { timeoutMs: 10_000, message: "the second replica indexed the rank behind the first pick" },
  );
  const again = await gateway.completion(epps[1 % epps.length]!, { model: MODEL, prompt: prompt(100), max_tokens: 2 });
  expect(again.endpoint).toBe(first.endpoint);
  expect(again.cachedTokens).toBeGreaterThan(0);
  // Every replica indexes, per pod, exactly what its ranks cache. The workers' intents (one Lease per
  // rank) may still be arriving, one rank at a time, on a busy machine: that must not close a rank.
  await indexesExact("after the traffic");
}, 90_000);

test("a rank's intent that goes away leaves that rank's listener and blocks in place on every replica (pod discovery still lists it)", async () => {
  const epps = cluster.readyEpps();
  const leases = () => intentLeases(cluster.api, cluster.namespace);
  await waitFor(() => leases().length === 4, { timeoutMs: 30_000, message: "both workers registered an intent per rank" });
  for (const e of epps) await waitFor(() => loggedAttachments(cluster.sim.process(e).lines)?.length === 4, { timeoutMs: 30_000, message: `${e} attaches every rank's intent` });
  await indexesExact("with every intent attached");
  // A rank 1 holding blocks, so that closing its listener would show.
  const held = (await eppWorkers(cluster.ip(epps[0]!))).find((r) => r.dp_rank === 1 && r.blocks > 0)!;
  const rankOn = async (e: string) => (await eppWorkers(cluster.ip(e))).find((r) => r.worker_id === held.worker_id && r.dp_rank === held.dp_rank);
  const before = new Map(await Promise.all(epps.map(async (e) => [e, (await rankOn(e))?.blocks] as const)));
  const lease = leases().find((l) => l.intent.workerId === held.worker_id && l.intent.dpRank === held.dp_rank)!;
  // What a withdrawn or expired intent looks like to the EPP; the other rank's intent stays.
  cluster.api.remove("Lease", cluster.namespace, lease.name);
  const rank = `${held.worker_id}/${held.dp_rank}`;
  for (const e of epps) await waitFor(() => !loggedAttachments(cluster.sim.process(e).lines)?.includes(rank), { message: `${e} saw ${rank}'s intent go` });
  for (const e of epps) {
    const now = await rankOn(e);
    expect([now?.connected, now?.blocks]).toEqual([true, before.get(e)]);
    expect(logOf(e).some((r) => r.msg === "worker ranks changed" && (r.closed as number[]).length > 0)).toBe(false);
  }
  await indexesExact("after the intent went");
}, 90_000);
