// The exact handoff with every part its own process: two `bun run mock-worker` (two DP ranks each, replay
// on) take requests without pause while `bun run epp` B recovers from `bun run epp` A; once the traffic
// stops, both indexes equal the workers' true caches (GET /admin/cache), block for block.
import { afterAll, expect, test } from "bun:test";
import { killAll, spawnBun, waitFor, LOOPBACK } from "@kv-epp/testkit";
import { describeDiff, diffIndexViews, fetchIndexView, fetchWorkerTruth, type TruthWorker } from "./kv-truth.ts";
import { BLOCK, writeStaticConfig } from "./helpers.ts";

const ROOT = `${import.meta.dir}/../../..`;
const WORKERS = [
  { id: "w0", ip: `${LOOPBACK}.4.111` },
  { id: "w1", ip: `${LOOPBACK}.4.112` },
];
const [A, B] = [`${LOOPBACK}.4.120`, `${LOOPBACK}.4.121`];
// Not 5557: on this shared machine a stray process bound to *:5557 blocks every per-IP bind of it.
const KV_PORT = 15557;
const REPLAY_PORT = 15657;

afterAll(() => killAll());

type Row = { worker_id: string; dp_rank: number; cursor: string | null; complete: boolean; handoff: string | null };
const rows = async (ip: string) => (await (await fetch(`http://${ip}:9093/workers`)).json()) as Row[];

test("processes: B recovers from A under continuous traffic, and both equal the workers' caches exactly", async () => {
  for (const w of WORKERS)
    spawnBun(
      ["run", "mock-worker", "--listen", w.ip, "--port", "8000", "--kv-events", `tcp://${w.ip}:${KV_PORT}`, "--replay", `tcp://${w.ip}:${REPLAY_PORT}`,
        "--dp-size", "2", "--block-size", String(BLOCK), "--capacity-blocks", "48", "--speed", "0", "--model", "test-model"],
      { MOCK_WORKER_LOG_LEVEL: "warn" },
      { name: w.id, cwd: ROOT },
    );
  const listed = WORKERS.map((w) => ({ id: w.id, address: `${w.ip}:8000`, kvEvents: `tcp://${w.ip}:${KV_PORT}`, replay: `tcp://${w.ip}:${REPLAY_PORT}`, dpSize: 2 }));
  const truth: TruthWorker[] = WORKERS.map((w) => ({ id: w.id, url: `http://${w.ip}:8000` }));
  for (const t of truth) await waitFor(() => fetch(`${t.url}/health`).then((r) => r.ok, () => false), { message: `${t.id} up`, timeoutMs: 20_000 });
  const epp = (ip: string, peers: string[]) =>
    spawnBun(["run", "epp", "--config", writeStaticConfig(listed, peers), "--listen", ip, "--scrape-interval-ms", "0"], {}, { name: `epp-${ip}`, cwd: ROOT });
  const a = epp(A, []);
  await a.waitForLog(/"msg":"(recovered|ready with an EMPTY KV index)"/, { timeoutMs: 30_000 });

  // Traffic: 4 loops over random ranks and prompts with shared prefixes, until stopped.
  let running = true;
  let sent = 0;
  let seed = 7;
  const rnd = () => (seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31;
  // A quarter of the requests repeat a recent one exactly: a prompt of whole blocks sent again caches a
  // second copy of its last block (vLLM does not deduplicate), so copy counts are in play.
  const recent: { w: (typeof WORKERS)[number]; rank: number; prompt: number[] }[] = [];
  const loop = async () => {
    while (running) {
      let r = recent.length > 0 && rnd() < 0.25 ? recent[Math.floor(rnd() * recent.length)] : undefined;
      if (!r) {
        r = {
          w: WORKERS[Math.floor(rnd() * 2)]!,
          rank: Math.floor(rnd() * 2),
          prompt: [
            ...Array.from({ length: BLOCK * 2 }, (_, i) => (Math.floor(rnd() * 6) * 1000 + i) % 50000),
            ...Array.from({ length: BLOCK * (1 + Math.floor(rnd() * 3)) }, () => Math.floor(rnd() * 50000)),
          ],
        };
        recent.push(r);
        if (recent.length > 8) recent.shift();
      }
      const res = await fetch(`http://${r.w.ip}:8000/v1/completions`, {
        method: "POST",
        headers: { "content-type": "application/json", "x-data-parallel-rank": String(r.rank) },
        body: JSON.stringify({ prompt: r.prompt, max_tokens: 1 }),
      });
      await res.arrayBuffer();
      sent++;
    }
  };
  const loops = Array.from({ length: 4 }, loop);
  await waitFor(() => sent > 200, { message: "traffic under way", timeoutMs: 20_000 });

  const b = epp(B, [`http://${A}:9093`]);
  await b.waitForLog(/"msg":"recovered"/, { timeoutMs: 30_000 });
  const atRecovery = sent;
  await waitFor(() => sent > atRecovery + 300, { message: "traffic after B's recovery", timeoutMs: 30_000 });
  running = false;
  await Promise.all(loops);

  // Both replicas have applied the last batch of every rank: then they must equal the caches exactly.
  for (const ip of [A, B])
    await waitFor(async () => {
      const { nextSeq } = await fetchWorkerTruth(truth);
      return (await rows(ip)).every((r) => r.cursor !== null && BigInt(r.cursor) === nextSeq.get(`${r.worker_id}/${r.dp_rank}`)! - 1n);
    }, { message: `${ip} caught up`, timeoutMs: 20_000 });
  const { view } = await fetchWorkerTruth(truth);
  for (const ip of [A, B]) {
    const d = diffIndexViews(view, await fetchIndexView(`http://${ip}:9093`));
    expect(d.equal, `${ip}: ${describeDiff(d)}`).toBe(true);
    expect(d.blocks).toBeGreaterThan(100);
    expect(d.copies).toBeGreaterThan(d.blocks); // some blocks held twice, and both sides agree on each count
    expect((await rows(ip)).every((r) => r.complete)).toBe(true);
  }
  const recovery = (await (await fetch(`http://${B}:9093/recovery`)).json()) as { outcome: { kind: string; peer: string }; handoff: Record<string, number> };
  expect(recovery.outcome).toMatchObject({ kind: "recovered", peer: `http://${A}:9093` });
  expect(recovery.handoff.exact! + recovery.handoff.replayed!).toBe(4);
  expect(recovery.handoff.dropped! + recovery.handoff.unknown!).toBe(0);
}, 120_000);
