// `bun run kv-sidecar` as a process: beside a mock worker whose two ranks publish on ephemeral ports, it
// reads the worker's GET /kv_event_sources and keeps one intent per rank in an HTTP-served discovery
// store, stating the ports the publishers really bound; SIGTERM withdraws them.
import { afterAll, expect, test } from "bun:test";
import { join } from "node:path";
import { startMockWorker } from "@kv-epp/mock-worker";
import { killAll, spawnBun, waitFor, LOOPBACK } from "@kv-epp/testkit";
import pino from "pino";
import { connectHttpDiscovery, serveDiscoveryStore, startIntentHost, type AttachmentIntent } from "../src/index.ts";
import { E2E_MODEL as MODEL } from "./fixtures.ts";

const ROOT = join(import.meta.dir, "../../..");
const IP = `${LOOPBACK}.7.31`;
const log = pino({ level: "silent" });
const cleanups: (() => unknown)[] = [];
afterAll(async () => {
  await killAll("SIGKILL", 1000);
  for (const c of cleanups.reverse()) await c();
});

test("the sidecar registers the ranks' reported (ephemeral) endpoints as intents, and withdraws them on SIGTERM", async () => {
  const store = serveDiscoveryStore({ hostname: IP });
  cleanups.push(() => store.close());
  const worker = await startMockWorker({ listen: IP, port: 0, kvEvents: `tcp://${IP}:0`, dpSize: 2, blockSize: 16, speed: 0, model: MODEL, logger: log });
  cleanups.push(() => worker.close());

  let desired: AttachmentIntent[] = [];
  const host = await startIntentHost({
    discovery: await connectHttpDiscovery({ url: store.url, producer: "host", log }), hostInstance: "dynamo-epp", onChange: (d) => (desired = [...d]),
  });
  cleanups.push(() => host.stop());

  const sidecar = spawnBun(
    [join(ROOT, "packages/intents/src/sidecar-main.ts"), "--from", worker.url, "--discovery", store.url, "--worker-id", "vllm-a", "--model", MODEL, "--block-size", "16", "--address", new URL(worker.url).host],
    {},
    { name: "kv-sidecar" },
  );
  await waitFor(() => desired.length === 2, { message: "two intents registered", timeoutMs: 30_000 });
  expect(desired.map((i) => [i.workerId, i.dpRank, i.endpoint, i.blockSize])).toEqual(worker.ranks.map((r) => ["vllm-a", r.rank, r.kvEvents, 16]));

  await sidecar.kill("SIGTERM", 10_000);
  await waitFor(() => desired.length === 0, { message: "intents withdrawn", timeoutMs: 10_000 });
}, 60_000);

test("a report it cannot use (SGLang's DP ranks over several nodes) is logged, and the sidecar stays up idle, not crash-looping", async () => {
  const store = serveDiscoveryStore({ hostname: IP });
  cleanups.push(() => store.close());
  // /server_info of an SGLang server with 4 DP ranks over 2 nodes: one host cannot place them.
  const sglang = Bun.serve({
    hostname: IP, port: 0,
    fetch: (req) => new URL(req.url).pathname === "/server_info"
      ? Response.json({ model_path: MODEL, nnodes: 2, dp_size: 4, kv_events: { publisher: "zmq", endpoint_host: "*", endpoint_port_base: 5557, topic: "", block_size: 16, dp_size: 4 } })
      : new Response(null, { status: 404 }),
  });
  cleanups.push(() => sglang.stop(true));

  const sidecar = spawnBun(
    [join(ROOT, "packages/intents/src/sidecar-main.ts"), "--from", `http://${IP}:${sglang.port}`, "--discovery", store.url, "--worker-id", "sglang-a", "--model", MODEL, "--block-size", "16"],
    {},
    { name: "kv-sidecar" },
  );
  const line = await sidecar.waitForLog(/intents not registered/i, { timeoutMs: 30_000 });
  expect(line).toMatch(/4 DP ranks over 2 nodes/);
  await Bun.sleep(500);
  expect(sidecar.running).toBe(true);

  await sidecar.kill("SIGTERM", 10_000);
  expect(await sidecar.exited).toBe(0);
}, 60_000);
