// Process level: two mock workers and one EPP (static mode), each "pod" on its own loopback address
// with the standard ports. The test plays the gateway: ask the EPP over ext_proc, call the endpoint.
import { afterAll, beforeAll, expect, test } from "bun:test";
import { killAll, spawnBun, waitFor, type ProcessHandle, LOOPBACK } from "@kv-epp/testkit";
import { body, checkHealth, extProcClient, headers, healthClient, postJson, setHeader, tokens, writeStaticConfig } from "./helpers.ts";

const EPP_IP = `${LOOPBACK}.4.40`;
const WORKERS = [
  { id: "worker-a", ip: `${LOOPBACK}.4.41` },
  { id: "worker-b", ip: `${LOOPBACK}.4.42` },
];
const addr = (ip: string) => `${ip}:8000`;
// Not 5557: on this shared machine a stray process bound to *:5557 blocks every per-IP bind of it.
const KV_PORT = 15557;
const procs = new Map<string, ProcessHandle>();
let client: ReturnType<typeof extProcClient>;

beforeAll(async () => {
  for (const w of WORKERS) {
    procs.set(
      w.id,
      spawnBun(
        ["run", "mock-worker", "--listen", w.ip, "--port", "8000", "--kv-events", `tcp://${w.ip}:${KV_PORT}`, "--block-size", "16", "--speed", "0", "--model", "test-model"],
        { MOCK_WORKER_LOG_LEVEL: "warn" },
        { name: w.id, cwd: `${import.meta.dir}/../../..` },
      ),
    );
  }
  const config = writeStaticConfig(WORKERS.map((w) => ({ id: w.id, address: addr(w.ip), kvEvents: `tcp://${w.ip}:${KV_PORT}` })));
  const epp = spawnBun(["run", "epp", "--config", config, "--listen", EPP_IP, "--scrape-interval-ms", "200"], {}, {
    name: "epp",
    cwd: `${import.meta.dir}/../../..`,
  });
  procs.set("epp", epp);
  await epp.waitForLog(/servers listening/, { timeoutMs: 20_000 });
  for (const w of WORKERS)
    await waitFor(() => fetch(`http://${addr(w.ip)}/health`).then((r) => r.ok, () => false), { message: `${w.id} /health`, timeoutMs: 15_000 });
  const h = healthClient(9003, EPP_IP);
  await waitFor(async () => (await checkHealth(h, "readiness")) === "SERVING", { message: "EPP ready", timeoutMs: 15_000 });
  h.close();
  await waitFor(
    async () => {
      const list = (await (await fetch(`http://${EPP_IP}:9093/workers`)).json()) as { connected: boolean }[];
      return list.length === 2 && list.every((w) => w.connected);
    },
    { message: "EPP subscribed to both workers", timeoutMs: 15_000 },
  );
  client = extProcClient(9002, EPP_IP);
}, 60_000);

afterAll(async () => {
  client?.close();
  await killAll();
});

/** One request through ext_proc: the endpoint the EPP picked, and the stream (kept open = load held). */
async function route(prompt: number[]) {
  const s = client.open();
  s.send(headers());
  s.send(body({ model: "test-model", prompt, max_tokens: 2 }));
  const endpoint = setHeader((await s.next()).request_headers?.response, "x-gateway-destination-endpoint")!;
  await s.next(); // the body handed back
  return { endpoint, s };
}

test("after a prompt is served by a worker, the same prompt with a new suffix routes to that worker", async () => {
  const prompt = tokens(256, 11);
  const first = await route(prompt);
  const res = await postJson(`http://${first.endpoint}/v1/completions`, { model: "test-model", prompt, max_tokens: 2 });
  expect(res.status).toBe(200);
  first.s.end();
  const served = WORKERS.find((w) => addr(w.ip) === first.endpoint)!;
  // The worker's BlockStored events reach the EPP's index.
  await waitFor(async () => (await postJson(`http://${EPP_IP}:9093/score`, { token_ids: prompt })).body.scores[served.id]?.["0"] === 16, {
    message: "blocks indexed",
  });
  for (let i = 0; i < 3; i++) {
    const next = await route([...prompt, ...tokens(40, 100 + i)]);
    expect(next.endpoint).toBe(first.endpoint);
    next.s.end();
  }
});

test("under load, picks for unrelated prompts spread over both workers", async () => {
  const held = [];
  for (let i = 0; i < 8; i++) held.push(await route(tokens(128, 1000 + i)));
  const counts = new Map<string, number>();
  for (const r of held) counts.set(r.endpoint, (counts.get(r.endpoint) ?? 0) + 1);
  expect([...counts.keys()].sort()).toEqual(WORKERS.map((w) => addr(w.ip)).sort());
  for (const n of counts.values()) expect(n).toBeGreaterThanOrEqual(2);
  for (const r of held) r.s.end();
});

test("a killed worker is removed: no longer picked, its blocks dropped", async () => {
  const prompt = tokens(128, 77);
  const first = await route(prompt);
  await postJson(`http://${first.endpoint}/v1/completions`, { model: "test-model", prompt, max_tokens: 2 });
  first.s.end();
  const victim = WORKERS.find((w) => addr(w.ip) === first.endpoint)!;
  const survivor = WORKERS.find((w) => w !== victim)!;
  await waitFor(async () => (await postJson(`http://${EPP_IP}:9093/score`, { token_ids: prompt })).body.scores[victim.id]?.["0"] === 8);

  await procs.get(victim.id)!.kill("SIGKILL");
  await waitFor(
    async () => {
      const list = (await (await fetch(`http://${EPP_IP}:9093/workers`)).json()) as { worker_id: string; blocks: number; connected: boolean }[];
      const v = list.find((w) => w.worker_id === victim.id);
      return v !== undefined && v.blocks === 0 && !v.connected;
    },
    { message: "victim's blocks dropped", timeoutMs: 10_000 },
  );
  for (let i = 0; i < 4; i++) {
    const r = await route([...prompt, ...tokens(16, 500 + i)]);
    expect(r.endpoint).toBe(addr(survivor.ip));
    r.s.end();
  }
});

test("SIGTERM: readiness goes NOT_SERVING first, an in-flight stream finishes, then the process exits 0", async () => {
  const inflight = await route(tokens(64, 9000));
  const epp = procs.get("epp")!;
  const h = healthClient(9003, EPP_IP);
  process.kill(epp.pid, "SIGTERM");
  await waitFor(async () => (await checkHealth(h, "readiness").catch(() => "gone")) === "NOT_SERVING", { message: "NOT_SERVING" });
  h.close();
  // The in-flight request still gets its response phase answered.
  inflight.s.send({ response_headers: { headers: { headers: [] }, end_of_stream: false } });
  expect((await inflight.s.next()).response).toBe("response_headers");
  expect(epp.running).toBe(true);
  inflight.s.send({ response_body: { body: new Uint8Array(0), end_of_stream: true } });
  await inflight.s.next();
  inflight.s.end();
  expect(await epp.exited).toBe(0);
});
