import { afterAll, expect, test } from "bun:test";
import { join } from "node:path";
import { killAll, type ProcessHandle, spawnBun, LOOPBACK } from "@kv-epp/testkit";

// Replicas as real processes on distinct loopback IPs, each on the standard selection-http port.
const replica = join(import.meta.dir, "fixtures", "replica.ts");
afterAll(() => killAll());

function start(ip: string, peers: string[], seed = 0): ProcessHandle {
  return spawnBun([replica], { REPLICA_LISTEN: `${ip}:9093`, REPLICA_PEERS: peers.join(","), REPLICA_SEED: String(seed) }, { name: ip });
}
async function outcomeOf(p: ProcessHandle): Promise<{ kind: string; peer?: string; events?: number }> {
  return JSON.parse(await p.waitForLog(/"recovery ended"/)).outcome;
}
const url = (ip: string) => `http://${ip}:9093`;

test("two cold replicas listing each other both start at once with empty_bootstrap", async () => {
  const [a, b] = [`${LOOPBACK}.3.70`, `${LOOPBACK}.3.71`];
  const pa = start(a, [url(b)]);
  const pb = start(b, [url(a)]);
  const [oa, ob] = await Promise.all([outcomeOf(pa), outcomeOf(pb)]);
  // Whichever probed second may already see the other serving an empty index: recovered with 0 events is
  // the same empty start. Neither waited on the other.
  for (const o of [oa, ob]) expect(o.kind === "empty_bootstrap" || (o.kind === "recovered" && o.events === 0)).toBe(true);
  expect([oa.kind, ob.kind]).toContain("empty_bootstrap");
  await Promise.all([pa.kill(), pb.kill()]);
});

test("a replica recovers from a serving peer process and then serves the same /dump", async () => {
  const [a, b] = [`${LOOPBACK}.3.72`, `${LOOPBACK}.3.73`];
  const pa = start(a, [url(b)], 3); // B is not up yet: A starts alone with its (seeded) index
  expect((await outcomeOf(pa)).kind).toBe("empty_bootstrap");
  const pb = start(b, [url(a)]);
  expect(await outcomeOf(pb)).toMatchObject({ kind: "recovered", peer: url(a), events: 6 });
  expect(pb.output()).toMatch(/"dump fetched from peer"/);
  const [da, db] = await Promise.all([a, b].map(async (ip) => (await fetch(`${url(ip)}/dump`)).text())) as [string, string];
  expect(db).toBe(da);
  expect(JSON.parse(da)["Qwen/Qwen3-0.6B:default"].events.length).toBe(6);
  await Promise.all([pa.kill(), pb.kill()]);
});
